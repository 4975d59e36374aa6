"""Checkpoints load across container changes; foreign ones fail in one line."""

import asyncio
import collections

import numpy as np
import pytest
import tensorflow_federated as tff

from workflow.training import run_files


def _save(tmp_path, value):
  manager = tff.program.FileProgramStateManager(str(tmp_path / 'checkpoints'))
  asyncio.run(manager.save(value, 1))
  return manager


def test_list_saved_tuple_expected_loads_by_leaves(tmp_path):
  saved = collections.OrderedDict(m=[np.ones(3, np.float32), np.zeros(2, np.float32)], step=1.0)
  manager = _save(tmp_path, saved)
  wanted = collections.OrderedDict(m=(np.zeros(3, np.float32), np.zeros(2, np.float32)), step=0.0)
  loaded = asyncio.run(run_files._load_checkpoint(manager, str(tmp_path), 1, wanted))  # pylint: disable=protected-access
  assert isinstance(loaded['m'], tuple)
  np.testing.assert_array_equal(loaded['m'][0], np.ones(3))
  assert float(loaded['step']) == 1.0


def test_foreign_checkpoint_is_one_clear_error(tmp_path):
  manager = _save(tmp_path, collections.OrderedDict(w=np.ones(4, np.float32)))
  wanted = collections.OrderedDict(w=np.zeros(4, np.float32), v=np.zeros(4, np.float32))
  with pytest.raises(run_files.IncompatibleCheckpoint, match='another version of tff_adaptive'):
    asyncio.run(run_files._load_checkpoint(manager, str(tmp_path), 1, wanted))  # pylint: disable=protected-access


@pytest.mark.usefixtures('local_cpp_context')
@pytest.mark.parametrize('name', ['mimelite', 'fedprox'])
def test_checkpoint_of_tffs_mimelite_or_fedprox_layout_is_refused(tmp_path, name):
  """Runs made when these two wrapped TFF's builders saved TFF's state layout."""
  import algorithm_testing as at  # pylint: disable=g-import-not-at-top
  from tff_adaptive.algorithms import fedprox, mimelite  # pylint: disable=g-import-not-at-top
  sgdm = tff.learning.optimizers.build_sgdm
  if name == 'mimelite':
    old = tff.learning.algorithms.build_weighted_mime_lite(at.model_fn, sgdm(0.1, momentum=0.9),
                                                           sgdm(1.0))
    new = mimelite.build_mimelite(at.model_fn, sgdm(0.1, momentum=0.9), fb_flops_per_example=1.0)
  else:
    old = tff.learning.algorithms.build_weighted_fed_prox(at.model_fn, 0.01, sgdm(0.1), sgdm(1.0))
    new = fedprox.build_fedprox(at.model_fn, sgdm(0.1), proximal_strength=0.01,
                                fb_flops_per_example=1.0)
  manager = _save(tmp_path, old.initialize())
  with pytest.raises(run_files.IncompatibleCheckpoint, match='another version of tff_adaptive'):
    asyncio.run(run_files._load_checkpoint(manager, str(tmp_path), 1, new.initialize()))  # pylint: disable=protected-access
