"""Hostile inputs, round two: no write through a symbolic link out of the run
directory, no traceback from any flag, spec, directory or user task, no hang, and messages
and records that say what is true. docs/reliability.md lists these guarantees.

Small in-process runs as in tests/test_reliability.py (whose helpers are reused); a
subprocess only where the real argv or binary matters. Every rejection is checked for
its exit code, one line naming the flag or file, and an unchanged filesystem around the
run (`_snapshot` of the whole test directory, links included).
"""

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

# three_rounds: a digits run of 3 rounds (checkpoints 1-3), to copy and plant links or files in.
from test_reliability import NAME, _settings, _copy, _one_line, _rounds, _run_dir, _train
from test_reliability import three_rounds  # pylint: disable=unused-import  (a fixture)
from workflow import errors
from workflow.flags import flag_checks
from workflow.sweeps import sweep
from workflow.training import cli
from workflow.training import experiment
from workflow.training import heartbeat
from workflow.training import program
from workflow.training import run_dir
from workflow.training import run_files

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _snapshot(path):
  """{relative path: (kind, size, mtime)} of everything under `path`, links not followed."""
  out = {}
  for where, dirs, files in os.walk(path):
    for name in dirs + files:
      full = os.path.join(where, name)
      st = os.lstat(full)
      kind = 'link' if os.path.islink(full) else 'dir' if os.path.isdir(full) else 'file'
      out[os.path.relpath(full, path)] = (kind, 0 if kind == 'dir' else st.st_size,
                                          st.st_mtime_ns, os.readlink(full) if kind == 'link'
                                          else None)
  return out


def _rejected(tmp_path, settings, *needles):
  """Runs `settings`: exit 2, one line naming every needle, nothing under tmp_path changed."""
  before = _snapshot(tmp_path)
  code, lines = _train(settings)
  assert code == 2, lines
  assert len(lines) == 1, lines
  _one_line(lines, *needles)
  assert _snapshot(tmp_path) == before
  return lines[0]


# ---- Symbolic links: a run never writes through one ----

def test_run_directory_linked_outside_the_root_is_refused(tmp_path):
  outside = tmp_path / 'outside'
  outside.mkdir()
  (tmp_path / 'root').mkdir()
  os.symlink(outside, tmp_path / 'root' / NAME)
  _rejected(tmp_path, _settings(tmp_path / 'root'), str(tmp_path / 'root' / NAME),
            'symbolic link', '--root_output_dir')
  # A link on the way (a nested --experiment_name) is named too.
  os.symlink(outside, tmp_path / 'root' / 'sub')
  _rejected(tmp_path, _settings(tmp_path / 'root', experiment_name='sub/run'),
            str(tmp_path / 'root' / 'sub'), 'symbolic link')
  assert not os.listdir(outside)


@pytest.mark.parametrize('entry', ['.lock', 'metrics.csv', 'flags.json', 'worker.log',
                                   'tensorboard', 'checkpoints', 'client_state',
                                   'checkpoints/program_state_3'])
def test_a_link_planted_in_the_run_directory_is_refused(three_rounds, tmp_path, entry):
  root = _copy(three_rounds, tmp_path)
  run = _run_dir(root)
  planted = os.path.join(run, entry)
  target = tmp_path / 'outside' / os.path.basename(entry)
  target.parent.mkdir()
  if os.path.isdir(planted):
    shutil.copytree(planted, target)
    shutil.rmtree(planted)
  elif os.path.exists(planted):
    shutil.copy(planted, target)
    os.remove(planted)
  else:
    target.mkdir() if entry == 'client_state' else target.write_text('victim\n')
  os.symlink(target, planted)
  line = _rejected(tmp_path, _settings(root), planted, 'symbolic link')
  assert '--experiment_name' in line


def test_files_are_opened_without_following_a_link_planted_after_the_check(tmp_path):
  """The run's own files use O_NOFOLLOW: a link planted mid-run fails the write instead."""
  victim = tmp_path / 'victim.csv'
  victim.write_text('a,b\n')
  metrics = run_files.MetricsFile(str(tmp_path / 'metrics.csv'))
  metrics.open_at(0)
  metrics.release({'loss': 1.0}, 1)
  os.remove(tmp_path / 'metrics.csv')
  os.symlink(victim, tmp_path / 'metrics.csv')
  with pytest.raises(run_dir.PathError, match='symbolic link'):
    metrics.release({'loss': 0.5}, 2)
  assert victim.read_text() == 'a,b\n'
  os.symlink(victim, tmp_path / '.lock')
  with pytest.raises(errors.UsageError, match='symbolic link'):
    experiment.lock_run_dir(str(tmp_path))
  assert victim.read_text() == 'a,b\n'


# ---- Directories and files of the wrong kind ----

@pytest.mark.parametrize('entry, needle', [('tensorboard', 'is a file'),
                                           ('checkpoints', 'is a file'),
                                           ('.lock', 'is a directory')])
def test_run_entry_of_the_wrong_kind_is_one_line(three_rounds, tmp_path, entry, needle):
  root = _copy(three_rounds, tmp_path)
  path = os.path.join(_run_dir(root), entry)
  if os.path.isdir(path):
    shutil.rmtree(path)
    open(path, 'w').write('x')
  else:
    os.remove(path)
    os.mkdir(path)
  _rejected(tmp_path, _settings(root), path, needle)


def test_read_only_tensorboard_directory_is_one_line(three_rounds, tmp_path, monkeypatch):
  root = _copy(three_rounds, tmp_path)
  path = os.path.join(_run_dir(root), 'tensorboard')
  os.chmod(path, 0o555)
  if os.geteuid() == 0:  # root writes anyway: see the directory as another user would
    real_access = os.access
    monkeypatch.setattr(os, 'access', lambda p, mode: False if os.fspath(p) == path
                        else real_access(p, mode))
  try:
    _rejected(tmp_path, _settings(root), path, 'read-only')
  finally:
    os.chmod(path, 0o755)


def test_client_state_dir_naming_a_file_is_one_line(tmp_path):
  state_file = tmp_path / 'state'
  state_file.write_text('not a directory')
  _rejected(tmp_path, _settings(tmp_path / 'out', algorithm='perfedavg',
                                client_state_dir=str(state_file)),
            f'--client_state_dir={state_file}', 'is a file')


def test_lock_replaced_by_a_directory_is_named_as_such(three_rounds, tmp_path):
  root = _copy(three_rounds, tmp_path)
  lock = os.path.join(_run_dir(root), experiment.LOCK_NAME)
  os.remove(lock)
  os.mkdir(lock)
  line = _rejected(tmp_path, _settings(root), lock, 'is a directory')
  assert 'not writable' not in line


# ---- --task code that raises ----

@pytest.mark.parametrize('case', ['call', 'syntax', 'import'])
def test_task_code_that_raises_is_one_line_naming_task(tmp_path, monkeypatch, case):
  module = f'hostile_{case}_{os.getpid()}'
  if case == 'call':
    task = 'tests.hostile_task_fixture:raises'
    needles = ['--task=tests.hostile_task_fixture:raises', 'UserBug', 'task function failed']
  else:
    (tmp_path / 'code').mkdir()
    (tmp_path / 'code' / f'{module}.py').write_text(
        'def make_task(:\n' if case == 'syntax' else 'raise RuntimeError("boom at import")\n')
    monkeypatch.syspath_prepend(str(tmp_path / 'code'))
    task = f'{module}:make_task'
    needles = [f'--task={task}', 'SyntaxError' if case == 'syntax' else 'boom at import']
  settings = _settings(tmp_path / 'out', task=task, num_clients=0, clients_per_round=2)
  _rejected(tmp_path, settings, *needles, 'TFF_ADAPTIVE_TRACEBACK=1')
  sys.modules.pop(module, None)
  # The traceback on request: the user's frames, then the same last line.
  monkeypatch.setenv(errors.TRACEBACK_ENV, '1')
  code, lines = _train(settings)
  assert code == 2 and any(l.startswith('Traceback') for l in lines), lines
  assert needles[0] in lines[-1]
  assert not os.path.exists(tmp_path / 'out')
  sys.modules.pop(module, None)


# ---- Values that hung, overflowed or were silently accepted ----

BOUNDS = [
    (dict(dirichlet_alpha=1e-300), '--dirichlet_alpha', 'at least'),
    (dict(dp=True, dp_clip_norm=1.0, dp_noise_multiplier=1e308), '--dp_noise_multiplier',
     'at most'),
    (dict(local_steps=2000000000), '--local_steps', 'at most'),
    (dict(workers=',,,'), '--workers', 'no address'),
    (dict(experiment_name='run\udcff\udcfe'), '--experiment_name', 'UTF-8'),
    (dict(root_output_dir='/tmp/\udcffroot'), '--root_output_dir', 'UTF-8'),
    (dict(experiment_name='a\0b'), '--experiment_name', 'NUL'),
]


@pytest.mark.parametrize('overrides, flag, needle', BOUNDS)
def test_values_that_hung_or_overflowed_are_rejected_before_anything_is_written(
    tmp_path, overrides, flag, needle):
  started = time.monotonic()
  settings = _settings(tmp_path / 'out', **overrides)
  _rejected(tmp_path, settings, flag, needle)
  assert time.monotonic() - started < 30


def test_the_bounds_keep_their_computations_finite():
  """At the bounds, Dirichlet sampling and the privacy accountant finish, quickly."""
  from tff_adaptive.accounting import privacy  # pylint: disable=g-import-not-at-top
  started = time.monotonic()
  rng = np.random.default_rng(0)
  for _ in range(10):
    assert np.isfinite(rng.dirichlet(flag_checks.MIN_DIRICHLET_ALPHA * np.ones(100))).all()
  for rate in (1e-3, 0.1, 1.0):
    assert privacy.epsilon(flag_checks.MAX_DP_NOISE_MULTIPLIER, rate, 100, 1e-5) >= 0
  assert time.monotonic() - started < 30


@pytest.mark.parametrize('name', ['/'.join(['x' * 200] * 25), 'y' * 300])
def test_an_experiment_name_too_long_for_the_system_leaves_nothing(tmp_path, name):
  _rejected(tmp_path, _settings(tmp_path / 'out', experiment_name=name), '--experiment_name')
  assert not os.path.exists(tmp_path / 'out')


def test_an_experiment_name_through_a_file_names_the_flag(tmp_path):
  (tmp_path / 'out').mkdir()
  (tmp_path / 'out' / 'a').write_text('a file')
  _rejected(tmp_path, _settings(tmp_path / 'out', experiment_name='a/b'), 'is a file',
            '--experiment_name')


def test_non_utf8_experiment_name_from_the_command_line(tmp_path):
  """The real argv path: bytes that are not UTF-8 reach Python as surrogates."""
  before = _snapshot(tmp_path)
  out = subprocess.run(
      [sys.executable, os.path.join(REPO, 'bin', 'train.py'), '--task=digits',
       f'--root_output_dir={tmp_path}'.encode(), b'--experiment_name=run\xff\xfe'],
      capture_output=True, timeout=300, cwd=REPO)
  lines = out.stderr.decode(errors='replace').strip().splitlines()
  assert out.returncode == 2, lines
  assert len(lines) == 1 and '--experiment_name' in lines[0] and 'UTF-8' in lines[0], lines
  assert _snapshot(tmp_path) == before


def test_binary_flagfile_is_one_line_naming_it(tmp_path):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from workflow.flags import train_flags  # pylint: disable=g-import-not-at-top
  path = tmp_path / 'binary.flags'
  path.write_bytes(bytes(range(256)) * 4)
  values = flags.FlagValues()
  train_flags.define_flags(values)
  with pytest.raises(errors.UsageError) as raised:
    cli.parse_flags(['train.py', f'--flagfile={path}'], values)
  message = str(raised.value)
  assert f'--flagfile={path}' in message and 'UTF-8' in message and '\n' not in message
  assert raised.value.exit_code == 2


def test_non_finite_evaluation_metrics_warn_once_and_the_run_goes_on(tmp_path):
  settings = _settings(tmp_path, task='tests.hostile_task_fixture:nan_test_data',
                       num_clients=0, clients_per_round=2, total_rounds=3, rounds_per_eval=1)
  code, lines = _train(settings)
  assert code == 0, lines
  warnings = [l for l in lines if 'not finite' in l]
  assert len(warnings) == 1 and 'eval/loss=nan' in warnings[0] and 'round 1' in warnings[0], lines
  assert not any('Traceback' in l for l in lines)
  assert _rounds(_run_dir(tmp_path)) == [1, 2, 3]


def test_a_long_round_shows_that_it_is_running(tmp_path):
  config = program.LoopConfig(total_rounds=5, clients_per_round=1, rounds_per_eval=1,
                              rounds_per_checkpoint=1, output_dir=str(tmp_path),
                              heartbeat_seconds=0.05)
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    with heartbeat.while_running(2, config):
      time.sleep(0.5)
    time.sleep(0.2)  # and silence once the round is over
  lines = err.getvalue().strip().splitlines()
  assert 1 <= len(lines) <= 3 and all('round 2/5: still running after' in l for l in lines), lines
  config.show_progress = False
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    with heartbeat.while_running(2, config):
      time.sleep(0.2)
  assert not err.getvalue()


# ---- Messages and records that say what is true ----

def test_checkpoint_messages_name_the_newest_checkpoint_on_disk(tmp_path):
  """What the loop noted last may lag (a signal between a save and its note): the disk rules."""
  run = tmp_path / NAME
  for name in ('program_state_2', 'program_state_4', 'program_state_5_temp1234',
               'program_state_6.damaged'):
    (run / 'checkpoints' / name).mkdir(parents=True)
  assert run_files.newest_checkpoint(str(run)) == 4
  try:
    stopped = cli._stopped(signal.SIGINT, str(run),  # pylint: disable=protected-access
                           program.Progress(round_num=5, last_checkpoint=2))
  finally:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
  assert stopped.exit_code == 130
  line = str(stopped)
  assert 'stopped at round 5' in line and 'program_state_4' in line and '\n' not in line, line
  assert not (run / 'checkpoints' / 'program_state_5_temp1234').exists()
  assert 'no checkpoint was kept' in run_files.checkpoint_phrase(str(tmp_path / 'none'))


def test_trust_command_line_runs_what_it_records(three_rounds, tmp_path):
  """flags.json lost; --trust_command_line with another learning rate: the run trains with it."""
  root = _copy(three_rounds, tmp_path)
  run = _run_dir(root)
  os.remove(os.path.join(run, 'flags.json'))
  settings = _settings(root, trust_command_line=True, client_learning_rate=0.5)
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    try:
      state, _ = cli.run_training(settings)
    finally:
      signal.signal(signal.SIGINT, signal.default_int_handler)
      signal.signal(signal.SIGTERM, signal.SIG_DFL)
  assert 'hyperparameters replace the checkpoint' in err.getvalue()
  assert float(state.client_work['learning_rate']) == 0.5  # ran with what it records:
  with open(os.path.join(run, 'flags.json')) as f:
    assert json.load(f)['client_learning_rate'] == 0.5
  assert _rounds(run) == [1, 2, 3, 4]
  # ... and the record is what a rerun is checked against.
  code, lines = _train(_settings(root, total_rounds=5))
  assert code == 2 and 'client_learning_rate' in lines[-1], lines


# ---- bin/sweep.py ----

def test_sweep_specs_and_values_bin_train_would_refuse_are_one_line(tmp_path):
  binary = tmp_path / 'binary.spec'
  binary.write_bytes(b'total_rounds = 2\n\xff\xfe\x00\x01' * 8)
  with pytest.raises(sweep.SpecError, match=f'{binary} is not a text file'):
    sweep.parse_spec_file(str(binary))
  nul = tmp_path / 'nul.spec'
  nul.write_bytes(b'total_rounds = 2\n[a]\nalgorithm = fed\0avg\n')
  with pytest.raises(sweep.SpecError, match=f'{nul}:3: holds a NUL byte'):
    sweep.parse_spec_file(str(nul))
  typed = tmp_path / 'typed.spec'
  typed.write_text('[a]\ntotal_rounds = 2, ten\n')
  with pytest.raises(sweep.SpecError, match=f"{typed}:2: --total_rounds='ten' is not a valid int"):
    sweep.parse_spec_file(str(typed))
  with pytest.raises(sweep.SpecError, match="--grid group 1: --client_learning_rate='x'"):
    sweep.parse_grid('client_learning_rate=0.1,x')
  with pytest.raises(sweep.SpecError, match="--fixed: --total_rounds='abc' is not a valid int"):
    sweep.parse_fixed('total_rounds=abc')
  with pytest.raises(sweep.SpecError, match="--partition='rows'"):
    sweep.parse_fixed('partition=rows')


@pytest.mark.parametrize('case', ['sweep dir is a file', 'binary spec', 'grid value'])
def test_bin_sweep_refuses_in_one_line_before_writing(tmp_path, case):
  sweep_dir = tmp_path / 'sweep'
  args = [f'--sweep_dir={sweep_dir}', '--grid=task=digits;total_rounds=1']
  if case == 'sweep dir is a file':
    sweep_dir.write_text('a file')
  elif case == 'binary spec':
    (tmp_path / 'spec').write_bytes(b'\x80\x81\0' * 30)
    args = [f'--sweep_dir={sweep_dir}', f'--spec={tmp_path / "spec"}']
  else:
    args = [f'--sweep_dir={sweep_dir}', '--grid=task=digits;total_rounds=2,x']
  before = _snapshot(tmp_path)
  out = subprocess.run([sys.executable, os.path.join(REPO, 'bin', 'sweep.py'), *args],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 2 and len(lines) == 1 and 'error' in lines[0], lines
  assert {'sweep dir is a file': '--sweep_dir', 'binary spec': 'not a text file',
          'grid value': "--total_rounds='x'"}[case] in lines[0]
  assert _snapshot(tmp_path) == before
