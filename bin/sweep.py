"""Runs a grid (or a list of grids) of bin/train trials over seeds, in parallel, resumably.

Examples:
  bin/sweep.py --sweep_dir=runs/lr_sweep --num_seeds=3 --max_parallel=2 \
      --fixed='task=digits;algorithm=fedadam;total_rounds=50;local_steps=10' \
      --grid='client_learning_rate=0.03,0.1;server_learning_rate=0.003,0.01'
  bin/sweep.py --sweep_dir=runs/reproduction --spec=reports/reproduction_grid.txt --num_seeds=2

Each trial is `bin/train.py <fixed> <grid flags> --seed=S` in
<sweep_dir>/trials/<name> (log: <sweep_dir>/logs/<name>.log). Rerunning the
same command skips finished trials and resumes interrupted ones from their
checkpoints (trials that diverged are skipped unless --retry_diverged); a
failing trial does not stop the others (exit status 1 at the end, with the
failures listed). At the end the best configuration of each
group is printed, chosen by --select_metric/--select_rule/--select_mode.
Spec syntax: workflow/sweeps/sweep.py and docs/sweeps.md.
"""

import os
import signal
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')  # TF's C++ log only when asked
# pylint: disable=g-import-not-at-top
from tff_adaptive.execution import runtime
from workflow.sweeps import selection
from workflow.sweeps import sweep
from workflow.sweeps import sweep_runner
from workflow.training import cli

flags.DEFINE_string('sweep_dir', '', 'Directory of the sweep (trials/, logs/, sweep.json).')
flags.DEFINE_string('grid', '', "Grid(s): 'name=v1,v2;name=v1' ; groups separated by '|', "
                    "optionally labelled 'label: name=...'.")
flags.DEFINE_string('spec', '', 'Spec file: [label] headers and `name = v1, v2` lines (flags '
                    'before the first header apply to every group).')
flags.DEFINE_string('fixed', '', "Flags for every trial: 'name=value;name=value'.")
flags.DEFINE_integer('num_seeds', 1, 'Seeds 0..N-1 per configuration.')
flags.DEFINE_string('seeds', '', 'Explicit comma-separated seeds (overrides --num_seeds).')
flags.DEFINE_integer('max_parallel', 1, 'Trials run at the same time.')
flags.DEFINE_string('select_metric', 'eval/accuracy', 'metrics.csv column to select by.')
flags.DEFINE_string('select_rule', 'last_mean:3', 'last_mean:N | max | min | final (per seed; '
                    'then averaged over seeds).')
flags.DEFINE_enum('select_mode', 'max', ['max', 'min'], 'Whether larger scores are better.')
flags.DEFINE_bool('together', True, 'Run the trials that differ only in '
                  f'{", ".join(f"--{flag}" for flag in sweep_runner.TOGETHER)} and --seed as '
                  'one bin/train process (bin/train --together: a population, one program '
                  'over member x client); each trial keeps its own directory and files. A '
                  'group bin/train refuses to run together runs apart. --notogether: every '
                  'trial its own process.')
flags.DEFINE_bool('retry_diverged', False, 'Run again the trials whose last run diverged '
                  '(their diverged.json); by default a rerun reports them and skips them.')
flags.DEFINE_bool('dry_run', False, 'List the trials (and which are finished) without running.')
FLAGS = flags.FLAGS


def _fail(message: str):
  print(f'sweep: error: {message}', file=sys.stderr)
  sys.exit(2)


def _interrupt(signum, frame):
  del signum, frame
  raise KeyboardInterrupt


def main(argv):
  runtime.shut_down_tff_at_exit()  # quiet exit if a flag check imported TFF
  if len(argv) > 1:
    _fail(f'unexpected arguments: {" ".join(argv[1:])}')
  try:
    if not FLAGS.sweep_dir:
      raise sweep.SpecError('--sweep_dir is required')
    if bool(FLAGS.grid) == bool(FLAGS.spec):
      raise sweep.SpecError('give exactly one of --grid and --spec')
    sweep.check_sweep_dir(FLAGS.sweep_dir)
    groups = sweep.parse_grid(FLAGS.grid) if FLAGS.grid else sweep.parse_spec_file(FLAGS.spec)
    fixed = sweep.parse_fixed(FLAGS.fixed)
    trials = sweep.expand(groups, sweep.parse_seeds(FLAGS.num_seeds, FLAGS.seeds), fixed)
    rule = selection.parse_rule(FLAGS.select_rule, FLAGS.select_metric, FLAGS.select_mode)
  except sweep.SpecError as e:
    _fail(str(e))
  # SIGTERM as Ctrl-C: the running trials are stopped cleanly (resumable).
  signal.signal(signal.SIGTERM, _interrupt)
  if FLAGS.dry_run:
    for t in trials:
      where, _ = sweep.standing(FLAGS.sweep_dir, t, fixed, FLAGS.retry_diverged)
      print(f'{where:8s} [{t.group}] {t.name}')
    return
  try:
    outcomes = sweep_runner.run_sweep(trials, FLAGS.sweep_dir, fixed=fixed,
                                      max_parallel=FLAGS.max_parallel, together=FLAGS.together,
                                      retry_diverged=FLAGS.retry_diverged)
  except sweep.SpecError as e:
    _fail(str(e))
  except KeyboardInterrupt:
    print('sweep: interrupted; rerun the same command to resume', file=sys.stderr)
    sys.exit(130)
  results, _ = selection.load_results(FLAGS.sweep_dir)
  names = {t.name for t in trials}
  ran = [r for r in results if r.trial.name in names]
  print(selection.selection_report(selection.summarize(ran, rule), rule))
  failures = sweep_runner.failure_report(outcomes)
  if failures:
    print(failures, file=sys.stderr)
    sys.exit(1)


if __name__ == '__main__':
  app.run(main, flags_parser=cli.flags_parser('sweep'))
