"""Plots metrics CSVs written by bin/train as PNG curves.

Example:
  bin/plot.py --runs=runs/digits_fedavg,runs/digits_fedadam --out=cmp.png
  bin/plot.py --runs=... --x=cost/cumulative_upload_bits --out=bits.png

Each run is an experiment directory (with metrics.csv) or a CSV path; label
with --labels (default: directory names). One figure, one panel per metric.
"""

import os
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Before anything imports TensorFlow: its C++ start-up log only when asked
# (TF_CPP_MIN_LOG_LEVEL set by the caller wins; docs/training.md).
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
# pylint: disable=g-import-not-at-top
from tff_adaptive.execution import runtime
from workflow.reporting import plotting
from workflow.training import cli

flags.DEFINE_list('runs', [], 'Experiment directories or metrics CSV files.')
flags.DEFINE_list('labels', [], 'Legend labels, one per run (default: directory names).')
flags.DEFINE_string('x', 'round', 'X axis column: round, or a cumulative cost column such as '
                    'cost/cumulative_upload_bits or cost/cumulative_client_flops.')
flags.DEFINE_list('metrics', ['eval/accuracy', 'eval/loss'], 'Y columns, one panel each.')
flags.DEFINE_string('out', 'plot.png', 'Output PNG path.')
flags.DEFINE_string('title', '', 'Figure title.')
FLAGS = flags.FLAGS


def main(argv):
  del argv
  runtime.shut_down_tff_at_exit()  # quiet exit if anything imported TFF
  try:
    path = plotting.plot_runs(FLAGS.runs, FLAGS.out, x=FLAGS.x, metrics=FLAGS.metrics,
                              labels=FLAGS.labels or None, title=FLAGS.title)
  except ValueError as e:
    print(f'plot: error: {e}', file=sys.stderr)
    sys.exit(2)
  print(path)


if __name__ == '__main__':
  app.run(main, flags_parser=cli.flags_parser('plot'))
