"""Checkpoints written from a structure's template read back as TFF's own do."""

import asyncio
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from workflow.training import checkpoint_files


def _state(scale, note):
  return {'state': [np.full((3, 4), scale, np.float32), (np.arange(2, dtype=np.int64) * scale,)],
          'totals': note, 'schedules': ''}


def _files(directory):
  return sorted(os.path.relpath(os.path.join(d, f), directory)
                for d, _, files in os.walk(directory) for f in files)


def test_later_saves_read_back_as_tff_reads_its_own(tmp_path):
  ours = checkpoint_files.ProgramStateManager(str(tmp_path / 'ours'), keep_total=2,
                                              keep_first=False)
  theirs = tff.program.FileProgramStateManager(str(tmp_path / 'tff'))
  for version in (1, 2, 3):  # the first save makes the template, the later ones reuse it
    state = _state(version, f'{{"round": {version}, "pad": "{"x" * version}"}}')
    asyncio.run(ours.save(state, version))
    asyncio.run(theirs.save(state, version))
    loaded = asyncio.run(ours.load(version, _state(0, '')))
    tf.nest.map_structure(np.testing.assert_array_equal, loaded,
                          asyncio.run(theirs.load(version, _state(0, ''))))
  assert checkpoint_files._TEMPLATES[checkpoint_files._signature(state)] is not None
  assert asyncio.run(ours.get_versions()) == [2, 3]  # TFF's keep_total still applies
  assert _files(tmp_path / 'ours' / 'program_state_3') == _files(
      tmp_path / 'tff' / 'program_state_3')
  with pytest.raises(tff.program.ProgramStateExistsError):
    asyncio.run(ours.save(_state(9, ''), 3))


def test_a_structure_with_a_leaf_that_is_no_variable_is_written_by_tff(tmp_path):
  manager = checkpoint_files.ProgramStateManager(str(tmp_path))
  state = {'state': [np.ones(2, np.float32)], 'empty': []}
  asyncio.run(manager.save(dict(state, note=None), 1))  # None cannot be a variable
  asyncio.run(manager.save(dict(state, note=None), 2))
  loaded = asyncio.run(manager.load(2, dict(state, note=None)))
  np.testing.assert_array_equal(loaded['state'][0], [1, 1])
