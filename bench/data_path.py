"""The file-based tasks' data path at full size, on bench/standins.py's files.

For each task, in fresh child processes (so that peak RSS is the task's own):

- `create`: seconds and peak resident memory to create the task
  (`registry.create_task`: TFF's `load_data`, client ids, vocabularies,
  preprocessing), beside the RSS of the imports alone.
- `rounds`: per round of FedAvg (composer, K local steps), interleaved over
  `--rounds` rounds after a first (tracing) round:
    sample_s    `program.sample_clients` over all client ids
    build_s     `program.client_datasets` (the tf.data pipelines, in Python)
    build_eager_s  the same, built client by client without the traced
                dataset function (`FederatedTask.trace_client_datasets`)
    pipeline_s  iterating those pipelines for the K batches a client trains
                on, eagerly in this process (SQL query, proto parsing, the
                task's preprocessing): the data work the executor does
    round_s     `process.next` on the task's datasets
    round_mem_s `process.next` on the same K batches already in memory
                (`from_tensor_slices`): the round without the data path
  and the data's share of the round: (sample + build) / (sample + build +
  round) for the Python side, (round - round_mem) / round inside the executor.

  .venv/bin/python bench/data_path.py --data_dir=bench/tmp/standins
"""

import argparse
import collections
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

DEFAULT_TASKS = 'emnist_character:10,stackoverflow_word:50,stackoverflow_tag:10'


def _rss_mib() -> float:
  with open('/proc/self/statm') as f:
    return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2**20


def _peak_mib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _settings(args):
  """FedAvg per client with exactly K steps (one epoch: the data cycle for K steps)."""
  from workflow.flags import config  # pylint: disable=g-import-not-at-top
  return config.from_flags(dict(
      algorithm='fedavg', execution='per_client', data_dir=args.data_dir,
      client_batch_size=args.batch, client_epochs_per_round=1, local_steps=args.local_steps,
      seed=0, client_learning_rate=0.01))


def _create_task(args, task_name):
  from tasks import registry  # pylint: disable=g-import-not-at-top
  from tasks.settings import TaskSettings  # pylint: disable=g-import-not-at-top
  models = {'emnist_character_model': args.emnist_model} if task_name == 'emnist_character' else {}
  return registry.create_task(TaskSettings(task=task_name, data_dir=args.data_dir, **models),
                              batch_size=args.batch, num_epochs=1, seed=0)


def child_create(args, task_name):
  t0 = time.perf_counter()
  from tasks import registry  # pylint: disable=g-import-not-at-top
  import tensorflow_federated  # pylint: disable=g-import-not-at-top,unused-import
  import_s = time.perf_counter() - t0
  rss_import, peak_import = _rss_mib(), _peak_mib()
  if args.baseline:  # TFF's load_data: every split's client ids read at creation
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    from tasks import tff_files  # pylint: disable=g-import-not-at-top
    tff_files.load_stackoverflow = lambda path: tff.simulation.datasets.stackoverflow.load_data(
        cache_dir=os.path.dirname(path))
  t0 = time.perf_counter()
  task = _create_task(args, task_name)
  create_s = time.perf_counter() - t0
  n = len(task.train_data.client_ids)
  return collections.OrderedDict(
      task=task_name, baseline=args.baseline, train_clients=n, import_s=import_s,
      create_s=create_s,
      rss_after_import_mib=rss_import, peak_after_import_mib=peak_import,
      rss_after_create_mib=_rss_mib(), peak_rss_mib=_peak_mib(),
      create_peak_over_import_mib=_peak_mib() - rss_import)


def child_rounds(args, task_name, clients):
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tff_adaptive.execution import runtime  # pylint: disable=g-import-not-at-top
  from workflow.training import algorithm_builders  # pylint: disable=g-import-not-at-top
  from workflow.training import program  # pylint: disable=g-import-not-at-top
  runtime.use_local_cpp_context()
  task = _create_task(args, task_name)
  process = algorithm_builders.build(task, _settings(args))
  state = process.initialize()
  ids_all = list(task.train_data.client_ids)
  k = args.local_steps

  def materialise(datasets):
    out = []
    for ds in datasets:
      batches = [tf.data.Dataset.from_tensors(b) for b in ds.repeat().take(k)]
      memory = batches[0]
      for b in batches[1:]:  # batch sizes may differ (a client's last batch)
        memory = memory.concatenate(b)
      out.append(memory)
    return out

  rows = []
  for r in range(args.rounds + 1):
    row = collections.OrderedDict(round=r)
    t0 = time.perf_counter()
    ids = program.sample_clients(ids_all, clients, 0, r + 1)
    row['sample_s'] = time.perf_counter() - t0
    t0 = time.perf_counter()
    datasets = program.client_datasets(task, ids, None)
    row['build_s'] = time.perf_counter() - t0
    # The same datasets built eagerly client by client (as the tasks did before building them from ids).
    task.trace_client_datasets = False
    t0 = time.perf_counter()
    program.client_datasets(task, ids, None)
    row['build_eager_s'] = time.perf_counter() - t0
    task.trace_client_datasets = True
    t0 = time.perf_counter()
    in_memory = materialise(datasets)
    row['pipeline_s'] = time.perf_counter() - t0
    # Interleaved, rotated: the task's datasets and the in-memory batches.
    order = ['round_s', 'round_mem_s'] if r % 2 == 0 else ['round_s', 'round_mem_s'][::-1]
    for key in order:
      data = datasets if key == 'round_s' else in_memory
      t0 = time.perf_counter()
      out = process.next(state, data)
      row[key] = time.perf_counter() - t0
      state = out.state
    row['rss_mib'] = _rss_mib()
    rows.append(row)
    print(task_name, dict(row), flush=True)
  runtime.shutdown_workers()
  later = rows[1:]
  med = {key: statistics.median(r[key] for r in later)
         for key in ('sample_s', 'build_s', 'build_eager_s', 'pipeline_s', 'round_s',
                     'round_mem_s')}
  python_side = med['sample_s'] + med['build_s']
  return collections.OrderedDict(
      task=task_name, clients=clients, local_steps=k, batch=args.batch,
      train_clients=len(ids_all), rounds=rows, medians=med,
      python_data_share=python_side / (python_side + med['round_s']),
      python_data_share_eager=(med['sample_s'] + med['build_eager_s']) / (
          med['sample_s'] + med['build_eager_s'] + med['round_s']),
      executor_data_share=(med['round_s'] - med['round_mem_s']) / med['round_s'],
      pipeline_over_round=med['pipeline_s'] / med['round_s'],
      peak_rss_mib=_peak_mib())


def _child(args, mode, task, clients, baseline=False):
  cmd = [sys.executable, os.path.abspath(__file__), f'--child={mode}', f'--task={task}',
         f'--child_clients={clients}', f'--data_dir={args.data_dir}', f'--batch={args.batch}',
         f'--local_steps={args.local_steps}', f'--rounds={args.rounds}',
         f'--emnist_model={args.emnist_model}'] + (['--baseline'] if baseline else [])
  out = subprocess.run(cmd, check=True, capture_output=True, text=True)
  sys.stdout.write(''.join(l + '\n' for l in out.stdout.splitlines()
                           if not l.startswith('RESULT ')))
  line = [l for l in out.stdout.splitlines() if l.startswith('RESULT ')][-1]
  return json.loads(line[len('RESULT '):])


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--data_dir', default=os.path.join(ROOT, 'bench', 'tmp', 'standins'))
  p.add_argument('--tasks', default=DEFAULT_TASKS, help='task:clients per round, comma list')
  p.add_argument('--sections', default='create,rounds')
  p.add_argument('--local_steps', type=int, default=10)
  p.add_argument('--batch', type=int, default=20)
  p.add_argument('--rounds', type=int, default=3, help='timed rounds after the first')
  p.add_argument('--emnist_model', default='cnn')
  p.add_argument('--out_dir', default=os.path.join(ROOT, 'bench', 'results'))
  p.add_argument('--tag', default='')
  p.add_argument('--create_reps', type=int, default=2)
  p.add_argument('--baseline', action='store_true',
                 help="create: TFF's load_data (all splits' ids at creation), as the tasks once did")
  p.add_argument('--child', default='')
  p.add_argument('--task', default='')
  p.add_argument('--child_clients', type=int, default=0)
  args = p.parse_args(argv)
  if args.child:
    result = (child_create(args, args.task) if args.child == 'create'
              else child_rounds(args, args.task, args.child_clients))
    print('RESULT ' + json.dumps(result), flush=True)
    return result
  sys.path.insert(0, os.path.join(ROOT, 'bench'))
  import bench_results  # pylint: disable=g-import-not-at-top
  import machine_info  # pylint: disable=g-import-not-at-top
  sections = args.sections.split(',')
  load_before = machine_info.load_average()
  create, rounds = [], []
  for spec in args.tasks.split(','):
    task, clients = spec.split(':')
    if 'create' in sections:  # TFF's loading and ours, alternating
      for rep in range(args.create_reps):
        for baseline in ((True, False) if rep % 2 == 0 else (False, True)):
          create.append(_child(args, 'create', task, int(clients), baseline))
          print(json.dumps(create[-1]), flush=True)
    if 'rounds' in sections:
      rounds.append(_child(args, 'rounds', task, int(clients)))
  standins = os.path.join(args.data_dir, 'standins.json')
  payload = collections.OrderedDict(
      data_dir=args.data_dir, local_steps=args.local_steps, batch=args.batch,
      emnist_model=args.emnist_model,
      standins=json.load(open(standins)) if os.path.exists(standins) else None,
      create=create, rounds=rounds, load_before=load_before,
      load_after=machine_info.load_average())
  tag = f'_{args.tag}' if args.tag else ''
  path = bench_results.write(args.out_dir, f'data_path{tag}', payload)
  bench_results.markdown(args.out_dir)
  print('wrote', path)
  return payload


if __name__ == '__main__':
  main()
