"""bin/train: flag validation, resume after interruption, divergence.

The binary runs as a subprocess where the process is what is tested (exit
statuses of refused commands, Ctrl-C); the runs around it go through
`train_config.train`, the same command line in this process.
"""

import asyncio
import csv
import gc
import json
import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import train_config  # pylint: disable=g-bad-import-order

from workflow import errors
from workflow.flags import config
from workflow.flags import validation
from workflow.training import cli

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, 'bin', 'train.py')
SMALL = ['--task=digits', '--num_clients=8', '--clients_per_round=4', '--client_batch_size=20',
         '--rounds_per_eval=2', '--rounds_per_checkpoint=2', '--show_progress=false',
         '--cohort_mode=sequential']  # not the execution's test: the cheaper trace (train_config)


def _train(args, **kwargs):
  return subprocess.run([sys.executable, TRAIN, *args], capture_output=True, text=True,
                        timeout=300, **kwargs)


@pytest.mark.parametrize('args, flag', [
    (['--task=imagenet'], '--task'),
    (['--algorithm=sgd'], '--algorithm'),
    (['--algorithm=fedavg', '--client_optimizer=adam'], '--client_optimizer'),
    (['--clients_per_round=0'], '--clients_per_round'),
    (['--client_learning_rate=-0.1'], '--client_learning_rate'),
    (['--server_learning_rate=nan'], '--server_learning_rate'),
    (['--partition=random'], '--partition'),
    # fedgbo's default K = 10 applies unless --local_steps is given: 0 contradicts it.
    (['--algorithm=fedgbo', '--client_optimizer=adam', '--local_steps=0'], '--local_steps'),
    (['--client_beta_1=1.0'], '--client_beta_1'),
    (['--client_epsilon=0'], '--client_epsilon'),
])
def test_bad_flags_exit_2_with_one_line(tmp_path, args, flag):
  result = _train([*args, f'--root_output_dir={tmp_path}/out'])
  assert result.returncode == 2, result.stderr[-2000:]
  lines = [l for l in result.stderr.strip().splitlines() if l.strip()]
  assert len(lines) == 1, result.stderr
  assert flag in lines[0] and 'error' in lines[0]
  assert not os.path.exists(tmp_path / 'out')  # nothing half-written


# A user's task module as users write them: it imports TFF, whose import sets
# TFF's default context (a ServiceManager that prints "Exception ignored in ...
# __del__" at teardown unless bin/train's exit handler disarms it). bin/train
# imports it while checking its flags, before main().
_TASK_MODULE = """
import os
import signal
import time

import tensorflow_federated  # pylint: disable=unused-import

from tests import custom_task_fixture

if os.environ.get('TASK_MODULE_READY'):  # a slow import, for Ctrl-C while bin/train starts
  open(os.environ['TASK_MODULE_READY'], 'w').close()
  time.sleep(120)


def raises():
  raise RuntimeError('the task function failed')


def wrong_type():
  return 42


class _Dropped:
  def __del__(self):
    # The handler runs inside __del__, where Python swallows what it raises.
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)


def interrupted_in_del(batch_size, seed):
  _Dropped()
  return custom_task_fixture.make_task(batch_size, seed)
"""


def _train_task_module(tmp_path, function, *args, **env):
  (tmp_path / 'code').mkdir(exist_ok=True)
  (tmp_path / 'code' / 'user_task_module.py').write_text(_TASK_MODULE)
  return [sys.executable, TRAIN, *SMALL, f'--task=user_task_module:{function}',
          '--num_clients=0', '--total_rounds=2', f'--root_output_dir={tmp_path}/out', *args], dict(
              os.environ, PYTHONPATH=str(tmp_path / 'code'), **env)


@pytest.mark.parametrize('function, needle', [('no_such_function', 'has no function'),
                                              ('raises', 'raised RuntimeError'),
                                              ('wrong_type', 'returned int')])
def test_a_refused_task_function_is_one_line_on_stderr_and_exit_2(tmp_path, function, needle):
  command, env = _train_task_module(tmp_path, function)
  result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
  assert result.returncode == 2, result.stderr[-3000:]
  lines = result.stderr.splitlines()
  assert len(lines) == 1, result.stderr  # nothing at exit: no "Exception ignored in"
  assert lines[0].startswith(f'train.py: error: --task=user_task_module:{function}')
  assert needle in lines[0], lines
  assert not os.path.exists(tmp_path / 'out')


def test_ctrl_c_while_the_task_module_loads_is_one_line(tmp_path):
  ready = tmp_path / 'ready'
  command, env = _train_task_module(tmp_path, 'raises', TASK_MODULE_READY=str(ready))
  # SIGINT's default action, whatever the suite inherited: a shell starts a
  # background job (`make test &`) with SIGINT ignored, which exec keeps.
  proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  deadline = time.time() + 240
  while not ready.exists() and proc.poll() is None and time.time() < deadline:
    time.sleep(0.05)
  proc.send_signal(signal.SIGINT)
  # A bound, not a timing: the stop shuts TFF's context down, which took over
  # 60 s under a loaded suite (-n 3 on 2 cores).
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 130, err[-3000:]
  assert err.splitlines() == ['SIGINT: stopped before the first round; resume with the same '
                              'command'], err


def test_ctrl_c_that_python_swallows_still_stops_the_run_in_one_line(tmp_path):
  """A signal handled inside a __del__ (or a weakref callback): Python prints
  "Exception ignored in" and goes on unless the run keeps and acts on it."""
  command, env = _train_task_module(tmp_path, 'interrupted_in_del')
  result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
  assert result.returncode == 130, result.stderr[-3000:]
  lines = result.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith('SIGINT: stopped before its first round'), lines
  assert not os.path.exists(tmp_path / 'out' / 'user_task_module_fedavg' / 'metrics.csv')


def test_unwritable_output_dir(tmp_path):
  blocker = tmp_path / 'file'
  blocker.write_text('not a directory')
  result = _train([*SMALL, '--total_rounds=1', f'--root_output_dir={blocker}/sub'])
  assert result.returncode == 2
  assert '--root_output_dir' in result.stderr.strip().splitlines()[-1]


def _read_csv(path):
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def _array_conversion_error(interrupted):
  return SystemError('<built-in method __array__ of numpy.ndarray object> returned a result '
                     'with an exception set')


def _summary_write_error(interrupted):
  del interrupted
  return TypeError('Expected `context` argument in EagerTensor constructor')


# How a handler's Interrupted raised inside C code came back (both seen in the
# suite's Ctrl-C tests): a SystemError caused by it (a metric finalizer's tensor
# conversion), and a TypeError with no cause or context (a TensorBoard summary write).
@pytest.mark.parametrize('c_error, caused', [(_array_conversion_error, True),
                                             (_summary_write_error, False)])
def test_a_signal_a_c_call_reports_as_another_error_still_stops_the_run(
    tmp_path, monkeypatch, c_error, caused):
  """The delivered signal decides: exit 130 and one line. The same error with no
  signal delivered in the run is an ordinary failure."""
  runs = []

  def fails(settings, status, notes=()):
    del settings, status, notes
    runs.append(1)
    if len(runs) > 1:  # the second run: no signal
      raise c_error(None)
    try:
      cli._raise_interrupted(signal.SIGINT, None)  # what the installed handler does
    except KeyboardInterrupt as e:
      interrupted = e  # swallowed by C code, which raises its own error instead
    if caused:
      raise c_error(interrupted) from interrupted
    raise c_error(interrupted)

  monkeypatch.setattr(cli, '_run_training', fails)
  code, output = train_config.train([*SMALL, f'--root_output_dir={tmp_path}'])
  assert code == 130, output[-2000:]
  lines = [line for line in output.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith('SIGINT: stopped'), lines
  assert 'Traceback' not in output and 'Error' not in output, output
  with pytest.raises(type(c_error(None))):
    cli.run_training(*cli.config_from_args([*SMALL, f'--root_output_dir={tmp_path}/b']))


def test_a_stop_stays_the_last_line_with_tasks_in_flight(monkeypatch, caplog):
  # A signal can land while TFF materialises a value: its asyncio task is left
  # pending, and asyncio reports it when it is destroyed (at teardown, after
  # the stop's line, which then is no longer the last).
  monkeypatch.setattr(signal, 'signal', lambda *args: None)  # keep pytest's handlers
  asyncio_log = logging.getLogger('asyncio')
  monkeypatch.setattr(asyncio_log, 'filters', list(asyncio_log.filters))
  loop = asyncio.new_event_loop()
  loop.create_task(asyncio.sleep(60))
  loop.run_until_complete(asyncio.sleep(0))  # the task starts: in flight, never finished
  stop = cli._stopped(signal.SIGINT, None, None)
  assert stop.exit_code == 130
  loop.close()  # drops the task: destroyed while pending
  gc.collect()
  assert not [r for r in caplog.records if r.name == 'asyncio'], caplog.text
  asyncio_log.error('another asyncio error')  # still reported after a stop
  assert [r.getMessage() for r in caplog.records if r.name == 'asyncio'] == [
      'another asyncio error']


# A server optimiser's state, and clients' states stored beside the checkpoint. Every
# other algorithm's state is restored by the same code, the structure of its
# initialize() (test_state_structure.py checks each round keeps it).
@pytest.mark.parametrize('algorithm', ['fedadam', 'scaffold'])
def test_interrupted_run_resumes_to_identical_result(tmp_path, algorithm):
  args = [*SMALL, '--total_rounds=8', f'--algorithm={algorithm}', '--client_learning_rate=0.05',
          f'--experiment_name=digits_{algorithm}',
          '--server_learning_rate=0.02' if algorithm == 'fedadam' else '--local_steps=3',
          '--client_optimizer=sgd']
  code, output = train_config.train([*args, f'--root_output_dir={tmp_path}/whole'])
  assert code == 0, output[-3000:]

  cut_args = [*args, f'--root_output_dir={tmp_path}/cut']
  proc = subprocess.Popen([sys.executable, TRAIN, *cut_args], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
  marker = tmp_path / 'cut' / f'digits_{algorithm}' / 'checkpoints' / 'program_state_4'
  deadline = time.time() + 240
  while not marker.exists() and proc.poll() is None and time.time() < deadline:
    time.sleep(0.05)
  assert proc.poll() is None, 'run finished before it could be interrupted'
  proc.send_signal(signal.SIGINT)  # Ctrl-C
  _, err = proc.communicate(timeout=60)
  # One line, no traceback (docs/reliability.md), exit 128 + SIGINT.
  assert proc.returncode == 130, err[-3000:]
  assert 'Traceback' not in err
  last = err.strip().splitlines()[-1]
  assert last.startswith('SIGINT: stopped at round ') and last.endswith(
      'resume with the same command'), last
  code, output = train_config.train(cut_args)
  assert code == 0, output[-3000:]
  assert 'Resuming from the checkpoint after round' in output

  v1, w1 = train_config.final_checkpoint(tmp_path / 'whole' / f'digits_{algorithm}')
  v2, w2 = train_config.final_checkpoint(tmp_path / 'cut' / f'digits_{algorithm}')
  assert v1 == v2 == 8
  assert len(w1) == len(w2)
  for a, b in zip(w1, w2):
    if a.dtype.kind in 'OSU':  # the round-schedule driver's JSON state
      assert a == b
    else:
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  rows1 = _read_csv(tmp_path / 'whole' / f'digits_{algorithm}' / 'metrics.csv')
  rows2 = _read_csv(tmp_path / 'cut' / f'digits_{algorithm}' / 'metrics.csv')
  assert [r['round'] for r in rows2] == [str(i) for i in range(1, 9)]  # no lost/duplicated rows
  for r1, r2 in zip(rows1, rows2):
    for key in r1:
      if key not in ('round_seconds', 'eval_seconds') and r1[key]:
        assert float(r1[key]) == pytest.approx(float(r2[key]), rel=1e-5, abs=1e-6), key


def test_resume_with_contradicting_flags_is_refused(tmp_path):
  # Only with a shared --experiment_name: by default the names differ (test_train_workflow).
  out = f'--root_output_dir={tmp_path}'
  code, output = train_config.train([*SMALL, '--total_rounds=1', out, '--experiment_name=same'])
  assert code == 0, output[-2000:]
  code, output = train_config.train([*SMALL, '--total_rounds=2', '--client_learning_rate=0.5',
                                     out, '--experiment_name=same'])
  assert code == 2
  assert '--client_learning_rate' in output.strip().splitlines()[-1]


def test_run_resumes_under_the_other_execution(tmp_path):
  """--execution and the cohort's XLA choice say how a round runs, not what it
  computes: a per-client run resumes as a cohort with XLA over the program."""
  out = f'--root_output_dir={tmp_path}'
  small = [*SMALL, '--local_steps=2', '--experiment_name=switch', out]
  code, output = train_config.train([*small, '--total_rounds=2', '--execution=per_client'])
  assert code == 0, output[-2000:]
  code, output = train_config.train([*small, '--total_rounds=3', '--execution=cohort',
                                     '--cohort_mode=auto', '--cohort_jit_compile=program',
                                     '--show_progress=true'])
  assert code == 0, output[-2000:]
  assert 'Resuming from the checkpoint after round 2' in output
  assert 'execution: cohort (one compiled program per round, clients vectorised, XLA over ' \
      'the program)' in output
  assert len(_read_csv(tmp_path / 'switch' / 'metrics.csv')) == 3


def test_scaffold_resumes_as_a_cohort_with_the_stored_client_controls(tmp_path):
  """SCAFFOLD's c_i live in the client-state store, whichever execution wrote
  them: 2 rounds per client, then 2 as a cohort equal 4 rounds per client (4 of
  8 clients a round: clients return with their c_i)."""
  small = [*SMALL, '--algorithm=scaffold', '--local_steps=3', '--client_learning_rate=0.05',
           '--experiment_name=scaffold']
  code, output = train_config.train([*small, '--total_rounds=4', '--execution=per_client',
                                     f'--root_output_dir={tmp_path}/whole'])
  assert code == 0, output[-2000:]
  cut = [*small, f'--root_output_dir={tmp_path}/cut']
  code, output = train_config.train([*cut, '--total_rounds=2', '--execution=per_client'])
  assert code == 0, output[-2000:]
  # --execution=cohort: the default
  code, output = train_config.train([*cut, '--total_rounds=4', '--show_progress=true'])
  assert code == 0, output[-2000:]
  assert 'execution: cohort' in output
  v1, w1 = train_config.final_checkpoint(tmp_path / 'whole' / 'scaffold')
  v2, w2 = train_config.final_checkpoint(tmp_path / 'cut' / 'scaffold')
  assert v1 == v2 == 4
  for a, b in zip(w1, w2):
    if a.dtype.kind not in 'OSU':
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  rows1 = _read_csv(tmp_path / 'whole' / 'scaffold' / 'metrics.csv')
  rows2 = _read_csv(tmp_path / 'cut' / 'scaffold' / 'metrics.csv')
  key = 'train/client_work/train/loss'
  assert [float(r[key]) for r in rows1] == pytest.approx([float(r[key]) for r in rows2], rel=1e-5)


def test_run_from_before_a_flag_existed_resumes_at_that_flags_default(tmp_path):
  out = f'--root_output_dir={tmp_path}'
  small = [*SMALL, '--experiment_name=digits_fedavg']
  code, output = train_config.train([*small, '--total_rounds=1', out])
  assert code == 0, output[-2000:]
  flags_path = tmp_path / 'digits_fedavg' / 'flags.json'

  def drop(*names):  # as written by a version of bin/train without these flags
    saved = json.loads(flags_path.read_text())
    for name in names:
      del saved[name]
    flags_path.write_text(json.dumps(saved))

  drop('upload_mbps', 'fedmax_beta')
  code, output = train_config.train([*small, '--total_rounds=2', out])
  assert code == 0, output[-2000:]
  assert 'Resuming from the checkpoint after round 1' in output
  drop('fedmax_beta')
  code, output = train_config.train([*small, '--total_rounds=3', '--fedmax_beta=2.0', out])
  assert code == 2
  assert '--fedmax_beta' in output.strip().splitlines()[-1]


def test_divergence_stops_with_message_and_keeps_last_checkpoint(tmp_path):
  code, output = train_config.train([
      *SMALL, '--total_rounds=6', '--rounds_per_checkpoint=1', '--experiment_name=digits_fedavgm',
      '--algorithm=fedavgm', '--server_learning_rate=1e30', '--client_learning_rate=1.0',
      f'--root_output_dir={tmp_path}'])
  assert code == 1
  message = output.strip().splitlines()[-1]
  assert 'diverged at round' in message and 'learning_rate' in message
  diverged_round = int(message.split('diverged at round ')[1].split()[0])
  checkpoints = os.listdir(tmp_path / 'digits_fedavgm' / 'checkpoints')
  assert f'program_state_{diverged_round}' not in checkpoints
  assert f'program_state_{diverged_round - 1}' in checkpoints or diverged_round == 1


def test_validate_accepts_defaults():
  base = dict(task='digits', algorithm='fedavg', client_optimizer='sgd', clients_per_round=10,
              client_learning_rate=0.1, server_learning_rate=1.0)
  validation.validate(config.from_flags(base))
  with pytest.raises(errors.UsageError, match='--clients_per_round'):
    validation.validate(config.from_flags({**base, 'clients_per_round': -3}))
