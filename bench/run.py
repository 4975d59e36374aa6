"""Simulation round time against the raw compute it contains .

Example (the committed numbers; see bench/README.md):
  .venv/bin/python bench/run.py --out_dir=bench/results

Every measurement is a RATIO taken inside one process with interleaved
repetitions (raw, A, B, ..., raw, A, B, ...) and medians, so that background
load on a shared machine slows both sides of a ratio alike; the load average
(`os.getloadavg`) is recorded next to each section.

Sections (each writes `<out_dir>/<section>.json`; `results/README.md` is the
markdown table of all of them):
  overhead:  round time ÷ raw compute time for fedavg, fedadam, fedgbo-adam,
             mfl-adam, fedada2 (SM3-Adam clients), mimelite, fedprox and TFF's own
             `build_weighted_fed_avg`, with client data passed from Python
             (`python`) and built on the executor from client seeds (`ids`,
             `tff.simulation.compose_dataset_computation_with_learning_process`),
             and as one compiled program over the cohort (rows
             `<algorithm>@cohort_vec|cohort_seq|cohort_vec_cpp|cohort_seq_xla`,
             bench_cohort.py: vectorised or in sequence, in process, through
             TFF's C++ executor, XLA), each checked equal to the per-client
             round. Raw compute = one `tf.function` running the same C clients
             × K SGD minibatch steps on the same model and the same (in-memory)
             batches, resetting the weights per client.
  scaling:   the same ratio for FedAvg (ours per client and as a cohort, TFF's)
             at 10/50/200 clients per round and for three model sizes
             (synthetic linear, digits MLP, EMNIST-shaped CNN).
  memory:    resident memory after every round over many rounds; slope of the
             second half (KiB/round) and peak.
  first_round: seconds to build the process, to initialise it, and for the
             first round (tracing + compilation) against a later round.
  profile:   cProfile of `process.next` (top functions by cumulative time).

Models (bench_models.py): linear, mlp (digits), cnn (EMNIST-shaped), so_lr
(Stack-Overflow-LR shaped, 10,000 → 500 multi-hot), gru (Shakespeare GRU
2 × 128 over 80 characters). The data is synthetic: client c's examples are
`tf.random.stateless_*` draws seeded by c, so the executor can rebuild them
from the seed alone.

This file is the command line; what it times is in bench_rounds.py (settings,
raw compute, runners), the sections in bench_sections.py, the JSON files and
results/README.md in bench_results.py.
"""


import argparse
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# pylint: disable=g-import-not-at-top
import bench_rounds  # first: it puts the checkout on sys.path
import bench_cohort
import bench_results
import bench_sections
import machine_info
from tff_adaptive.execution import runtime


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--out_dir', default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   'results'))
  p.add_argument('--sections', default='overhead,scaling,memory',
                 help='comma list of overhead, scaling, memory')
  p.add_argument('--setting', default='', choices=[''] + list(bench_rounds.SETTINGS),
                 help='one of the benchmark settings: sets --model, --clients, --local_steps, '
                      '--batch and (unless given) --tag')
  p.add_argument('--model', default='cnn', choices=sorted(bench_rounds.MODELS))
  p.add_argument('--clients', type=int, default=10)
  p.add_argument('--local_steps', type=int, default=10)
  p.add_argument('--batch', type=int, default=20)
  p.add_argument('--reps', type=int, default=5)
  p.add_argument('--algorithms', default=','.join(
      [a for a in bench_rounds.ALGORITHMS if a not in bench_rounds.PERSONALISED]
      + [bench_rounds.TFF_REFERENCE]),
                 help=f'also: {", ".join(bench_rounds.PERSONALISED)} '
                      '(personalised; --data=python)')
  p.add_argument('--data', default='python,ids', help='client data modes: python, ids')
  p.add_argument('--cohort_executions', default=','.join(bench_cohort.EXECUTIONS),
                 help='cohort rows (bench/bench_cohort.py) for every algorithm the cohort '
                      'execution supports, in overhead and scaling; %s only for fedavg; '
                      'empty: none' % ', '.join(bench_cohort.FEDAVG_ONLY))
  p.add_argument('--profile_rounds', type=int, default=2, help='0: no profile')
  p.add_argument('--scaling_clients', default='10,50,200')
  p.add_argument('--scaling_models', default='linear,mlp,cnn')
  p.add_argument('--scaling_algorithms', default=f'fedavg,{bench_rounds.TFF_REFERENCE}')
  p.add_argument('--scaling_max_steps', type=int, default=2000,
                 help='skip scaling points with more than this many minibatch steps per round')
  p.add_argument('--memory_rounds', type=int, default=300)
  p.add_argument('--memory_model', default='mlp', choices=sorted(bench_rounds.MODELS))
  p.add_argument('--memory_algorithm', default='fedavg')
  p.add_argument('--memory_execution', default='per_client', choices=['per_client', 'cohort'],
                 help="cohort: the cohort program, the round's size drawn from "
                      '[--memory_min_clients, --clients] (in-process arrays; --data ignored)')
  p.add_argument('--memory_min_clients', type=int, default=5)
  p.add_argument('--execution_concurrency', type=int, default=0,
                 help="TFF C++ executor's max_concurrent_computation_calls (0: the package's "
                      "default, two per CPU core; -1: unlimited, TFF's default)")
  p.add_argument('--tag', default='', help='suffix of the JSON file names')
  return p


def _scaling(args, modes, cohort_executions, concurrency) -> collections.OrderedDict:
  """The scaling section: overhead rows over --scaling_models × --scaling_clients."""
  entries = []
  load_before = machine_info.load_average()
  for model in args.scaling_models.split(','):
    for clients in (int(c) for c in args.scaling_clients.split(',')):
      if clients * args.local_steps > args.scaling_max_steps:
        continue
      setting = bench_rounds.Setting(model, clients, args.local_steps, args.batch)
      res = bench_sections.overhead_section(
          setting, args.scaling_algorithms.split(','), modes, max(2, args.reps // 2),
          cohort_executions=cohort_executions)
      entries += [bench_sections.scaling_entry(model, clients, r, res['load_after'][0])
                  for r in res['rows']]
      print(entries[-len(res['rows']):], flush=True)
  return collections.OrderedDict(
      columns=bench_sections.SCALING_COLUMNS,
      entries=entries, load_before=load_before, load_after=machine_info.load_average(),
      execution_concurrency=concurrency)


def main(argv=None):
  args = _parser().parse_args(argv)
  if args.setting:
    args.model, args.clients, args.local_steps, args.batch = bench_rounds.SETTINGS[args.setting]
    args.tag = args.tag or args.setting
  runtime.use_local_cpp_context(max_concurrent_computation_calls=args.execution_concurrency)
  concurrency = runtime.resolve_concurrency(args.execution_concurrency)  # -1: unlimited
  sections = [s for s in args.sections.split(',') if s]
  modes = [m for m in args.data.split(',') if m]
  names = [a for a in args.algorithms.split(',') if a]
  cohort_executions = [c for c in args.cohort_executions.split(',') if c]
  tag = f'_{args.tag}' if args.tag else ''
  written = []
  if 'overhead' in sections:
    setting = bench_rounds.Setting(args.model, args.clients, args.local_steps, args.batch)
    result = bench_sections.overhead_section(setting, names, modes, args.reps,
                                             args.profile_rounds, cohort_executions)
    result['execution_concurrency'] = concurrency
    written.append(bench_results.write(args.out_dir, f'overhead{tag}', result))
    print(json.dumps(result['rows'], indent=1), flush=True)
  if 'scaling' in sections:
    written.append(bench_results.write(args.out_dir, f'scaling{tag}',
                                       _scaling(args, modes, cohort_executions, concurrency)))
  if 'memory' in sections:
    setting = bench_rounds.Setting(args.memory_model, args.clients, args.local_steps, args.batch)
    if args.memory_execution == 'cohort':
      result = bench_sections.memory_cohort_section(setting, args.memory_algorithm,
                                                    args.memory_rounds, args.memory_min_clients)
      written.append(bench_results.write(args.out_dir, f'memory_cohort{tag}', result))
      modes = []
    for mode in modes:
      result = bench_sections.memory_section(setting, args.memory_algorithm, mode,
                                             args.memory_rounds)
      result['execution_concurrency'] = concurrency
      written.append(bench_results.write(args.out_dir, f'memory_{mode}{tag}', result))
  bench_results.markdown(args.out_dir)
  runtime.shutdown_workers()
  print('wrote', *written)
  return written


if __name__ == '__main__':
  main()
