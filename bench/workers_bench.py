"""Round time of training on 1, 2 and 4 TFF workers, against local execution.

Example:
  .venv/bin/python bench/workers_bench.py --rounds=5
writes bench/results/workers.json and bench/results/workers.md.

Every configuration runs the same rounds (same clients, same data, same
initial model) of FedAvg on the digits task; the first round, which includes
TFF's compilation, is reported separately from the timed rounds, which are
interleaved across configurations. Besides wall time, each round's CPU time
of the trainer and of every worker process is read from /proc. All workers
run on this machine (loopback), so they share its cores: the numbers show the
overhead of the distributed path and how the work splits, not the speed-up of
N machines (see the markdown report).
"""

import json
import os
import platform
import statistics
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
from workflow.training import program
from tff_adaptive.execution import runtime
from tff_adaptive.execution import data_on_workers
from tff_adaptive.execution import remote_context
from tff_adaptive.execution import worker_process
from tff_adaptive.algorithms import fedopt

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

NOTES = """Columns: CPU seconds are medians per round from /proc (trainer: this
process, all threads; workers: the worker_binary processes; for `local`, TFF's
own local worker). "Projected round on own cores" = trainer CPU + busiest
worker's CPU: what a round would take if every worker had its own cores and
the network were free. It is a model built from measured CPU time, not a
measurement on several machines.

How to read it: the workers here share this machine's cores with the trainer,
each other and other users' jobs, so wall times cannot show the speed-up of
N machines; they show the overhead of the distributed path (datasets and
models serialised over gRPC, the mergeable compilation's extra merge step)
under contention. CPU time is much less sensitive to the load: the total
worker CPU shows the work is split, not duplicated; the busiest worker's
share shrinking with N is what N machines turn into speed-up, while the
trainer's part (building and sending client datasets unless
`--data_on_workers`, merging, the server update) does not shrink.
`2-sequential` is TFF's RemoteExecutor as shipped, whose blocking Compute
call makes the mergeable context run the workers one after the other."""


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


_TICKS = os.sysconf('SC_CLK_TCK')


def _cpu_seconds(pid: int) -> float:
  """User + system CPU seconds of process `pid` (all its threads) so far."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      fields = f.read().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS
  except (OSError, IndexError, ValueError):
    return float('nan')


class _Config:
  """One configuration: its process, context and worker processes, and its state."""

  def __init__(self, name: str, task):
    self.name = name
    self.task = task
    self.process = fedopt.build_fedopt(
        task.model_fn, tff.learning.optimizers.build_sgdm(0.05),
        tff.learning.optimizers.build_sgdm(1.0), local_steps=FLAGS.local_steps)
    self.started: list[worker_process.WorkerProcess] = []
    self.ids_only = name.endswith('data_on_workers')
    if name == 'local':
      runtime._install_process_hooks()  # pylint: disable=protected-access
      self.num_workers = 0
      before = set(runtime.live_workers())
      self.context = tff.backends.native.create_sync_local_cpp_execution_context()
      self._local_before = before
    else:
      self.num_workers = int(name.split('-')[0])
      self.started = worker_process.start_local_workers(self.num_workers)
      self.context = remote_context.create_workers_context(
          [w.address for w in self.started],
          concurrent_compute=not name.endswith('sequential'))
      if self.ids_only:
        self.process, _ = data_on_workers.compose_data_on_workers(self.process, task)
    self.state = None
    self.worker_pids: list[int] = [w.pid for w in self.started]
    self.first_round_seconds = float('nan')
    self.rounds: list[dict] = []

  def run_round(self, round_num: int) -> dict:
    """Runs one round (initialising first); returns its wall and CPU seconds."""
    client_ids = list(self.task.train_data.client_ids)
    with context_stack_impl.context_stack.install(self.context):
      if self.state is None:
        self.state = self.process.initialize()
        if self.name == 'local':
          self.worker_pids = sorted(set(runtime.live_workers()) - self._local_before)
      sampled = program.sample_clients(client_ids, FLAGS.clients_per_round, 0, round_num)
      cpu_workers = [_cpu_seconds(p) for p in self.worker_pids]
      cpu_trainer = time.process_time()
      started = time.perf_counter()
      data = sampled if self.ids_only else program.client_datasets(self.task, sampled, None)
      self.state = self.process.next(self.state, data).state
      wall = time.perf_counter() - started
      cpu_trainer = time.process_time() - cpu_trainer
      cpu_workers = [_cpu_seconds(p) - c for p, c in zip(self.worker_pids, cpu_workers)]
    return {'round': round_num, 'wall_seconds': wall, 'trainer_cpu_seconds': cpu_trainer,
            'worker_cpu_seconds': cpu_workers, 'load_average_1min': os.getloadavg()[0]}

  def weights(self) -> list[np.ndarray]:
    with context_stack_impl.context_stack.install(self.context):
      return [np.asarray(w) for w in self.process.get_model_weights(self.state).trainable]

  def summary(self) -> dict:
    walls = [r['wall_seconds'] for r in self.rounds]
    trainer = [r['trainer_cpu_seconds'] for r in self.rounds]
    worker_sum = [sum(r['worker_cpu_seconds']) for r in self.rounds]
    worker_max = [max(r['worker_cpu_seconds'], default=0.0) for r in self.rounds]
    return {
        'config': self.name, 'workers': self.num_workers,
        'first_round_seconds': self.first_round_seconds,
        'median_round_seconds': statistics.median(walls),
        'mean_round_seconds': statistics.fmean(walls),
        'median_trainer_cpu_seconds': statistics.median(trainer),
        'median_worker_cpu_seconds_total': statistics.median(worker_sum),
        'median_worker_cpu_seconds_max': statistics.median(worker_max),
        # The round time N machines would give if each worker had its own
        # cores and the trainer never waited on the network: the trainer's part
        # plus the busiest worker's. A model, not a measurement.
        'projected_round_seconds_own_cores': statistics.median(
            [t + m for t, m in zip(trainer, worker_max)]),
        'rounds': self.rounds}

  def close(self):
    worker_process.stop_workers(self.started)


def _run(names: list[str], task, rounds: int) -> list[_Config]:
  """Warm-up round per configuration, then `rounds` rounds interleaved.

  Interleaving (configuration order rotated every round) spreads the load of
  a shared machine over all configurations instead of favouring whichever
  ran while it was quiet.
  """
  configs = []
  try:
    for name in names:
      configs.append(_Config(name, task))
    for config in configs:
      print(f'warm-up {config.name} ...', file=sys.stderr, flush=True)
      config.first_round_seconds = config.run_round(1)['wall_seconds']
    for i in range(rounds):
      order = configs[i % len(configs):] + configs[:i % len(configs)]
      for config in order:
        config.rounds.append(config.run_round(i + 2))
      print(f'round {i + 2}: ' + ', '.join(
          f'{c.name} {c.rounds[-1]["wall_seconds"]:.2f}s' for c in configs),
            file=sys.stderr, flush=True)
  except BaseException:
    for config in configs:
      config.close()
    runtime.shutdown_workers()
    raise
  return configs


def _markdown(report: dict) -> str:
  m, s = report['machine'], report['setup']
  loads = [r['load_average_1min'] for res in report['results'] for r in res['rounds']]
  lines = [
      '# Round time on TFF workers (bench/workers_bench.py)', '',
      f'Machine: {m["cpu"]}, {m["cores"]} cores, {m["memory_gib"]} GiB; Python {m["python"]}, '
      f'TF {m["tensorflow"]}, TFF {m["tensorflow_federated"]}. Shared with other jobs: the '
      f'1-minute load average during the timed rounds was {min(loads):.0f}–{max(loads):.0f} '
      f'on {m["cores"]} cores.', '',
      f'Setup: FedAvg on digits ({s["model"]}), {s["num_clients"]} clients, '
      f'{s["clients_per_round"]} per round, {s["local_steps"]} local steps of batch '
      f'{s["batch_size"]}; a warm-up round (includes compilation), then {s["rounds"]} timed '
      'rounds with the configurations interleaved. All workers on this machine, over loopback.',
      '',
      '| configuration | warm-up (s) | median round, wall (s) | trainer CPU (s) | '
      'workers CPU, total (s) | busiest worker CPU (s) | projected round on own cores (s) | '
      'max weight diff vs local |',
      '|---|---|---|---|---|---|---|---|']
  for r in report['results']:
    diff = r.get('max_abs_weight_diff_vs_local')
    lines.append(
        f'| {r["config"]} | {r["first_round_seconds"]:.1f} | {r["median_round_seconds"]:.2f} | '
        f'{r["median_trainer_cpu_seconds"]:.2f} | {r["median_worker_cpu_seconds_total"]:.2f} | '
        f'{r["median_worker_cpu_seconds_max"]:.2f} | '
        f'{r["projected_round_seconds_own_cores"]:.2f} | '
        f'{"–" if diff is None else f"{diff:.1e}"} |')
  lines += ['', NOTES, '']
  return '\n'.join(lines)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # TFF logs each graph optimisation at INFO
  task = digits.create_task(num_clients=FLAGS.num_clients, model=FLAGS.model,
                            batch_size=FLAGS.batch_size)
  configs = _run(list(FLAGS.configs), task, FLAGS.rounds)
  results = [c.summary() for c in configs]
  weights = {c.name: c.weights() for c in configs}
  for config in configs:
    config.close()
  runtime.shutdown_workers()
  if 'local' in weights:
    for r in results:
      r['max_abs_weight_diff_vs_local'] = float(max(
          np.max(np.abs(a - b)) for a, b in zip(weights[r['config']], weights['local'])))
  report = {
      'machine': _machine(),
      'setup': {'task': 'digits', 'model': FLAGS.model, 'num_clients': FLAGS.num_clients,
                'clients_per_round': FLAGS.clients_per_round, 'local_steps': FLAGS.local_steps,
                'batch_size': FLAGS.batch_size, 'rounds': FLAGS.rounds, 'algorithm': 'fedavg',
                'interleaved': True},
      'results': results,
      'leftover_worker_processes': runtime.find_worker_processes(parent_pid=os.getpid()),
  }
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  with open(os.path.join(FLAGS.out_dir, 'workers.json'), 'w') as f:
    json.dump(report, f, indent=1)
  with open(os.path.join(FLAGS.out_dir, 'workers.md'), 'w') as f:
    f.write(_markdown(report))
  print(_markdown(report))


if __name__ == '__main__':
  app.run(main)
