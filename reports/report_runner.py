"""Runs bin/train command lines for the reports, in worker processes that import TF/TFF once.

Each job is exactly a bin/train.py command line: its flags are parsed by
bin/train's own flag definitions and handed to `workflow.training.cli.run_training`,
which is all bin/train's `main()` does, so every run can be reproduced by
pasting the printed command. Used by `fedada2_report.py` and
`ce_fedavg_report.py`.
"""

import argparse
import csv
import importlib.util
import math
import multiprocessing
import os
import shlex
import signal
import time
from collections.abc import Sequence
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, 'bin', 'train.py')

_FLAGS = None
_PARENT = None


def _init_worker(parent: int):
  global _FLAGS, _PARENT
  _PARENT = parent
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
  spec = importlib.util.spec_from_file_location('bin_train', TRAIN)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)  # defines bin/train's flags; main() is not run
  # What bin/train's main() does first: any worker_binary TFF starts in this
  # process dies with it (a killed report run leaves none behind).
  from tff_adaptive.execution import runtime  # pylint: disable=g-import-not-at-top
  runtime.track_tff_workers()
  # A pool worker outlives a report run killed with SIGTERM or -9 (seen: two
  # orphans kept training into the run directories the next report run
  # resumed): it gets SIGTERM, which stops its run cleanly, when the parent dies.
  from tff_adaptive.execution import parent_death  # pylint: disable=g-import-not-at-top
  set_death_signal = parent_death.preexec_fn(signal.SIGTERM)
  if set_death_signal is not None:
    set_death_signal()
  if os.getppid() != _PARENT:  # the parent died before the signal was set
    os._exit(1)
  from absl import logging  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.WARNING)
  _FLAGS = module.FLAGS


def _train(args: Sequence[str]):
  from workflow import errors  # pylint: disable=g-import-not-at-top
  from workflow.training import cli  # pylint: disable=g-import-not-at-top
  _FLAGS.unparse_flags()
  _FLAGS(['bin/train.py', *args])
  from workflow.training import run_files  # pylint: disable=g-import-not-at-top
  first = run_files.newest_checkpoint(run_dir(args))  # where bin/train resumes
  started, cpu = time.monotonic(), time.process_time()
  try:  # what bin/train's main() does: presets and algorithm defaults, then the run
    settings, notes = cli.resolve_flags(_FLAGS)
    cli.run_training(settings, notes)
    status = attempt_status(0)
  except errors.RunError as e:
    errors.report(e)
    status = attempt_status(e.exit_code)
  return tuple(args), status, time.monotonic() - started, time.process_time() - cpu, first


def attempt_status(exit_code: int) -> str:
  """An attempt's status in wall_clock.csv from bin/train's exit status (1: diverged or
  failed; 2: bad flags or files)."""
  return 'ok' if exit_code == 0 else 'diverged' if exit_code == 1 else f'exit {exit_code}'


def command_line(args: Sequence[str]) -> str:
  return ' '.join(['.venv/bin/python bin/train.py', *map(shlex.quote, args)])


def finished(args: Sequence[str]) -> bool:
  """Whether the run's metrics.csv already holds its last round (bin/train would do nothing)."""
  try:
    rounds = read_columns(args).get('round', [])
  except FileNotFoundError:
    return False
  return bool(rounds) and rounds[-1] >= int(flag(args, 'total_rounds'))


def run_all(jobs: Sequence[Sequence[str]], processes: int = 2) -> dict[tuple, str]:
  """Runs every job (a list of bin/train flags); returns {tuple(args): status}.

  A job whose run directory already holds all its rounds is not started again
  (bin/train would only resume it to the same end).
  """
  results = {tuple(j): 'ok' for j in jobs if finished(j)}
  todo = [list(j) for j in jobs if tuple(j) not in results]
  for args in results:
    print(f'  [done before] {command_line(args)}', flush=True)
  if not todo:
    return results
  ctx = multiprocessing.get_context('spawn')
  with ctx.Pool(processes, initializer=_init_worker, initargs=(os.getpid(),),
                maxtasksperchild=8) as pool:
    # CPU seconds are this process's only; TFF's C++ worker runs in a child process.
    for args, status, seconds, cpu, first in pool.imap_unordered(_train, todo):
      print(f'  [{status}, {seconds:.0f}s wall, {cpu:.0f}s CPU, from round {first}] '
            f'{command_line(args)}', flush=True)
      log_attempt(args, status, seconds, cpu, first)
      results[args] = status
  return results


WALL_CLOCK = 'wall_clock.csv'
_WALL_CLOCK_HEAD = ['ended_utc', 'status', 'wall_seconds', 'cpu_seconds', 'first_round']


def log_attempt(args: Sequence[str], status: str, seconds: float, cpu: float,
                first_round: Optional[int] = None) -> None:
  """Appends one attempt of a run (a start of bin/train that returned) to its
  directory's wall_clock.csv: the report's wall-clock per run, evaluation and
  start-up included, and the round it resumed from, so that its CPU seconds
  can be read per round. An attempt killed with its pool is not there. A file
  written before `first_round` was logged gets the column, empty in its rows."""
  path = os.path.join(run_dir(args), WALL_CLOCK)
  if not os.path.isdir(os.path.dirname(path)):
    return  # refused before it made its directory
  rows = read_attempts(path)
  rows.append({'ended_utc': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
               'status': status, 'wall_seconds': f'{seconds:.1f}', 'cpu_seconds': f'{cpu:.1f}',
               'first_round': '' if first_round is None else str(first_round)})
  with open(path + '.tmp', 'w', newline='') as f:
    writer = csv.DictWriter(f, _WALL_CLOCK_HEAD)
    writer.writeheader()
    writer.writerows({k: row.get(k) or '' for k in _WALL_CLOCK_HEAD} for row in rows)
  os.replace(path + '.tmp', path)


def read_attempts(path: str) -> list[dict]:
  """The rows of a wall_clock.csv ([] if there is none)."""
  try:
    with open(path, newline='') as f:
      return list(csv.DictReader(f))
  except FileNotFoundError:
    return []


def seconds_per_run(args: Sequence[str], field: str = 'cpu_seconds') -> Optional[float]:
  """`field` ('cpu_seconds' or 'wall_seconds') of the whole run, read from the
  logged attempt that finished it (status ok) and the round it resumed from:
  its value × total rounds / the rounds it ran (an attempt stopped with its
  pool is not logged, so a resumed run is scaled from its last attempt);
  None if no such attempt was logged."""
  rows = read_attempts(os.path.join(run_dir(args), WALL_CLOCK))
  done = [r for r in rows if r['status'] == 'ok' and (r.get('first_round') or '').isdigit()]
  if not done:
    return None
  total = int(flag(args, 'total_rounds'))
  ran = total - int(done[-1]['first_round'])
  return float(done[-1][field]) * total / ran if ran > 0 else None


def flag(args: Sequence[str], name: str) -> str:
  return next(a.split('=', 1)[1] for a in args if a.startswith(f'--{name}='))


def build_dir(runs_dir: str, train_fraction: float) -> str:
  """Where a report keeps its Shakespeare build of one split: data90 for 90/10."""
  return os.path.join(runs_dir, f'data{round(100 * train_fraction)}')


def run_dir(args: Sequence[str]) -> str:
  return os.path.join(flag(args, 'root_output_dir'), flag(args, 'experiment_name'))


def read_csv_columns(path: str) -> dict[str, list[float]]:
  """A metrics.csv as columns of floats (NaN where a round has no value)."""
  with open(path, newline='') as f:
    rows = list(csv.DictReader(f))
  columns = {}
  for row in rows:
    for key, value in row.items():
      columns.setdefault(key, []).append(float(value) if value not in (None, '') else math.nan)
  return columns


def read_columns(args: Sequence[str]) -> dict[str, list[float]]:
  """The run's metrics.csv as columns (`read_csv_columns`)."""
  return read_csv_columns(os.path.join(run_dir(args), 'metrics.csv'))


def report_parser(doc: str, runs_dir: str) -> argparse.ArgumentParser:
  """A report script's parser: --runs_dir, --out_dir (reports/) and --jobs."""
  parser = argparse.ArgumentParser(description=doc.split('\n')[0])
  parser.add_argument('--runs_dir', default=runs_dir)
  parser.add_argument('--out_dir', default=os.path.join(ROOT, 'reports'))
  parser.add_argument('--jobs', type=int, default=2, help='worker processes')
  return parser


def write_report(lines: Sequence[str], path: str) -> None:
  """Writes a report's markdown lines and prints where."""
  with open(path, 'w') as f:
    f.write('\n'.join(lines))
  print(path)


def report_head(title: str, name: str, runs_dir: str, minutes: float, jobs: int) -> list[str]:
  """A report's title, how `reports/<name>_report.py` made it, and its setting's heading."""
  generated = (
      f'Generated by `reports/{name}_report.py`; regenerate with `reports/make_{name}.sh` '
      f'(= `.venv/bin/python reports/{name}_report.py --runs_dir={runs_dir}`). '
      f'This run: {minutes:.0f} minutes wall clock with {jobs} worker processes on a '
      'shared 2-core machine. Every run is a bin/train command line, listed at the end.')
  return [f'# {title}', '', generated, '', '## Setting', '']


def write_with_commands(lines: Sequence[str], jobs: dict, statuses: dict, path: str) -> None:
  """Writes a report whose last section lists its runs' commands (`commands_section`)."""
  write_report(list(lines) + commands_section(jobs, statuses), path)


def commands_section(jobs: dict, statuses: dict) -> list[str]:
  """A report's last section: each job's bin/train command line and its status."""
  return (['', '## Commands', '']
          + [f'- `{command_line(args)}` ({statuses.get(tuple(args))})' for args in jobs.values()]
          + [''])


def points(columns, x: str, y: str):
  """(x, y) pairs where y is present (evaluations happen every few rounds)."""
  return [(a, b) for a, b in zip(columns[x], columns[y]) if not math.isnan(b)]


def first_round_reaching(columns, metric: str, target: float):
  """The first evaluated round whose `metric` ≥ target, or None."""
  for r, value in points(columns, 'round', metric):
    if value >= target:
      return int(r)
  return None
