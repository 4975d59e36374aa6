"""Training on TFF workers: same results as local, clear faults, exact resume, no leftovers.

Two `worker_binary` processes on loopback ports stand in for two machines.
"""

import csv
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse

import numpy as np
import portpicker
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl

import processes  # pylint: disable=g-bad-import-order
import train_config  # pylint: disable=g-bad-import-order

from tasks import digits
from workflow import errors
from workflow.training import cli
from workflow.training import program
from tff_adaptive.execution import data_on_workers
from tff_adaptive.execution import remote_context
from tff_adaptive.execution import runtime
from tff_adaptive.execution import worker_process
from tff_adaptive.algorithms import fedgbo
from tff_adaptive.algorithms import fedopt

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, 'bin', 'worker.py')
ROUNDS = 3
CLIENTS_PER_ROUND = 5  # odd: the two workers get unequal shares (3 + 2)


@pytest.fixture(scope='module')
def pool():
  """Two workers for the module; restored to two live workers after each test."""
  started = worker_process.start_local_workers(2)
  previous = context_stack_impl.context_stack.current
  yield started
  context_stack_impl.context_stack.set_default_context(previous)
  worker_process.stop_workers(started)
  assert processes.gone([w.pid for w in started])


@pytest.fixture
def live_pool(pool):
  for worker in pool:
    if worker.poll() is not None:
      worker.start()
  yield pool
  for worker in pool:
    if worker.poll() is not None:
      worker.start()


@pytest.fixture(scope='module')
def task():
  return digits.create_task(num_clients=8)


def _run_rounds(process, task, context, rounds=ROUNDS, data_fn=None):
  """Weights after `rounds` rounds of `process` under `context`."""
  data_fn = data_fn or (lambda ids: program.client_datasets(task, ids, None))
  ids = list(task.train_data.client_ids)
  with context_stack_impl.context_stack.install(context):
    state = process.initialize()
    for round_num in range(1, rounds + 1):
      sampled = program.sample_clients(ids, CLIENTS_PER_ROUND, 7, round_num)
      state = process.next(state, data_fn(sampled)).state
    weights = process.get_model_weights(state)
  return [np.asarray(w) for w in weights.trainable]


def _local_context():
  runtime._install_process_hooks()  # pylint: disable=protected-access
  return tff.backends.native.create_sync_local_cpp_execution_context()


def _assert_close(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


BUILDERS = {
    'fedavg': lambda task: fedopt.build_fedopt(
        task.model_fn, tff.learning.optimizers.build_sgdm(0.1),
        tff.learning.optimizers.build_sgdm(1.0)),
    'fedgbo': lambda task: fedgbo.build_fedgbo(
        task.model_fn, tff.learning.optimizers.build_adam(0.05, beta_2=0.99, epsilon=1e-8),
        local_steps=3),
}


_LOCAL = {}


def _local_weights(algorithm: str, task) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """(initial, after ROUNDS rounds) weights of `algorithm` run locally; computed once."""
  if algorithm not in _LOCAL:
    process = BUILDERS[algorithm](task)
    context = _local_context()
    _LOCAL[algorithm] = (_run_rounds(process, task, context, rounds=0),
                         _run_rounds(process, task, context))
  return _LOCAL[algorithm]


@pytest.mark.parametrize('algorithm', sorted(BUILDERS))
def test_two_workers_match_local_execution(live_pool, task, algorithm):
  initial, local = _local_weights(algorithm, task)
  remote = _run_rounds(BUILDERS[algorithm](task), task, remote_context.create_workers_context(
      [w.address for w in live_pool]))
  _assert_close(remote, local)
  # Not trivially equal: training moved the weights well beyond the tolerance.
  assert max(np.max(np.abs(l - i)) for l, i in zip(local, initial)) > 1e-2


def test_data_built_on_workers_matches_data_sent(live_pool, task):
  # TFF's FedAvg does not run K steps itself (no `local_steps` in its client_work state), so
  # K goes into the data, as program.client_datasets does. (The composer's
  # processes, which take K from their state, get ids in the resume test.)
  process = tff.learning.algorithms.build_weighted_fed_avg(
      task.model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1))
  composed, data_steps = data_on_workers.compose_data_on_workers(process, task, local_steps=2)
  assert data_steps == 2
  assert data_on_workers.compose_data_on_workers(BUILDERS['fedgbo'](task), task, 3)[1] is None
  assert composed.next.type_signature.parameter[1].member == tff.TensorType(np.str_)
  context = remote_context.create_workers_context([w.address for w in live_pool])
  sent = _run_rounds(process, task, context, rounds=2,
                     data_fn=lambda ids: program.client_datasets(task, ids, 2))
  built = _run_rounds(composed, task, context, rounds=2,
                      data_fn=lambda ids: data_on_workers.client_ids_fn(2)(ids, 2))
  _assert_close(built, sent)
  with pytest.raises(ValueError, match='built for 2 local steps'):
    data_on_workers.client_ids_fn(2)(['a'], None)


def test_data_built_in_computation_follows_trainer_global_seed(task):
  # tf.random.set_seed changes eager (trainer-built) shuffles but not those
  # built inside a TFF computation unless the composition carries it over.
  process = tff.learning.algorithms.build_weighted_fed_avg(
      task.model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1))
  tf.random.set_seed(9)
  composed, _ = data_on_workers.compose_data_on_workers(process, task, local_steps=2)
  context = _local_context()
  sent = _run_rounds(process, task, context, rounds=1,
                     data_fn=lambda ids: program.client_datasets(task, ids, 2))
  built = _run_rounds(composed, task, context, rounds=1,
                      data_fn=lambda ids: data_on_workers.client_ids_fn(2)(ids, 2))
  _assert_close(built, sent)


def test_unreachable_worker_is_named(live_pool, tmp_path, capsys, monkeypatch):
  dead = f'localhost:{portpicker.pick_unused_port()}'
  started = time.monotonic()
  with pytest.raises(worker_process.WorkerUnreachableError, match=dead) as raised:
    remote_context.create_workers_context([live_pool[0].address, dead], connect_timeout=1.0)
  assert raised.value.address == dead
  assert live_pool[0].address not in str(raised.value)
  assert time.monotonic() - started < 5
  # bin/train: one line naming it, exit 1, before building anything.
  monkeypatch.setattr(remote_context, 'create_workers_context',
                      functools.partial(remote_context.create_workers_context, connect_timeout=1.0))
  with pytest.raises(errors.RunFailed) as raised:
    cli.run_training(_train_settings(tmp_path, 'unreachable', workers=dead))
  assert errors.report(raised.value) == 1  # what bin/train prints, its exit status
  err = capsys.readouterr().err
  assert f'error: TFF worker {dead} not reachable' in err
  assert 'Traceback' not in err
  assert not os.path.exists(tmp_path / 'unreachable')


def _train_settings(tmp_path, name, **overrides):
  return train_config.small_run(tmp_path, name, **{
      'num_clients': 8, 'clients_per_round': CLIENTS_PER_ROUND, 'total_rounds': 6,
      'rounds_per_eval': 3, 'rounds_per_checkpoint': 2, **overrides})


def _rounds(path):
  with open(path, newline='') as f:
    return [int(r['round']) for r in csv.DictReader(f)]


def _kill_after_round(worker, metrics_csv, round_num):
  """Kills `worker` (SIGKILL, as a crash) once `round_num` is in `metrics_csv`."""

  def watch():
    while True:
      try:
        if round_num in _rounds(metrics_csv):
          worker.kill()
          return
      except (OSError, KeyError, ValueError):
        pass
      time.sleep(0.02)

  thread = threading.Thread(target=watch, daemon=True)
  thread.start()
  return thread


def test_killed_worker_fails_round_and_rerun_resumes_exactly(live_pool, tmp_path, capsys):
  addresses = ','.join(w.address for w in live_pool)
  reference, _ = cli.run_training(_train_settings(tmp_path, 'reference', workers=addresses))
  capsys.readouterr()

  settings = _train_settings(tmp_path, 'crashed', workers=addresses, data_on_workers=True)
  metrics = tmp_path / 'crashed' / 'metrics.csv'
  watcher = _kill_after_round(live_pool[1], metrics, 3)
  with pytest.raises(errors.RunFailed) as raised:
    cli.run_training(settings)
  watcher.join(5)
  assert errors.report(raised.value) == 1  # what bin/train prints, its exit status
  err = capsys.readouterr().err
  assert f'error: lost TFF worker {live_pool[1].address}' in err, err
  failed_round = int(err.split('Round ')[1].split()[0])
  assert failed_round >= 4
  assert 'Rerun the same command' in err and 'Traceback' not in err
  assert _rounds(metrics) == list(range(1, failed_round))

  live_pool[1].start()  # the worker is back on the same port
  resumed, _ = cli.run_training(settings)
  err = capsys.readouterr().err
  assert 'Resuming from the checkpoint after round' in err
  assert _rounds(metrics) == list(range(1, 7))  # none lost, none twice
  flat_ref, flat_res = tf.nest.flatten(reference), tf.nest.flatten(resumed)
  _assert_close([np.asarray(x, np.float64) for x in flat_res],
                [np.asarray(x, np.float64) for x in flat_ref])


def test_persistent_client_state_on_workers_matches_local(live_pool, tmp_path, capsys):
  # MTFL: each client's private batch-norm patch travels to its worker as
  # per-client data and comes back as per-client output; split across two
  # workers, the model and every client's stored patch equal a local run.
  mtfl = dict(algorithm='mtfl', private='all', mtfl_strategy='fedavg', digits_model='cnn_bn',
              partition='shards', num_clients=6, clients_per_round=CLIENTS_PER_ROUND,
              local_steps=3, total_rounds=3, rounds_per_eval=3, rounds_per_checkpoint=3,
              noisy_client_fraction=0.0, noise_stddev=0.2, client_state_dir='')
  local, _ = cli.run_training(_train_settings(tmp_path, 'local', **mtfl))
  addresses = ','.join(w.address for w in live_pool)
  remote, _ = cli.run_training(_train_settings(tmp_path, 'remote', workers=addresses, **mtfl))
  capsys.readouterr()
  flat_local, flat_remote = tf.nest.flatten(local), tf.nest.flatten(remote)
  assert len(flat_local) == len(flat_remote)
  _assert_close([np.asarray(x, np.float64) for x in flat_remote if np.asarray(x).dtype.kind == 'f'],
                [np.asarray(x, np.float64) for x in flat_local if np.asarray(x).dtype.kind == 'f'])

  def stored_patches(name):
    """{client id: {name: array}} of the client-state snapshot of round 3."""
    directory = tmp_path / name / 'client_state'
    with open(directory / 'manifest_3.json') as f:
      manifest = json.load(f)
    out = {}
    for cid, version in manifest.items():
      path = directory / 'clients' / f'{urllib.parse.quote(cid, safe="")}@{version}.npz'
      with np.load(path) as data:
        out[cid] = {key: data[key] for key in data.files}
    return out

  local_patches, remote_patches = stored_patches('local'), stored_patches('remote')
  assert local_patches and sorted(local_patches) == sorted(remote_patches)
  for cid, patch in local_patches.items():
    assert sorted(patch) == sorted(remote_patches[cid])
    for key, value in patch.items():
      np.testing.assert_allclose(remote_patches[cid][key], value, rtol=1e-5, atol=1e-6)


def test_worker_retry_reruns_round_on_remaining_workers(live_pool, task, capsys):
  process = BUILDERS['fedavg'](task)
  _, local = _local_weights('fedavg', task)
  context = remote_context.create_workers_context([w.address for w in live_pool], retry=True)
  ids = list(task.train_data.client_ids)
  with context_stack_impl.context_stack.install(context):
    state = process.initialize()
    for round_num in range(1, ROUNDS + 1):
      if round_num == 2:
        live_pool[0].kill()
      sampled = program.sample_clients(ids, CLIENTS_PER_ROUND, 7, round_num)
      state = process.next(state, program.client_datasets(task, sampled, None)).state
    weights = process.get_model_weights(state)
  assert context.lost == [live_pool[0].address]
  assert context.addresses == [live_pool[1].address]
  assert f'lost TFF worker {live_pool[0].address}' in capsys.readouterr().err
  _assert_close([np.asarray(w) for w in weights.trainable], local)


def test_worker_processes_leave_nothing_behind():
  before = set(runtime.find_worker_processes(parent_pid=os.getpid()))
  started = worker_process.start_local_workers(2)
  pids = [w.pid for w in started]
  assert all(processes.alive(p) for p in pids)
  assert set(pids) <= set(runtime.find_worker_processes(parent_pid=os.getpid()))
  assert all(worker_process.is_ready(w.address, 2.0) for w in started)
  worker_process.stop_workers(started)
  assert processes.gone(pids)
  assert set(runtime.find_worker_processes(parent_pid=os.getpid())) == before


SCRIPT = '''
import sys, time
sys.path.insert(0, {root!r})
from tff_adaptive.execution import worker_process

started = worker_process.start_local_workers(2)
print('PIDS', *[w.pid for w in started], flush=True)
sys.stdin.readline()  # the test has seen the workers alive
if sys.argv[1] == 'raise':
  raise RuntimeError('boom')
if sys.argv[1] == 'wait':
  time.sleep(120)
'''


@pytest.mark.parametrize('how', ['exit', 'raise', signal.SIGKILL])
def test_workers_die_with_the_process_that_started_them(how):
  proc = subprocess.Popen(
      [sys.executable, '-c', SCRIPT.format(root=ROOT), how if isinstance(how, str) else 'wait'],
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
  pids = None
  for line in proc.stdout:
    if line.startswith('PIDS'):
      pids = [int(p) for p in line.split()[1:]]
      break
  assert pids and all(processes.alive(p) for p in pids)
  proc.stdin.write('go\n')
  proc.stdin.close()
  if not isinstance(how, str):
    proc.send_signal(how)
  proc.stdout.read()  # closes only once no worker holds our pipe
  proc.wait(timeout=30)
  assert processes.gone(pids), f'workers {pids} outlived their parent ({how})'


@pytest.mark.parametrize('sig', [signal.SIGINT, signal.SIGTERM])
def test_bin_worker_logs_warning_and_stops_on_signal(sig):
  port = portpicker.pick_unused_port()
  proc = subprocess.Popen([sys.executable, WORKER, f'--port={port}'], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  log = []
  for line in proc.stdout:
    log.append(line)
    if 'listening on port' in line:
      break
  text = ''.join(log)
  assert f'listening on port {port}' in text, text
  assert 'executes ANY computation' in text and "trainer's hosts" in text
  binary = [p for p in runtime.find_worker_processes(parent_pid=proc.pid)]
  assert len(binary) == 1 and worker_process.is_ready(f'localhost:{port}', 2.0)
  proc.send_signal(sig)
  rest = proc.stdout.read()
  assert proc.wait(timeout=30) == 0
  assert f'{signal.Signals(sig).name} received' in rest and 'TFF worker stopped' in rest
  assert processes.gone(binary)


def test_bin_worker_help_states_the_security_warning():
  result = subprocess.run([sys.executable, WORKER, '--help'], capture_output=True, text=True,
                          timeout=60)
  assert 'executes ANY computation' in result.stdout
  assert "trainer's hosts" in result.stdout
