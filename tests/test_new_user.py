"""What a new user meets first: a quiet demo, one-line refusals, messages that name the cause.

The demo's plotting step and programs that use the library print no TensorFlow C++
log line and nothing at interpreter exit; bin/sweep refuses a bad spec or output path
in one line before writing; bin/train and bin/sweep refuse flagfiles that include
themselves; NaN or inf in a client's training data is named, with the client, before
the learning-rate advice. Small in-process runs; a subprocess only where the exit
code or what a fresh interpreter prints at exit is the point.
"""

import contextlib
import io
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import train_config  # pylint: disable=g-bad-import-order
from tests import custom_task_fixture
from tests import nan_task_fixture
from workflow import errors
from workflow.training import cli
from workflow.training import data_checks

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What TensorFlow's C++ logging prints at start-up (oneDNN, CUDA stubs, cuDNN/cuFFT/
# cuBLAS registration, TensorRT), matched case-insensitively.
TF_LOG_WORDS = ('cuda', 'tensorrt', 'onednn', 'unable to register', 'cpu_feature_guard')


def _env(**extra):
  """The environment of a user who set nothing: no TF_CPP_MIN_LOG_LEVEL."""
  env = {k: v for k, v in os.environ.items() if k != 'TF_CPP_MIN_LOG_LEVEL'}
  return dict(env, PYTHONPATH=ROOT, **extra)


def _noise(stderr: str) -> list[str]:
  return [l for l in stderr.splitlines()
          if 'Traceback' in l or 'Exception ignored' in l
          or any(w in l.lower() for w in TF_LOG_WORDS)]


_train = train_config.train_settings


def _snapshot(path):
  return sorted((os.path.relpath(os.path.join(w, n), path), os.lstat(os.path.join(w, n)).st_mtime_ns)
                for w, dirs, files in os.walk(path) for n in dirs + files)


# ---- the demo's plotting step, and programs that import TFF ----

def test_the_demos_plotting_step_prints_no_log_noise_and_nothing_at_exit(tmp_path):
  runs = []
  for algorithm in ('fedavg', 'fedadam'):
    settings = train_config.small_run(tmp_path, f'digits_{algorithm}', algorithm=algorithm,
                                      num_clients=4, clients_per_round=2, total_rounds=1,
                                      rounds_per_eval=1, rounds_per_checkpoint=1)
    code, lines = _train(settings)
    assert code == 0, lines
    runs.append(str(tmp_path / f'digits_{algorithm}'))
  out = tmp_path / 'digits_fedavg_vs_fedadam.png'
  result = subprocess.run([sys.executable, os.path.join(ROOT, 'bin', 'plot.py'),
                           f'--runs={",".join(runs)}', f'--out={out}'],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=_env())
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == str(out) and out.stat().st_size > 0
  assert not _noise(result.stderr), result.stderr
  assert not result.stderr.strip(), result.stderr


# Imports that create TFF's default context (a ServiceManager), as bin/ entries and
# user scripts do; TFF's own teardown then prints "Exception ignored ... 'Popen'".
_IMPORTS = textwrap.dedent('''
    from tff_adaptive.execution import runtime
    {call}
    from tasks import registry
    from tff_adaptive.algorithms import composer, fedopt
    print('imported', flush=True)
''')


@pytest.mark.parametrize('call', ['', 'runtime.shut_down_tff_at_exit()'])
def test_a_program_that_imported_tff_exits_quietly_only_when_asked(call):
  """The control (no call) shows the noise is TFF's own and this test can fail."""
  result = subprocess.run([sys.executable, '-c', _IMPORTS.format(call=call)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=_env(
                              TF_CPP_MIN_LOG_LEVEL='3'))
  assert result.returncode == 0 and 'imported' in result.stdout, result.stderr
  if call:
    assert not _noise(result.stderr), result.stderr
  else:
    assert "'NoneType' object has no attribute 'Popen'" in result.stderr, result.stderr


_LIBRARY_SCRIPT = textwrap.dedent('''
    import collections
    import numpy as np
    import tensorflow as tf
    import tensorflow_federated as tff
    from tff_adaptive.algorithms import fedopt
    from tff_adaptive.execution import runtime

    runtime.use_local_cpp_context()
    def model_fn():
      keras = tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(4,)),
                                   tf.keras.layers.Dense(2)])
      return tff.learning.models.from_keras_model(
          keras, input_spec=(tf.TensorSpec([None, 4], tf.float32), tf.TensorSpec([None], tf.int32)),
          loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    data = [tf.data.Dataset.from_tensor_slices((rng.normal(size=(8, 4)).astype(np.float32),
                                                rng.integers(0, 2, 8).astype(np.int32))).batch(4)
            for _ in range(2)]
    process = fedopt.build_fedopt(model_fn, tff.learning.optimizers.build_sgdm(0.1),
                                  tff.learning.optimizers.build_adam(0.01))
    state = process.initialize()
    for _ in range(2):
      state, metrics = process.next(state, data)
    print('WORKERS', *runtime.live_workers(), flush=True)
''')


def test_a_library_script_with_the_runtime_helpers_exits_quietly_and_stops_its_worker():
  result = subprocess.run([sys.executable, '-c', _LIBRARY_SCRIPT], capture_output=True,
                          text=True, timeout=600, cwd=ROOT, env=_env(TF_CPP_MIN_LOG_LEVEL='3'))
  assert result.returncode == 0, result.stderr[-3000:]
  pids = [int(p) for p in next(l for l in result.stdout.splitlines()
                               if l.startswith('WORKERS')).split()[1:]]
  assert pids, result.stdout  # the rounds ran on a worker the package started ...
  assert not any(os.path.exists(f'/proc/{p}') and 'worker_binary' in
                 open(f'/proc/{p}/cmdline', 'rb').read().decode(errors='replace') for p in pids)
  assert not _noise(result.stderr), result.stderr  # ... and stopped before exit, quietly


# ---- bin/sweep: bad specs and output paths ----

def _unwritable_dir(tmp_path):
  """A directory this process cannot write (root writes through modes: a sysfs one)."""
  if os.geteuid() != 0:
    path = tmp_path / 'read_only'
    path.mkdir()
    path.chmod(0o555)
    return str(path)
  if not os.path.isdir('/sys/kernel'):
    pytest.skip('running as root without /sys: no directory root cannot write')
  return '/sys/kernel'


@pytest.mark.parametrize('case', ['empty spec', 'sweep dir under a file', 'unwritable sweep dir',
                                  'unwritable parent'])
def test_bin_sweep_refuses_a_bad_spec_or_path_in_one_line_writing_nothing(tmp_path, case):
  grid = '--grid=task=digits;total_rounds=1'
  sweep_dir = str(tmp_path / 'sweep')
  if case == 'empty spec':
    (tmp_path / 'empty.spec').write_text('')
    args, named = [f'--sweep_dir={sweep_dir}', f'--spec={tmp_path / "empty.spec"}'], 'empty.spec'
  elif case == 'sweep dir under a file':
    (tmp_path / 'a_file').write_text('x')
    sweep_dir = str(tmp_path / 'a_file' / 'sub')
    args, named = [f'--sweep_dir={sweep_dir}', grid], f'{tmp_path / "a_file"} is not a directory'
  elif case == 'unwritable sweep dir':
    sweep_dir = _unwritable_dir(tmp_path)
    args, named = [f'--sweep_dir={sweep_dir}', grid], f'--sweep_dir={sweep_dir}'
  else:
    sweep_dir = os.path.join(_unwritable_dir(tmp_path), 'sub')
    args, named = [f'--sweep_dir={sweep_dir}', grid], f'--sweep_dir={sweep_dir}'
  before = _snapshot(tmp_path)
  result = subprocess.run([sys.executable, os.path.join(ROOT, 'bin', 'sweep.py'), *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=_env())
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 2 and len(lines) == 1, result.stderr
  assert lines[0].startswith('sweep: error:') and named in lines[0], lines
  assert _snapshot(tmp_path) == before
  assert not os.path.exists(os.path.join(sweep_dir, 'sweep.json'))


def test_trials_of_a_relative_sweep_dir_write_where_bin_sweep_was_started(tmp_path, monkeypatch):
  from workflow.sweeps import sweep  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(tmp_path)  # not the repository, where the trials run
  trial = sweep.expand(sweep.parse_grid('total_rounds=1'), [0], {})[0]
  argv = sweep.trial_argv('runs/sw', trial, {}, ['train'])
  assert f'--root_output_dir={tmp_path / "runs" / "sw" / "trials"}' in argv, argv


# ---- flagfiles that include themselves ----

def _flagfiles(tmp_path):
  (tmp_path / 'self.flags').write_text(f'--total_rounds=2\n--flagfile={tmp_path / "self.flags"}\n')
  (tmp_path / 'a.flags').write_text('--flagfile=b.flags\n')
  (tmp_path / 'b.flags').write_text('# b includes a back, spelt differently\n--flagfile=./a.flags\n')
  (tmp_path / 'c.flags').write_text('--total_rounds=1\n')
  (tmp_path / 'diamond.flags').write_text('--flagfile=c.flags\n--flagfile=./c.flags\n')


def test_flagfile_cycles_are_found_and_repeated_includes_are_not(tmp_path, monkeypatch):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from workflow.flags import train_flags  # pylint: disable=g-import-not-at-top
  _flagfiles(tmp_path)
  monkeypatch.chdir(tmp_path)  # absl reads included names from the working directory
  values = flags.FlagValues()
  train_flags.define_flags(values)
  for args, chain in ((['--flagfile=self.flags'], 'self.flags -> '),
                      (['--flagfile', 'a.flags'], 'a.flags -> b.flags -> ./a.flags')):
    with pytest.raises(errors.UsageError) as raised:
      cli.parse_flags(['train.py', *args], values)
    message = str(raised.value)
    assert chain in message and 'include itself' in message and '\n' not in message, message
    assert raised.value.exit_code == 2
  # Including one file twice (no cycle) is absl's business: accepted.
  cli.parse_flags(['train.py', '--flagfile=diamond.flags'], values)
  assert values['total_rounds'].value == 1


@pytest.mark.parametrize('binary', ['train.py', 'sweep.py', 'plot.py', 'report.py'])
def test_binaries_refuse_a_cyclic_flagfile_in_one_line(tmp_path, binary):
  _flagfiles(tmp_path)
  result = subprocess.run([sys.executable, os.path.join(ROOT, 'bin', binary), '--flagfile=a.flags'],
                          capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                          env=_env())
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 2 and len(lines) == 1, result.stderr
  assert 'a.flags -> b.flags -> ./a.flags' in lines[0], lines
  assert sorted(os.listdir(tmp_path)) == ['a.flags', 'b.flags', 'c.flags', 'diamond.flags',
                                          'self.flags']


# ---- progress in a log ----

def test_a_log_gets_one_line_per_evaluation_and_no_redrawn_bar(tmp_path):
  """stderr here is not a terminal (as in `make demo > log`): no carriage returns."""
  settings = train_config.small_run(tmp_path, 'log', total_rounds=2, rounds_per_eval=1,
                                    rounds_per_checkpoint=2, show_progress=True)
  err = io.StringIO()
  with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
    cli.run_training(settings)
  text = err.getvalue()
  assert '\r' not in text, repr(text[-500:])
  rounds = [l.split()[1] for l in text.splitlines() if l.startswith('round ')]
  assert rounds == ['1/2', '2/2'], text


# ---- NaN or inf in the training data ----

def test_non_finite_training_data_is_found_per_client():
  poisoned = nan_task_fixture.nan_train_data(batch_size=8, seed=0)
  clean = custom_task_fixture.make_task(batch_size=8, seed=0)
  ids = list(poisoned.train_data.client_ids)
  found = data_checks.non_finite_client(poisoned, ids)
  assert found and "'user_2'" in found and 'NaN and inf in x' in found, found
  assert data_checks.non_finite_client(poisoned, [i for i in ids if i != 'user_2']) is None
  assert data_checks.non_finite_client(clean, ids) is None


def test_a_first_round_diverged_by_nan_data_names_the_client_before_the_learning_rate(tmp_path):
  settings = train_config.small_run(tmp_path, 'nan_data', task='tests.nan_task_fixture:nan_train_data',
                                    num_clients=0, clients_per_round=4, total_rounds=1,
                                    rounds_per_eval=1, rounds_per_checkpoint=1)
  code, lines = _train(settings)
  assert code != 0, lines
  message = lines[-1]
  assert 'training diverged at round 1' in message, lines
  assert "the training data of client 'user_2' holds NaN and inf in x" in message, message
  assert 'a data problem' in message, message
  assert message.index("'user_2'") < message.index('--client_learning_rate'), message
  assert not any('Traceback' in l for l in lines), lines
