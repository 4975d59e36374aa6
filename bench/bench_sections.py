"""The sections bench/run.py measures: overhead, scaling and memory.

overhead: every round ÷ raw compute, interleaved in one process (cohort rows
checked equal to the per-client round); scaling: overhead rows as entries of
one table over models and cohort sizes; memory: resident memory of this process
and of TFF's worker_binary after every round. Each returns the section's
payload for bench_results.write.
"""

import collections
import cProfile
import io
import os
import pstats
import resource
import statistics
import sys
import time

import numpy as np

import bench_cohort
import bench_rounds
import machine_info
from tff_adaptive.execution import runtime
from tff_adaptive.rounds import cohort_data


def build_cohort_runners(setting: bench_rounds.Setting, names, executions, runners):
  """Cohort runners (row key → runner), the rows skipped (row → why the
  algorithm runs per client) and the rows that failed (row → the error).

  Each starts from the state of the per-client runner of its algorithm in
  `runners` (one is built, untimed, if none was asked for) and records its
  first round's difference to that runner's first round.
  """
  specs = list(bench_cohort.row_specs(names, executions, bench_rounds.ALGORITHMS))
  cohort_runners, skipped, failed, references = collections.OrderedDict(), {}, {}, {}
  arrays = data_s = None
  for row, name, key in specs:
    algorithm, _ = bench_rounds.ALGORITHMS[name]
    if name not in references:
      references[name] = next((r for k, r in runners.items() if k.split('/')[0] == name), None)
    if arrays is None:
      arrays, data_s = bench_cohort.client_arrays(setting)
    try:
      t0 = time.perf_counter()
      process, reason = bench_cohort.build(algorithm, setting.task(),
                                           bench_rounds.run_config(name, setting), key)
      build_s = time.perf_counter() - t0
      if process is None:
        skipped[row] = reason
        print(f'{row}: not run ({reason})', file=sys.stderr, flush=True)
        continue
      if references[name] is None:
        references[name] = bench_rounds.Runner(name, setting, 'python')
        references[name].first()
      train, tests = arrays, None
      # 2K batches for Per-FedAvg's K meta-steps; test = the K
      if name in bench_rounds.PERSONALISED:
        train = [cohort_data.client_batches(d, process.batches_per_client(setting.steps))
                 for d in setting.python_datasets()]
        tests = arrays
      runner = bench_cohort.CohortRunner(process, build_s, train, data_s,
                                         references[name].initial_state,
                                         background=key in bench_cohort.BACKGROUND, tests=tests)
      runner.first()
    # A combination the cohort program cannot build (tf.vectorized_map of a
    # GRU) is a result of the run, not the end of it.
    except Exception as e:  # pylint: disable=broad-except
      failed[row] = f'{type(e).__name__}: {_first_line(e)}'
      print(f'{row}: failed ({failed[row]})', file=sys.stderr, flush=True)
      continue
    runner.reference = references[name]
    cohort_runners[f'{row}/{bench_cohort.DATA}'] = runner
  return cohort_runners, skipped, failed


def _first_line(error: Exception) -> str:
  lines = [l.strip() for l in str(error).splitlines() if l.strip()]
  return (lines[-1] if lines else '')[:300]


def interleaved(fns: dict, reps: int) -> dict:
  """Times each callable `reps` times, interleaved and rotated; returns lists."""
  names = list(fns)
  times = {n: [] for n in names}
  for r in range(reps):
    order = names[r % len(names):] + names[:r % len(names)]
    for n in order:
      t0 = time.perf_counter()
      fns[n]()
      times[n].append(time.perf_counter() - t0)
  return times


def finite_ratio(a, b):
  return float(a / b) if b > 0 else float('nan')


def overhead_section(setting: bench_rounds.Setting, names, data_modes, reps, profile_rounds=0,
                     cohort_executions=()):
  """Ratios to raw compute for `names` under each data mode and each cohort
  execution (bench_cohort.py), all interleaved."""
  load_before = machine_info.load_average()
  fns = {'raw': bench_rounds.build_raw(setting),
         'raw_pipeline': bench_rounds.build_raw_pipeline(setting)}
  fns['raw']()  # trace
  fns['raw_pipeline']()
  runners = {}
  for name in names:
    for mode in data_modes:
      runner = bench_rounds.Runner(name, setting, mode)
      runner.first()
      runners[f'{name}/{mode}'] = runner
      fns[f'{name}/{mode}'] = runner
  cohort_runners, cohort_skipped, cohort_failed = build_cohort_runners(
      setting, names, cohort_executions, runners)
  runners.update(cohort_runners)
  fns.update(cohort_runners)
  times = interleaved(fns, reps)
  raw = statistics.median(times['raw'])
  raw_pipeline = statistics.median(times['raw_pipeline'])
  rows = []
  for key, runner in runners.items():
    name, mode = key.split('/')
    med = statistics.median(times[key])
    per_rep = [t / r for t, r in zip(times[key], times['raw'])]
    rows.append(collections.OrderedDict(
        algorithm=name, data=mode,
        execution=name.split('@')[1] if '@' in name else 'per_client',
        round_s=med, raw_s=raw, ratio=finite_ratio(med, raw),
        raw_pipeline_s=raw_pipeline, ratio_to_raw_pipeline=finite_ratio(med, raw_pipeline),
        ratio_per_rep_median=statistics.median(per_rep),
        build_s=runner.build_s, init_s=runner.init_s, first_round_s=runner.first_round_s,
        first_round_over_round=finite_ratio(runner.first_round_s, med)))
    if key in cohort_runners:
      rows[-1].update(bench_cohort.row_fields(runner, runner.reference))
      if not rows[-1]['update_equal']:
        print(f"{name}: round update differs from the per-client one by "
              f"{rows[-1]['update_max_abs_diff']:.3g}", file=sys.stderr, flush=True)
  for row in rows:
    # Same data and execution: cohort rows against FedAvg run the same way.
    base = [r for r in rows if r['algorithm'].split('@')[0] == 'fedavg' and
            r['data'] == row['data'] and r['execution'] == row['execution']]
    row['ratio_to_fedavg'] = finite_ratio(row['round_s'], base[0]['round_s']) if base else None
  for runner in cohort_runners.values():
    runner.close()
  profiles = {}
  if profile_rounds:
    for key in runners:
      if key.startswith(('fedavg/', bench_rounds.TFF_REFERENCE + '/')):
        profiles[key] = profile(runners[key], profile_rounds)
  return collections.OrderedDict(
      setting=vars_of(setting), reps=reps, load_before=load_before,
      load_after=machine_info.load_average(),
      raw_times_s=times['raw'], raw_pipeline_times_s=times['raw_pipeline'],
      raw_pipeline_over_raw=finite_ratio(raw_pipeline, raw), rows=rows, times_s=times,
      cohort_skipped=cohort_skipped, cohort_failed=cohort_failed,
      targets=bench_cohort.targets(rows, bench_rounds.TFF_REFERENCE),
      profiles=profiles)


SCALING_COLUMNS = ['model', 'clients', 'algorithm', 'data', 'raw_s', 'raw_pipeline_s', 'round_s',
                   'ratio', 'ratio_to_raw_pipeline', 'first_round_s', 'update_max_abs_diff',
                   'rss_mib', 'worker_rss_mib', 'peak_rss_mib', 'load']


def scaling_entry(model: str, clients: int, row, load: float) -> collections.OrderedDict:
  """One row of an overhead section as an entry of the scaling table."""
  entry = collections.OrderedDict(
      model=model, clients=clients, algorithm=row['algorithm'], data=row['data'],
      raw_s=row['raw_s'], raw_pipeline_s=row['raw_pipeline_s'], round_s=row['round_s'],
      ratio=row['ratio'], ratio_to_raw_pipeline=row['ratio_to_raw_pipeline'],
      first_round_s=row['first_round_s'],
      rss_mib=_rss_kib() / 1024, worker_rss_mib=_worker_rss_kib() / 1024,
      peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, load=load)
  if 'update_max_abs_diff' in row:  # a cohort row: its equality to the per-client round
    entry['update_max_abs_diff'] = row['update_max_abs_diff']
  return entry


def vars_of(setting):
  return collections.OrderedDict(model=setting.model, clients=setting.clients,
                                 local_steps=setting.steps, batch=setting.batch)


def profile(runner, rounds: int, top: int = 25) -> str:
  prof = cProfile.Profile()
  prof.enable()
  for _ in range(rounds):
    runner()
  prof.disable()
  s = io.StringIO()
  pstats.Stats(prof, stream=s).sort_stats('cumulative').print_stats(top)
  return s.getvalue()


def _rss_kib() -> float:
  with open('/proc/self/statm') as f:
    return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 1024


def _worker_rss_kib() -> float:
  """RSS of TFF's worker_binary children (where the executor holds values)."""
  total = 0.0
  for pid in runtime.live_workers():
    try:
      with open(f'/proc/{pid}/statm') as f:
        total += int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 1024
    except OSError:
      pass
  return total


def _second_half_slope(series) -> float:
  half = series[len(series) // 2:]
  return float(np.polyfit(np.arange(len(half)), half, 1)[0]) if len(half) > 1 else 0.0


def memory_section(setting: bench_rounds.Setting, name: str, data: str, rounds: int):
  load_before = machine_info.load_average()
  runner = bench_rounds.Runner(name, setting, data)
  rss, worker_rss = [], []
  t0 = time.perf_counter()
  for _ in range(rounds):
    runner()
    rss.append(_rss_kib())
    worker_rss.append(_worker_rss_kib())
  return collections.OrderedDict(
      setting=vars_of(setting), algorithm=name, data=data, rounds=rounds,
      seconds=time.perf_counter() - t0, rss_kib=rss, rss_first_kib=rss[0], rss_last_kib=rss[-1],
      peak_rss_kib=float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss),
      slope_second_half_kib_per_round=_second_half_slope(rss),
      worker_rss_kib=worker_rss, worker_rss_first_kib=worker_rss[0],
      worker_rss_last_kib=worker_rss[-1], worker_peak_rss_kib=max(worker_rss),
      worker_slope_second_half_kib_per_round=_second_half_slope(worker_rss),
      load_before=load_before, load_after=machine_info.load_average())


def memory_cohort_section(setting: bench_rounds.Setting, name: str, rounds: int, min_clients: int,
                          seed: int = 0):
  """Resident memory over `rounds` cohort rounds whose size is drawn from
  [min_clients, setting.clients] each round (the cohort program is
  traced once for every size, and padding, shards and metrics must not grow).

  The arrays of `setting.clients` clients are read once (as the workflow's
  ClientCache keeps them); round r trains on a random subset of them.
  """
  load_before = machine_info.load_average()
  algorithm, _ = bench_rounds.ALGORITHMS[name]
  process, reason = bench_cohort.build(algorithm, setting.task(),
                                       bench_rounds.run_config(name, setting),
                                       'cohort_vec' if setting.model != 'cnn' else 'cohort_seq')
  if process is None:
    raise SystemExit(f'memory: {name} runs per client ({reason})')
  arrays, _ = bench_cohort.client_arrays(setting)
  runner = bench_cohort.CohortRunner(process, 0.0, arrays, 0.0)
  rng = np.random.default_rng(seed)
  rss, sizes = [], []
  t0 = time.perf_counter()
  for _ in range(rounds):
    size = int(rng.integers(min_clients, setting.clients + 1))
    runner.arrays = [arrays[i] for i in rng.choice(setting.clients, size, replace=False)]
    runner()
    rss.append(_rss_kib())
    sizes.append(size)
  return collections.OrderedDict(
      setting=vars_of(setting), algorithm=name, execution=type(process).__name__,
      vectorized=process.vectorized, rounds=rounds, cohort_sizes=sizes,
      min_clients=min_clients, max_clients=setting.clients,
      seconds=time.perf_counter() - t0, rss_kib=rss, rss_first_kib=rss[0], rss_last_kib=rss[-1],
      peak_rss_kib=float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss),
      slope_second_half_kib_per_round=_second_half_slope(rss),
      slope_all_kib_per_round=float(np.polyfit(np.arange(len(rss)), rss, 1)[0]),
      padding_waste=process.shard_stats.waste,
      load_before=load_before, load_after=machine_info.load_average())

