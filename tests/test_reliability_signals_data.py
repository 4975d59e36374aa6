"""Fault injection, continued (tests/test_reliability.py): SIGINT/SIGTERM stop with one
line and resume; malformed data files get one line naming the file before any output;
worker logs stay in the run directory or a private removed one."""

import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from workflow import errors
from workflow.sweeps import sweep
from workflow.training import cli
from workflow.training import run_dir as run_directory
from workflow.training import run_files

from test_reliability import (_assert_same_weights, _event_steps, _one_line, _rounds,  # pylint: disable=g-bad-import-order,unused-import
                              _run_dir, _settings, _train, reference)

pytestmark = pytest.mark.slow


# ---- Signals ----

@pytest.mark.parametrize('signum, code', [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_stops_with_one_line_and_resumes(reference, tmp_path, signum, code):
  run = _run_dir(tmp_path)
  marker = os.path.join(run, 'checkpoints', 'program_state_2')

  def send():
    deadline = time.monotonic() + 120
    while not os.path.exists(marker) and time.monotonic() < deadline:
      time.sleep(0.01)
    os.kill(os.getpid(), signum)

  threading.Thread(target=send, daemon=True).start()
  got, lines = _train(_settings(tmp_path))
  assert got == code, lines
  _one_line(lines, signal.Signals(signum).name, 'stopped at round', 'resume with the same command')
  assert len([l for l in lines if 'stopped' in l]) == 1
  assert not glob.glob(os.path.join(run, 'checkpoints', '*_temp*'))
  # The checkpoint named is the newest one there (the loop's own note of it could lag).
  assert f'program_state_{run_files.newest_checkpoint(run)}' in lines[-1], lines
  got, lines = _train(_settings(tmp_path))
  assert got == 0, lines
  _assert_same_weights(reference, run)
  assert _rounds(run) == [1, 2, 3, 4] and _event_steps(run) == [1, 2, 3, 4]


def test_a_finished_or_failed_run_puts_the_signal_handlers_back(tmp_path):
  """A process that goes on after a run (a report's pool worker) keeps its own handlers:
  SIGTERM at the pool's exit used to raise `Interrupted` with a traceback."""
  def mine(signum, frame):
    del signum, frame
  before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
  try:
    signal.signal(signal.SIGTERM, mine)
    cli.run_training(_settings(tmp_path / 'ok', total_rounds=1))
    assert signal.getsignal(signal.SIGTERM) is mine
    assert signal.getsignal(signal.SIGINT) is before[signal.SIGINT]
    with pytest.raises(errors.RunError):  # diverged: exit status 1
      cli.run_training(_settings(tmp_path / 'diverged', total_rounds=1,
                                 client_learning_rate=1e30))
    assert signal.getsignal(signal.SIGTERM) is mine
  finally:
    for s, handler in before.items():
      signal.signal(s, handler)


# ---- A diverged run's record, which bin/sweep reads to skip the trial ----

def test_a_diverged_run_leaves_its_record_and_a_rerun_forgets_it(tmp_path):
  code, lines = _train(_settings(tmp_path, client_learning_rate=1e6, total_rounds=5))
  assert code == 1, lines
  path = os.path.join(_run_dir(tmp_path), run_directory.DIVERGED)
  with open(path) as f:
    record = json.load(f)
  assert record['round'] == 3 and record['error'] in lines[-1], (record, lines)
  assert sweep.DIVERGED == run_directory.DIVERGED
  # A rerun retries the run: the record goes, whether or not it diverges again.
  code, lines = _train(_settings(tmp_path, client_learning_rate=1e6, total_rounds=2))
  assert code == 0, lines
  assert not os.path.exists(path)


# ---- Malformed data files: one line naming the file, before any output ----

def _edit_json(path, edit):
  with open(path) as f:
    data = json.load(f)
  edit(data['user_data'])
  with open(path, 'w') as f:
    json.dump(data, f)


def _first_user(users):
  return users[sorted(users)[0]]


class _Planted:
  def __reduce__(self):
    return (os.system, (f'touch {_PLANTED_MARKER}',))


_PLANTED_MARKER = '/nonexistent'


def _data_case(case, data_dir):
  """Writes a malformed data file for `case`; returns (task, the file the message must name)."""
  from tasks import fixtures  # pylint: disable=g-import-not-at-top
  d = str(data_dir)
  if case.startswith('mnist'):
    path = fixtures.write_keras_mnist(d, train=40, test=20)
    with np.load(path) as f:
      arrays = dict(f)
    if case == 'mnist missing key':
      del arrays['y_test']
    elif case == 'mnist length mismatch':
      arrays['y_train'] = arrays['y_train'][:-3]
    elif case == 'mnist bad labels':
      arrays['y_train'][0] = 200
    np.savez(path, **arrays)
    if case == 'mnist not a zip':
      open(path, 'wb').write(b'garbage' * 10)
    return 'mnist', path
  if case.startswith('cifar10'):
    archive = case == 'cifar10 truncated tar.gz'
    where = fixtures.write_keras_cifar10(d, per_batch=4, test=4, archive=archive)
    if archive:
      os.truncate(where, os.path.getsize(where) // 2)
      return 'cifar10', where
    path = os.path.join(where, 'data_batch_2')
    if case == 'cifar10 garbage batch':
      open(path, 'wb').write(b'\x80\x04garbage' * 30)
    elif case == 'cifar10 wrong shape':
      import pickle  # pylint: disable=g-import-not-at-top
      open(path, 'wb').write(pickle.dumps({b'data': np.zeros((4, 100), np.uint8),
                                           b'labels': [0, 1, 2, 3]}))
    elif case == 'cifar10 planted code':
      import pickle  # pylint: disable=g-import-not-at-top
      global _PLANTED_MARKER
      _PLANTED_MARKER = os.path.join(d, 'PWNED')
      open(path, 'wb').write(pickle.dumps({b'data': _Planted(), b'labels': [0]}))
    return 'cifar10', path
  if case.startswith('femnist'):
    fixtures.write_leaf_femnist(d, users_per_file=(2,), samples=5)
    path = glob.glob(os.path.join(d, 'train', '*.json'))[0]
    if case == 'femnist feature shape':
      _edit_json(path, lambda users: _first_user(users)['x'].__setitem__(0, [0.5] * 100))
    elif case == 'femnist bad label':
      _edit_json(path, lambda users: _first_user(users)['y'].__setitem__(0, 99))
    elif case == 'femnist x/y lengths':
      _edit_json(path, lambda users: _first_user(users)['y'].pop())
    return 'femnist', path
  if case == 'sent140 bad label':
    fixtures.write_leaf_sent140(d)
    path = glob.glob(os.path.join(d, 'train', '*.json'))[0]
    _edit_json(path, lambda users: _first_user(users)['y'].__setitem__(1, 'positive'))
    return 'sent140', path
  if case == 'shakespeare_leaf bad target':
    fixtures.write_leaf_shakespeare(d)
    path = glob.glob(os.path.join(d, 'train', '*.json'))[0]
    _edit_json(path, lambda users: _first_user(users)['y'].__setitem__(0, 42))
    return 'shakespeare_leaf', path
  raise ValueError(case)


DATA_CASES = ['mnist missing key', 'mnist length mismatch', 'mnist bad labels', 'mnist not a zip',
              'cifar10 garbage batch', 'cifar10 wrong shape', 'cifar10 planted code',
              'cifar10 truncated tar.gz', 'femnist feature shape', 'femnist bad label',
              'femnist x/y lengths', 'sent140 bad label', 'shakespeare_leaf bad target']


@pytest.mark.parametrize('case', DATA_CASES)
def test_malformed_data_file_is_one_line_naming_it(tmp_path, case):
  from tasks import registry  # pylint: disable=g-import-not-at-top
  task, path = _data_case(case, tmp_path / 'data')
  settings = _settings(tmp_path / 'out', task=task, data_dir=str(tmp_path / 'data'),
                       num_clients=2, clients_per_round=1, partition='iid')
  with pytest.raises(ValueError) as raised:
    registry.create_task(settings.task, batch_size=settings.client.client_batch_size,
                         num_epochs=1, seed=settings.loop.seed)
  message = str(raised.value)
  assert path in message and '\n' not in message, message
  if case == 'cifar10 planted code':
    assert 'refusing to load posix.system' in message
    assert not os.path.exists(_PLANTED_MARKER)
  leftovers = glob.glob(str(tmp_path / 'data' / '**' / '*.tmp*'), recursive=True)
  assert not leftovers  # no half-converted cache


def test_malformed_data_file_exits_2_before_output(tmp_path):
  task, path = _data_case('mnist length mismatch', tmp_path / 'data')
  code, lines = _train(_settings(tmp_path / 'out', task=task, data_dir=str(tmp_path / 'data'),
                                 num_clients=2, clients_per_round=1, partition='iid'))
  assert code == 2
  assert len(lines) == 1 and path in lines[0], lines
  assert not os.path.exists(tmp_path / 'out')


# ---- Logs: in the run directory or a private temporary directory that is removed ----

def test_worker_logs_are_in_the_run_dir_or_a_private_removed_dir(reference):
  assert os.path.isfile(os.path.join(reference, 'worker.log'))
  script = ('import os; from tff_adaptive.execution import runtime, worker_process; '
            'd = runtime.private_log_dir(); '
            'print(d, oct(os.stat(d).st_mode & 0o777), runtime.worker_log_path(), '
            'worker_process.WorkerProcess(port=1).log_path)')
  out = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=60,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  assert out.returncode == 0, out.stderr
  directory, mode, log, worker_log = out.stdout.split()
  assert mode == '0o700' and os.path.basename(directory).startswith('tff_adaptive_')
  assert log == os.path.join(directory, 'worker.log')
  assert worker_log == os.path.join(directory, 'worker_1.log')
  assert not os.path.exists(directory)  # removed at exit
