"""Fault injection: bad input, damaged files and mistakes never hang,
never print a traceback and lose nothing but the rounds since the last intact
checkpoint. docs/reliability.md lists these guarantees and names these tests.

Runs are small digits runs trained in-process through `cli.run_training`
(exit codes are those bin/train exits with: `errors.report` of the raised `errors.RunError`); only what needs a real process (a lock
held by another process) starts one, and it does not import TensorFlow.
"""

import asyncio
import csv
import errno
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.saved_model import fingerprinting_utils  # pylint: disable=g-direct-tensorflow-import

import train_config  # pylint: disable=g-bad-import-order

from workflow import errors
from workflow.flags import validation
from workflow.training import cli
from workflow.training import experiment
from workflow.training import run_files

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow

NAME = 'run'


def _settings(root, **overrides):
  """bin/train's settings for a 4-round digits run, checkpoint every round."""
  return train_config.small_run(root, NAME, **{'total_rounds': 4, 'rounds_per_eval': 2,
                                               'rounds_per_checkpoint': 1, **overrides})


_train = train_config.train_settings


def _run_dir(root):
  return os.path.join(str(root), NAME)


def _weights(run_dir, version=None):
  from tensorflow_federated.python.program import file_utils  # pylint: disable=g-import-not-at-top
  ckpt = os.path.join(run_dir, 'checkpoints')
  if version is None:
    version = max(int(n.rsplit('_', 1)[1]) for n in os.listdir(ckpt) if n.split('_')[-1].isdigit())
  state = asyncio.run(file_utils.read_saved_model(os.path.join(ckpt, f'program_state_{version}')))
  return [np.asarray(x) for x in tf.nest.flatten(state)]


def _assert_same_weights(run_a, run_b):
  for a, b in zip(_weights(run_a), _weights(run_b), strict=True):
    if a.dtype.kind in 'OSU':
      assert a == b
    else:
      np.testing.assert_array_equal(a, b)


def _rounds(run_dir):
  with open(os.path.join(run_dir, 'metrics.csv'), newline='') as f:
    return [int(r['round']) for r in csv.DictReader(f)]


def _event_steps(run_dir):
  from tensorboard.compat.proto import event_pb2  # pylint: disable=g-import-not-at-top
  steps = []
  for path in glob.glob(os.path.join(run_dir, 'tensorboard', '**', 'events.out.tfevents.*'),
                        recursive=True):
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
      event = event_pb2.Event.FromString(record)
      for value in event.summary.value:
        if value.tag.endswith('train/loss'):
          steps.append(event.step)
  return sorted(steps)


def _tree(path):
  """{relative path: (size, mtime)} of every file under `path`."""
  out = {}
  for root, _, files in os.walk(path):
    for name in files:
      full = os.path.join(root, name)
      st = os.stat(full)
      out[os.path.relpath(full, path)] = (st.st_size, st.st_mtime_ns)
  return out


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  """An uninterrupted 4-round run (checkpoints after rounds 2, 3, 4)."""
  root = tmp_path_factory.mktemp('reference')
  code, lines = _train(_settings(root))
  assert code == 0, lines
  return _run_dir(root)


@pytest.fixture(scope='module')
def three_rounds(tmp_path_factory):
  """The same run stopped after round 3 (checkpoints 1, 2, 3), to copy and damage."""
  root = tmp_path_factory.mktemp('three')
  code, lines = _train(_settings(root, total_rounds=3))
  assert code == 0, lines
  return _run_dir(root)


def _copy(run_dir, tmp_path):
  root = tmp_path / 'copy'
  shutil.copytree(run_dir, root / NAME)
  return root


def _one_line(lines, *needles):
  """The run's last line names every needle; no traceback anywhere."""
  assert not any('Traceback' in l for l in lines), '\n'.join(lines)
  for needle in needles:
    assert needle in lines[-1], (needle, lines)


# ---- Bad flag values: exit 2, one line naming the flag and the range, nothing written ----

BAD_VALUES = [
    (dict(dp=True, dp_clip_norm=1.0, dp_noise_multiplier=float('nan')), '--dp_noise_multiplier',
     'finite'),
    (dict(dp=True, dp_clip_norm=1.0, dp_noise_multiplier=float('inf')), '--dp_noise_multiplier',
     'finite'),
    (dict(dp=True, dp_clip_norm=1.0, dp_noise_multiplier=1.0, dp_delta=-1.0), '--dp_delta',
     '[0, 1)'),
    (dict(num_clients=5, clients_per_round=50), '--clients_per_round', '[1, --num_clients=5]'),
    (dict(task='synthetic', synthetic_alpha=float('nan'), synthetic_beta=1.0), '--synthetic_alpha',
     'finite'),
    (dict(synthetic_beta=-1.0), '--synthetic_beta', '>= 0'),
    (dict(execution_concurrency=-5), '--execution_concurrency', '-1'),
    (dict(seed=-1), '--seed', '>= 0'),
    (dict(seed=2**40), '--seed', '[0, '),
    (dict(client_learning_rate=float('inf')), '--client_learning_rate', 'finite'),
    (dict(total_rounds=0), '--total_rounds', '>= 1'),
    (dict(rounds_per_checkpoint=-2), '--rounds_per_checkpoint', '>= 1'),
    (dict(num_clients=-1), '--num_clients', '>= 0'),
    (dict(noisy_client_fraction=1.5), '--noisy_client_fraction', '[0, 1)'),
    (dict(sparsity=float('nan')), '--sparsity', 'finite'),
    (dict(divergence_factor=0.5), '--divergence_factor', 'above 1'),
    (dict(divergence_rounds=0), '--divergence_rounds', '>= 1'),
    (dict(experiment_name='../../escape'), '--experiment_name', '..'),
    (dict(experiment_name='/tmp/absolute'), '--experiment_name', 'relative'),
    (dict(experiment_name='a/../../b'), '--experiment_name', '..'),
]


@pytest.mark.parametrize('overrides, flag, allowed', BAD_VALUES)
def test_bad_values_are_rejected_naming_flag_and_range(tmp_path, overrides, flag, allowed):
  with pytest.raises(errors.UsageError) as raised:
    validation.validate(_settings(tmp_path / 'out', **overrides))
  message = str(raised.value)
  assert flag in message and allowed in message and '\n' not in message


@pytest.mark.parametrize('overrides, flag', [
    (dict(num_clients=100000), '--num_clients'),  # more clients than digits has examples
    (dict(num_clients=0, clients_per_round=50), '--clients_per_round'),  # 20 clients by default
    (dict(dp=True, dp_clip_norm=1.0, dp_noise_multiplier=float('nan')), '--dp_noise_multiplier'),
    (dict(experiment_name='../escape'), '--experiment_name'),
    (dict(data_dir='/nonexistent/dir'), '--data_dir'),  # was ignored by digits
])
def test_bad_values_exit_2_before_anything_is_written(tmp_path, overrides, flag):
  started = time.monotonic()
  code, lines = _train(_settings(tmp_path / 'out', **overrides))
  assert code == 2
  assert len(lines) == 1 and flag in lines[0], lines
  assert not os.path.exists(tmp_path / 'out') and not os.path.exists(tmp_path / 'escape')
  assert time.monotonic() - started < 60  # no hang


# ---- Damaged checkpoints ----

def _damage(ckpt, how):
  variables = os.path.join(ckpt, 'variables', 'variables.data-00000-of-00001')
  if how == 'truncated variables':
    os.truncate(variables, os.path.getsize(variables) // 2)
  elif how == 'garbled variables':
    data = bytearray(open(variables, 'rb').read())
    for i in range(64, len(data), 7):
      data[i] ^= 0x5A
    open(variables, 'wb').write(bytes(data))
  elif how == 'zeroed variables':
    open(variables, 'wb').write(bytes(os.path.getsize(variables)))
  elif how == 'garbled saved_model.pb':
    open(os.path.join(ckpt, 'saved_model.pb'), 'wb').write(b'\x07garbage' * 20)
  elif how == 'missing saved_model.pb':
    os.remove(os.path.join(ckpt, 'saved_model.pb'))
  elif how == 'missing variables.index':
    os.remove(os.path.join(ckpt, 'variables', 'variables.index'))
  elif how == 'garbled variables.index':
    open(os.path.join(ckpt, 'variables', 'variables.index'), 'wb').write(b'xy' * 40)
  elif how == 'empty directory':
    shutil.rmtree(ckpt)
    os.makedirs(ckpt)
  else:
    raise ValueError(how)


DAMAGE = ['truncated variables', 'garbled variables', 'zeroed variables', 'garbled saved_model.pb',
          'missing saved_model.pb', 'missing variables.index', 'garbled variables.index',
          'empty directory']


def test_every_kind_of_checkpoint_damage_is_set_aside(three_rounds, tmp_path):
  """Each damage of the newest checkpoint: set aside with one warning, the next one loads."""
  structure = asyncio.run(_read(os.path.join(three_rounds, 'checkpoints', 'program_state_2')))
  for how in DAMAGE:
    run = tmp_path / how.replace(' ', '_')
    shutil.copytree(os.path.join(three_rounds, 'checkpoints'), run / 'checkpoints')
    _damage(str(run / 'checkpoints' / 'program_state_3'), how)
    manager = _manager(run)
    err = _capture(lambda: asyncio.run(run_files.recover(manager, str(run), structure)))
    version, _ = err.result
    assert version == 2, how
    assert sorted(os.listdir(run / 'checkpoints')) == [
        'program_state_1', 'program_state_2', 'program_state_3.damaged'], how
    assert len(err.lines) == 1 and 'program_state_3' in err.lines[0], (how, err.lines)


def test_no_loadable_checkpoint_is_one_line_and_nothing_renamed(three_rounds, tmp_path):
  root = _copy(three_rounds, tmp_path)
  run = _run_dir(root)
  for version in (1, 2, 3):
    _damage(os.path.join(run, 'checkpoints', f'program_state_{version}'), 'truncated variables')
  before = _tree(os.path.join(run, 'checkpoints'))
  code, lines = _train(_settings(root))
  assert code == 2
  _one_line(lines, 'none of the checkpoints', os.path.join(run, 'checkpoints'))
  assert _tree(os.path.join(run, 'checkpoints')) == before


def test_damaged_latest_checkpoint_and_stray_files_resume_bit_identically(
    reference, three_rounds, tmp_path):
  """Checkpoint 3 garbled, a stray program_state_99, a partial save, metrics.csv cut
  mid-line and TensorBoard events of round 3: resumes from 2, ends equal to `reference`."""
  root = _copy(three_rounds, tmp_path)
  run = _run_dir(root)
  _damage(os.path.join(run, 'checkpoints', 'program_state_3'), 'garbled saved_model.pb')
  os.makedirs(os.path.join(run, 'checkpoints', 'program_state_99'))
  os.makedirs(os.path.join(run, 'checkpoints', 'program_state_4_temp1234', 'variables'))
  metrics = os.path.join(run, 'metrics.csv')
  os.truncate(metrics, os.path.getsize(metrics) - 25)  # round 3's row cut off
  assert _event_steps(run) == [1, 2, 3]

  code, lines = _train(_settings(root))
  assert code == 0, lines
  assert not any('Traceback' in l for l in lines)
  assert any('partial checkpoint' in l and 'program_state_4_temp1234' in l for l in lines)
  assert any('program_state_99' in l and '.damaged' in l for l in lines)
  assert any('program_state_3' in l and 'set aside' in l for l in lines)
  assert 'Resuming from the checkpoint after round 2.' in lines
  _assert_same_weights(reference, run)
  assert _rounds(run) == [1, 2, 3, 4]
  assert _event_steps(run) == [1, 2, 3, 4]  # round 3 once, although trained twice
  with open(os.path.join(reference, 'metrics.csv')) as f, open(metrics) as g:
    ref_rows, rows = list(csv.DictReader(f)), list(csv.DictReader(g))
  for a, b in zip(ref_rows, rows, strict=True):
    assert a.keys() == b.keys()
    for key in a:  # Keras' evaluation may differ in the last bits
      if key not in ('round_seconds', 'eval_seconds') and a[key]:
        assert float(a[key]) == pytest.approx(float(b[key]), rel=1e-6), key
  assert not glob.glob(os.path.join(run, 'checkpoints', '*_temp*'))


# ---- metrics.csv ----

@pytest.mark.parametrize('damage, warned', [
    ('cut', 'cut off'), ('garbled', 'unreadable'), ('binary', 'unreadable'), ('empty', 'unreadable'),
    ('bad row', 'damaged'), ('missing', 'missing'), ('rows after the checkpoint', None)])
def test_metrics_csv_damage_is_rebuilt_or_moved_aside(tmp_path, damage, warned):
  path = tmp_path / 'metrics.csv'
  good = 'round,train/loss,eval/loss\n1,2.5,\n2,2.25,2.0\n3,2.0,\n'
  text = {'cut': good[:-4], 'garbled': '\x01\x02;;;\n,,,\n', 'binary': '\0\1\2\3' * 10,
          'empty': '', 'bad row': good.replace('2,2.25', 'x?,2.25'),
          'rows after the checkpoint': good + '4,1.5,\n5,1.0,1.0\n'}.get(damage)
  if text is not None:
    path.write_bytes(text.encode('latin-1'))
  metrics = run_files.MetricsFile(str(path))
  err = _capture(lambda: metrics.open_at(3))
  if warned:
    assert len(err.lines) == 1 and warned in err.lines[0] and str(path) in err.lines[0], err.lines
  else:
    assert not err.lines
  metrics.release({'train/loss': 1.75, 'new': 7.0}, 4)
  with open(path, newline='') as f:
    rows = list(csv.DictReader(f))
  assert [int(r['round']) for r in rows][-1] == 4
  assert [int(r['round']) for r in rows] == sorted({int(r['round']) for r in rows})
  expected = {'cut': [1, 2, 4], 'bad row': [1, 3, 4], 'rows after the checkpoint': [1, 2, 3, 4]}
  assert [int(r['round']) for r in rows] == expected.get(damage, [4])
  if damage in ('garbled', 'binary', 'empty'):
    assert os.path.exists(f'{path}.damaged')


def test_failed_metrics_append_leaves_no_partial_row(tmp_path, monkeypatch):
  path = tmp_path / 'metrics.csv'
  metrics = run_files.MetricsFile(str(path))
  metrics.open_at(0)
  metrics.release({'loss': 1.0}, 1)
  before = path.read_bytes()

  def no_space(fd):
    raise OSError(errno.ENOSPC, 'No space left on device')

  monkeypatch.setattr(os, 'fsync', no_space)
  with pytest.raises(OSError):
    metrics.release({'loss': 0.5}, 2)
  assert path.read_bytes() == before
  assert not os.path.exists(f'{path}.tmp')


# ---- flags.json ----

@pytest.mark.parametrize('damage', ['garbled', 'list', 'missing'])
def test_damaged_flags_json_refuses_to_resume(three_rounds, tmp_path, damage):
  root = _copy(three_rounds, tmp_path)
  run = _run_dir(root)
  path = os.path.join(run, 'flags.json')
  if damage == 'missing':
    os.remove(path)
  else:
    open(path, 'w').write('{"task": "dig' if damage == 'garbled' else '[1, 2]')
  before = _tree(run)
  code, lines = _train(_settings(root, client_learning_rate=0.5))
  assert code == 2
  assert len(lines) == 1 and path in lines[0] and '--trust_command_line' in lines[0], lines
  assert _tree(run) == before  # not even a lock file changed


def test_a_path_flag_written_another_way_is_the_same_run(tmp_path, monkeypatch):
  """--data_dir relative to the working directory, then absolute: one run; another
  directory is refused naming the flag (no training: the check before anything runs)."""
  monkeypatch.chdir(tmp_path)
  (tmp_path / 'data').mkdir()
  (tmp_path / 'other').mkdir()
  common = ['--task=digits', f'--root_output_dir={tmp_path / "runs"}', '--experiment_name=r']
  for data_dir in ('data', str(tmp_path / 'data'), './data/'):
    settings, _ = cli.config_from_args([*common, f'--data_dir={data_dir}'])
    experiment.unlock_run_dir(experiment.prepare_output_dir(settings))
  settings, _ = cli.config_from_args([*common, '--data_dir=other'])
  with pytest.raises(errors.UsageError, match="holds a run with different flags: --data_dir='other'"):
    experiment.prepare_output_dir(settings)


def test_trust_command_line_resumes_and_records_flags(reference, three_rounds, tmp_path):
  root = _copy(three_rounds, tmp_path)
  run = _run_dir(root)
  os.remove(os.path.join(run, 'flags.json'))
  code, lines = _train(_settings(root, trust_command_line=True))
  assert code == 0, lines
  assert any('--trust_command_line' in l and 'flags.json' in l for l in lines)
  _assert_same_weights(reference, run)
  with open(os.path.join(run, 'flags.json')) as f:
    assert json.load(f)['client_learning_rate'] == 0.1


# ---- Concurrent runs: the lock ----

_HOLD = """
import fcntl, os, sys, time

fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0); os.write(fd, f'{os.getpid()}\\n'.encode())
print('locked', flush=True)
time.sleep(120)
"""


def test_second_run_into_a_locked_directory_exits_2_naming_the_holder(three_rounds, tmp_path):
  root = _copy(three_rounds, tmp_path)
  run = _run_dir(root)
  holder = subprocess.Popen([sys.executable, '-c', _HOLD, os.path.join(run, experiment.LOCK_NAME)],
                            stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == 'locked'
    before = _tree(run)
    started = time.monotonic()
    code, lines = _train(_settings(root))
    assert code == 2
    assert len(lines) == 1 and f'pid {holder.pid}' in lines[0] and run in lines[0], lines
    assert time.monotonic() - started < 10  # at once: before the task is built
    assert _tree(run) == before
  finally:
    holder.kill()
    holder.wait()
  # The holder is dead: its lock is taken over (the file still names it).
  with open(os.path.join(run, experiment.LOCK_NAME)) as f:
    assert f.read().strip() == str(holder.pid)
  code, lines = _train(_settings(root))
  assert code == 0, lines
  assert _rounds(run) == [1, 2, 3, 4]


# ---- A full disk ----

def test_disk_full_while_checkpointing(reference, tmp_path, monkeypatch):
  """ENOSPC in round 3's checkpoint: one message (round, last checkpoint), no partial
  directory; the rerun resumes from round 2 and ends equal to `reference`."""
  # The fingerprint is the last file of every SavedModel write (TFF's and checkpoint_files').
  real_write = fingerprinting_utils.write_fingerprint

  def full_disk(path):
    if os.path.basename(path).startswith('program_state_3_temp'):
      open(os.path.join(path, 'saved_model.pb'), 'wb').write(b'partial')
      raise OSError(errno.ENOSPC, 'No space left on device')
    return real_write(path)

  monkeypatch.setattr(fingerprinting_utils, 'write_fingerprint', full_disk)
  code, lines = _train(_settings(tmp_path))
  run = _run_dir(tmp_path)
  assert code == 1
  _one_line(lines, 'round 3', 'No space left on device', 'program_state_2', 'rerun')
  assert sorted(os.listdir(os.path.join(run, 'checkpoints'))) == [
      'program_state_1', 'program_state_2']
  monkeypatch.setattr(fingerprinting_utils, 'write_fingerprint', real_write)
  code, lines = _train(_settings(tmp_path))
  assert code == 0, lines
  _assert_same_weights(reference, run)
  assert _rounds(run) == [1, 2, 3, 4] and _event_steps(run) == [1, 2, 3, 4]


# ---- Divergence ----

def test_finite_blow_up_stops_and_off_switch(tmp_path):
  code, lines = _train(_settings(tmp_path, client_learning_rate=1e6, total_rounds=5))
  assert code == 1
  _one_line(lines, 'diverged at round 3', 'train/client_work/train/loss', '--divergence_factor=0',
            'no checkpoint was kept')
  assert not os.listdir(os.path.join(_run_dir(tmp_path), 'checkpoints'))
  # Off: the run goes on (to a useless model, as asked).
  code, lines = _train(_settings(tmp_path / 'off', client_learning_rate=1e6, total_rounds=3,
                                 divergence_factor=0.0))
  assert code == 0, lines


def test_non_finite_loss_cites_only_an_existing_checkpoint(tmp_path):
  code, lines = _train(_settings(tmp_path, client_learning_rate=1e30, total_rounds=3))
  assert code == 1
  _one_line(lines, 'diverged at round', 'non-finite')
  run = _run_dir(tmp_path)
  versions = [int(n.rsplit('_', 1)[1]) for n in os.listdir(os.path.join(run, 'checkpoints'))]
  if versions:
    assert f'program_state_{max(versions)}' in lines[-1]
  else:
    assert 'no checkpoint was kept' in lines[-1] and 'round 0' not in lines[-1]


# ---- helpers ----

async def _read(path):
  from tensorflow_federated.python.program import file_utils  # pylint: disable=g-import-not-at-top
  return await file_utils.read_saved_model(path)


def _manager(run):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  return tff.program.FileProgramStateManager(str(run / 'checkpoints'), keep_total=3,
                                             keep_first=False)


class _Captured:
  result = None
  lines: list


def _capture(fn):
  import contextlib  # pylint: disable=g-import-not-at-top
  import io  # pylint: disable=g-import-not-at-top
  err = io.StringIO()
  captured = _Captured()
  with contextlib.redirect_stderr(err):
    captured.result = fn()
  captured.lines = [l for l in err.getvalue().splitlines() if l.strip()]
  return captured
