"""Round time of training on 1, 2 and 4 TFF workers, against local execution.

Example:
  .venv/bin/python bench/workers_bench.py --rounds=5
writes bench/results/workers.json and bench/results/workers.md.

Every configuration runs the same rounds (same clients, same data, same
initial model) of FedAvg on the digits task; the first round, which includes
TFF's compilation, is reported separately from the timed rounds. All workers
run on this machine (loopback), so they share its cores: the numbers show the
overhead of the distributed path and how the work splits, not the speed-up of
N machines (see the markdown report).
"""

import json
import os
import platform
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags
from absl import logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
os.environ.setdefault('GRPC_VERBOSITY', 'ERROR')  # fork notices when workers start

# pylint: disable=g-import-not-at-top
# TensorFlow before app.run, as in bin/train (Keras 2.14 model building).
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl

from tasks import digits
from tff_adaptive import program
from tff_adaptive import runtime
from tff_adaptive import workers
from tff_adaptive.algorithms import fedopt_process

flags.DEFINE_integer('rounds', 5, 'Timed rounds per configuration (after one warm-up round).')
flags.DEFINE_integer('num_clients', 32, 'Clients of the digits task.')
flags.DEFINE_integer('clients_per_round', 16, 'Clients per round.')
flags.DEFINE_integer('local_steps', 20, 'Exact local SGD steps per client.')
flags.DEFINE_integer('batch_size', 20, 'Client batch size.')
flags.DEFINE_string('model', 'cnn', 'Digits model (mlp, cnn, cnn_bn).')
flags.DEFINE_list('configs', ['local', '1', '2', '4', '2-sequential', '2-data_on_workers'],
                  'Configurations: local, a number of workers N, N-sequential (TFF\'s '
                  'RemoteExecutor as shipped: blocking Compute calls), N-data_on_workers.')
flags.DEFINE_string('out_dir', os.path.join(os.path.dirname(os.path.abspath(__file__)), 'results'),
                    'Where workers.json and workers.md go.')
FLAGS = flags.FLAGS

NOTES = """How to read it: every worker here shares this machine's cores with the trainer
and with the other workers, so N loopback workers cannot be faster than the
cores allow; what the table measures is the cost of the distributed path
(serialising client datasets and models over gRPC, the mergeable
compilation's extra merge step) and whether the subrounds overlap. On N
machines each worker brings its own cores, so the client training part of a
round divides by N while the trainer-side part (building and sending client
datasets, unless `--data_on_workers`; merging; the server update) does not.
`N-sequential` is TFF's RemoteExecutor as shipped, whose blocking Compute
call makes the mergeable context run the workers one after another; the
default overlaps them."""


def _cpu_model() -> str:
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or 'unknown'


def _machine() -> dict:
  return {
      'cpu': _cpu_model(), 'cores': os.cpu_count(),
      'memory_gib': round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30, 1),
      'python': platform.python_version(), 'tensorflow': tf.__version__,
      'tensorflow_federated': tff.__version__, 'kernel': platform.release()}


def _time_rounds(process, task, context, rounds: int, ids_only: bool = False):
  """(warm-up round seconds, timed round seconds, final weights)."""
  client_ids = list(task.train_data.client_ids)
  with context_stack_impl.context_stack.install(context):
    state = process.initialize()
    times = []
    for round_num in range(1, rounds + 2):
      sampled = program.sample_clients(client_ids, FLAGS.clients_per_round, 0, round_num)
      started = time.perf_counter()
      data = sampled if ids_only else program.client_datasets(task, sampled, None)
      state = process.next(state, data).state
      times.append(time.perf_counter() - started)
    weights = process.get_model_weights(state)
  return times[0], times[1:], [np.asarray(w) for w in weights.trainable]


def _run_config(name: str, task, rounds: int) -> dict:
  process = fedopt_process.build_fedopt_process(
      task.model_fn, server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
      client_learning_rate=0.05, local_steps=FLAGS.local_steps)
  load_before = os.getloadavg()
  started = []
  concurrent = workers._CONCURRENT_COMPUTE  # pylint: disable=protected-access
  try:
    if name == 'local':
      runtime._install_process_hooks()  # pylint: disable=protected-access
      context = tff.backends.native.create_sync_local_cpp_execution_context()
      num_workers, ids_only = 0, False
    else:
      num_workers = int(name.split('-')[0])
      ids_only = name.endswith('data_on_workers')
      if name.endswith('sequential'):
        workers._CONCURRENT_COMPUTE = False  # pylint: disable=protected-access
      started = workers.start_local_workers(num_workers)
      context = workers.create_workers_context([w.address for w in started])
      if ids_only:
        process, _ = workers.compose_data_on_workers(process, task)
    first, timed, weights = _time_rounds(process, task, context, rounds, ids_only)
  finally:
    workers._CONCURRENT_COMPUTE = concurrent  # pylint: disable=protected-access
    workers.stop_workers(started)
    runtime.shutdown_workers()
  return {'config': name, 'workers': num_workers, 'first_round_seconds': first,
          'round_seconds': timed, 'median_round_seconds': statistics.median(timed),
          'mean_round_seconds': statistics.fmean(timed),
          'load_average_before': load_before, 'load_average_after': os.getloadavg(),
          'weights': weights}


def _markdown(report: dict) -> str:
  m = report['machine']
  s = report['setup']
  lines = [
      '# Round time on TFF workers (bench/workers_bench.py)', '',
      f'Machine: {m["cpu"]}, {m["cores"]} cores, {m["memory_gib"]} GiB; Python {m["python"]}, '
      f'TF {m["tensorflow"]}, TFF {m["tensorflow_federated"]}. The machine is shared: the load '
      'average (1 min) around each configuration is listed, and numbers taken under load are '
      'noisy.', '',
      f'Setup: FedAvg on digits ({s["model"]}), {s["num_clients"]} clients, '
      f'{s["clients_per_round"]} per round, {s["local_steps"]} local steps of batch '
      f'{s["batch_size"]}; {s["rounds"]} timed rounds after a warm-up round (which includes '
      'compilation). All workers on this machine, over loopback.', '',
      '| configuration | workers | warm-up round (s) | median round (s) | mean round (s) | '
      'speed-up vs 1 worker | max weight diff vs local | load avg before → after |',
      '|---|---|---|---|---|---|---|---|']
  base = next((r['median_round_seconds'] for r in report['results'] if r['config'] == '1'), None)
  for r in report['results']:
    speedup = f'{base / r["median_round_seconds"]:.2f}×' if base and r['workers'] else '–'
    diff = r.get('max_abs_weight_diff_vs_local')
    lines.append(
        f'| {r["config"]} | {r["workers"] or "local"} | {r["first_round_seconds"]:.1f} | '
        f'{r["median_round_seconds"]:.2f} | {r["mean_round_seconds"]:.2f} | {speedup} | '
        f'{"–" if diff is None else f"{diff:.1e}"} | '
        f'{r["load_average_before"][0]:.1f} → {r["load_average_after"][0]:.1f} |')
  lines += ['', NOTES, '']
  return '\n'.join(lines)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # TFF logs each graph optimisation at INFO
  task = digits.create_task(num_clients=FLAGS.num_clients, model=FLAGS.model,
                            batch_size=FLAGS.batch_size)
  results = []
  for name in FLAGS.configs:
    print(f'running {name} ...', file=sys.stderr, flush=True)
    result = _run_config(name, task, FLAGS.rounds)
    print(f'  {name}: warm-up {result["first_round_seconds"]:.1f} s, median round '
          f'{result["median_round_seconds"]:.2f} s', file=sys.stderr, flush=True)
    results.append(result)
  local = next((r['weights'] for r in results if r['config'] == 'local'), None)
  for r in results:
    if local is not None:
      r['max_abs_weight_diff_vs_local'] = float(max(
          np.max(np.abs(a - b)) for a, b in zip(r['weights'], local)))
    del r['weights']
  leftover = runtime.find_orphan_workers(parent_pid=os.getpid())
  report = {
      'machine': _machine(),
      'setup': {'task': 'digits', 'model': FLAGS.model, 'num_clients': FLAGS.num_clients,
                'clients_per_round': FLAGS.clients_per_round, 'local_steps': FLAGS.local_steps,
                'batch_size': FLAGS.batch_size, 'rounds': FLAGS.rounds, 'algorithm': 'fedavg'},
      'results': results,
      'leftover_worker_processes': leftover,
      'git_commit': subprocess.run(['git', 'rev-parse', 'HEAD'], capture_output=True, text=True,
                                   cwd=os.path.dirname(FLAGS.out_dir)).stdout.strip(),
  }
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  with open(os.path.join(FLAGS.out_dir, 'workers.json'), 'w') as f:
    json.dump(report, f, indent=1)
  with open(os.path.join(FLAGS.out_dir, 'workers.md'), 'w') as f:
    f.write(_markdown(report))
  print(_markdown(report))


if __name__ == '__main__':
  app.run(main)
