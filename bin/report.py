"""Aggregates a sweep into a markdown table with confidence intervals, costs to a target, curves.

Examples:
  bin/report.py --sweep_dir=runs/lr_sweep --out=reports/lr_sweep.md --target=0.9 \
      --x=round,cost/cumulative_upload_bits,cost/cumulative_client_flops,sim/cumulative_minutes
  bin/report.py --reproduction --sweep_dir=runs/reproduction --out=reports/reproduction.md

The table gives, per group, the best configuration (selection rule as in
bin/sweep.py), its score as mean ± 95% Student-t CI over seeds, and the rounds,
upload bits, client FLOPs and simulated minutes each seed needed to reach
--target. The figure (<out stem>_curves.png) shows each group's mean curve with
its CI band against every --x column.

--reproduction writes reports/reproduction.md: every figure of the source papers
that can be recomputed without their datasets, next to the paper's value, and
the papers' qualitative claims checked on the sweep (bin/reproduce_report.sh
runs the sweep and then this).
"""

import os
import shlex
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
# pylint: disable=g-import-not-at-top,unused-import
if any(a.startswith('--reproduction') for a in sys.argv[1:]):
  # The reproduction builds Keras models: TensorFlow must be imported before
  # absl's app.run (see bin/train.py); plain reports do not need it.
  import tensorflow as tf
from tff_adaptive.execution import runtime
from workflow.reporting import report
from workflow.sweeps import selection
from workflow.sweeps import sweep
from workflow.training import cli

flags.DEFINE_string('sweep_dir', '', 'Sweep directory written by bin/sweep.py.')
flags.DEFINE_string('out', '', 'Markdown output path (figures are written next to it).')
flags.DEFINE_string('select_metric', 'eval/accuracy', 'metrics.csv column to score.')
flags.DEFINE_string('select_rule', 'last_mean:3', 'last_mean:N | max | min | final.')
flags.DEFINE_enum('select_mode', 'max', ['max', 'min'], 'Whether larger scores are better.')
flags.DEFINE_float('target', None, 'Target value of --select_metric for the costs-to-target '
                   'columns (omit: no such columns).')
flags.DEFINE_list('x', ['round', 'cost/cumulative_upload_bits'], 'X axes of the figure panels: '
                  f'any metrics.csv column, e.g. {", ".join(report.COST_AXES)}.')
flags.DEFINE_float('confidence', 0.95, 'Confidence level of the intervals.')
flags.DEFINE_bool('all_configs', True, 'Also list every configuration\'s score.')
flags.DEFINE_string('title', '', 'Report title.')
flags.DEFINE_bool('reproduction', False, 'Write the reproduction report (see module doc).')
flags.DEFINE_bool('with_processes', True, '--reproduction: also measure the communication '
                  'tables on real learning processes (a few minutes).')
flags.DEFINE_float('sweep_minutes', None, '--reproduction: the sweep\'s wall time, to quote.')
FLAGS = flags.FLAGS


def regenerate_command() -> str:
  """The command line this report was made with, as run (interpreter, script, flags), quoted."""
  argv = list(getattr(sys, 'orig_argv', None) or [sys.executable, *sys.argv])
  return shlex.join(argv)


def _fail(message: str):
  print(f'report: error: {message}', file=sys.stderr)
  sys.exit(2)


def main(argv):
  runtime.shut_down_tff_at_exit()  # --reproduction imports TFF: a quiet exit
  if len(argv) > 1:
    _fail(f'unexpected arguments: {" ".join(argv[1:])}')
  if not FLAGS.sweep_dir:
    _fail('--sweep_dir is required')
  if not 0 < FLAGS.confidence < 1:
    _fail(f'--confidence must be in (0, 1); got {FLAGS.confidence}')
  if FLAGS.reproduction:
    from workflow.reproduction import render
    out = FLAGS.out or 'reports/reproduction.md'
    render.write_reproduction_report(
        out, FLAGS.sweep_dir, target=0.85 if FLAGS.target is None else FLAGS.target,
        select_rule=FLAGS.select_rule, metric=FLAGS.select_metric,
        with_processes=FLAGS.with_processes, sweep_minutes=FLAGS.sweep_minutes,
        progress=lambda m: print(f'report: {m}', file=sys.stderr, flush=True))
    print(out)
    return
  if not FLAGS.out:
    _fail('--out is required')
  try:
    rule = selection.parse_rule(FLAGS.select_rule, FLAGS.select_metric, FLAGS.select_mode)
    command = regenerate_command()
    report.write_sweep_report(FLAGS.sweep_dir, FLAGS.out, rule, FLAGS.target, FLAGS.x,
                              FLAGS.title, FLAGS.confidence, FLAGS.all_configs, command)
  except (sweep.SpecError, ValueError) as e:
    _fail(str(e))
  print(FLAGS.out)


if __name__ == '__main__':
  app.run(main, flags_parser=cli.flags_parser('report'))
