"""Checkpoints in TFF's format, with each structure's SavedModel graph built once.

A run's checkpoints are `tff.program.FileProgramStateManager`'s: one SavedModel
per checkpoint round whose only function returns the program state, every leaf
a variable. TFF builds and traces that SavedModel's graph at every save (~60–90 ms
for a small model), the same graph each time since the structure of a run's state
does not change; a population of P members pays it P times per checkpoint round,
which was a quarter of a 25-member digits sweep's wall-clock.

`ProgramStateManager` writes the graph (saved_model.pb) once per structure, per
process, and for every later save of that structure assigns the values to the
template's variables and writes only the variables, then the fingerprint, into a
temporary directory renamed into place, as TFF does. What it writes is read by
TFF's own `load` (tf.saved_model.load) like any other checkpoint of the run
(tests/test_checkpoint_files.py). A structure with a leaf that cannot be a variable
(TFF then keeps it as a constant of the graph, so the graph depends on the value)
is written by TFF's own writer.
"""

import asyncio
import os
import random
import shutil
import threading
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
# TFF's helpers its own save uses, so the two paths cannot drift apart.
from tensorflow_federated.python.common_libs import serializable
from tensorflow_federated.python.program import file_utils
from tensorflow_federated.python.program import structure_utils
from tensorflow_federated.python.program import value_reference
# TF's fingerprint of a SavedModel directory and the saver of a module's variables:
# what tf.saved_model.save runs after building the graph.
from tensorflow.python.checkpoint import checkpoint as tf_checkpoint
from tensorflow.python.checkpoint import graph_view
from tensorflow.python.saved_model import fingerprinting_utils


class _ValueModule(tf.Module):
  """A module whose one function returns `value` (TFF's layout of a checkpoint)."""

  def __init__(self, value):
    super().__init__()
    self._value = value

  @tf.function(input_signature=())
  def __call__(self):
    return self._value


class _Template:
  """One structure's SavedModel graph and the variables its saves are written from."""

  def __init__(self, variables, directory: str):
    """`variables`: the first value's leaves as variables; its SavedModel (graph,
    variables and fingerprint) is written to `directory`."""
    self.variables = variables
    self.module = _ValueModule(variables)
    tf.saved_model.save(self.module, directory, signatures={})
    with open(os.path.join(directory, 'saved_model.pb'), 'rb') as f:
      self.graph = f.read()
    self.saver = tf_checkpoint.TrackableSaver(graph_view.ObjectGraphView(self.module))
    self.lock = threading.Lock()  # a population's members share it

  def write(self, value, directory: str) -> None:
    os.makedirs(os.path.join(directory, 'assets'))
    with open(os.path.join(directory, 'saved_model.pb'), 'wb') as f:
      f.write(self.graph)
    with self.lock:
      tf.nest.map_structure(lambda var, v: var.assign(v), self.variables, value)
      self.saver.save(os.path.join(directory, 'variables', 'variables'))
    fingerprinting_utils.write_fingerprint(directory)


# Per process: a structure's graph is the same in every run directory. None: a
# structure TFF's own writer writes.
_TEMPLATES: dict[str, Optional[_Template]] = {}
_TEMPLATES_LOCK = threading.Lock()


def _signature(value) -> str:
  """What the graph depends on: the structure and each leaf's dtype and shape."""
  def leaf(v):
    array = np.asarray(v)
    return (array.dtype.str, array.shape) if array.dtype.kind in 'biufc' else ('str', ())
  return repr(tf.nest.map_structure(leaf, value))


def _write(value, path: str) -> bool:
  """Writes `value` to `path` from its structure's template (made on first use);
  False, having written nothing, for a structure TFF's writer must write."""
  key = _signature(value)
  temp = f'{path}_temp{random.randint(1000, 9999)}'
  shutil.rmtree(temp, ignore_errors=True)
  with _TEMPLATES_LOCK:
    if key not in _TEMPLATES:
      try:
        variables = tf.nest.map_structure(tf.Variable, value)
      except (ValueError, TypeError):
        _TEMPLATES[key] = None
        return False
      _TEMPLATES[key] = _Template(variables, temp)
      os.replace(temp, path)
      return True
    template = _TEMPLATES[key]
  if template is None:
    return False
  template.write(value, temp)
  os.replace(temp, path)
  return True


class ProgramStateManager(tff.program.FileProgramStateManager):
  """TFF's file program state manager, writing each structure's graph once (module doc)."""

  async def save(self, program_state, version: int) -> None:
    path = self._get_path_for_version(version)
    if await file_utils.exists(path):
      raise tff.program.ProgramStateExistsError(version=version, path=self._root_dir)
    materialized = await value_reference.materialize_value(program_state)
    serialized = structure_utils.map_structure(
        lambda v: v.to_bytes() if isinstance(v, serializable.Serializable) else v, materialized)
    if not await asyncio.get_running_loop().run_in_executor(None, _write, serialized, path):
      await file_utils.write_saved_model(serialized, path)
    await self._remove_old_program_state()
