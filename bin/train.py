r"""Federated training of any tff_adaptive algorithm on any task.

Example:
  bin/train.py --task=digits --algorithm=fedadam --total_rounds=100 \
      --client_learning_rate=0.1 --server_learning_rate=0.01

Every --algorithm runs with only that flag given (its paper defaults are
printed at start); flags given explicitly win. Writes to
<root_output_dir>/<experiment_name>/ (default name: <task>_<algorithm> and the
flags that differ from their defaults): flags.json, metrics.csv, tensorboard/,
checkpoints/. Rerunning the same command resumes.
"""

import os
import signal
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')  # TF's C++ start-up noise

# pylint: disable=g-import-not-at-top
from tff_adaptive.execution import runtime  # imports neither TensorFlow nor TFF
# Before anything can import TFF. Its import sets TFF's default context, whose
# ServiceManager prints "Exception ignored in ... __del__ ... 'Popen'" at
# interpreter teardown unless this exit handler has disarmed it; and the flag
# checks of `parse_flags` import the user's --task module (which may import
# TFF) and exit 2 before main() runs, so a handler registered in main() missed
# every refusal of such a task.
runtime.shut_down_tff_at_exit()
from workflow import errors
from workflow.flags import train_flags
from workflow.flags import train_help
from workflow.training import cli
from workflow.training import together

train_flags.define_flags()  # the table of workflow/flags/train_flags.py, in groups
FLAGS = flags.FLAGS
_RESOLVED = []  # (settings, notes) of the parsed command line, for main()


def parse_flags(argv):
  """absl's parser for bin/train: --help and every refusal before TensorFlow loads.

  The flag table, the registries' names and every check of the settings load
  without TensorFlow, so `--help` and a refused command (one line, exit 2)
  answer at once.
  """
  if cli.wants_help(argv):
    sys.stdout.write(train_help.grouped_help(os.path.basename(argv[0]), __doc__))
    sys.exit(0)
  try:
    rest = cli.parse_flags(argv, FLAGS)
    if len(rest) > 1:
      raise errors.UsageError(f'unexpected arguments: {" ".join(rest[1:])}')
    settings, notes = cli.resolve_flags(FLAGS)
    members = together.members_of(settings, FLAGS, cli.config_from_args)
    for member, _ in members or [(settings, notes)]:
      cli.check_settings(member)
  except errors.UsageError as e:
    sys.exit(errors.report(e))
  _RESOLVED.append((settings, notes, members))
  # TensorFlow loads here, before absl calls main(): imported inside main(),
  # Keras 2.14 builds Sequential models from plain tensors and fails.
  import tensorflow  # pylint: disable=unused-import
  return rest


def main(argv):
  del argv  # parse_flags refused any left over
  # First: from here on TFF's workers are tracked, whichever way this program ends.
  runtime.track_tff_workers()
  try:
    cli.run_training(*_RESOLVED[-1])  # settings, notes, --together's members
  except errors.RunError as e:
    sys.exit(errors.report(e))


if __name__ == '__main__':
  try:
    app.run(main, flags_parser=parse_flags)
  except KeyboardInterrupt:  # while TensorFlow or TFF loads, before the run's own handlers
    sys.exit(errors.report(cli.stopped_before_start(signal.SIGINT)))
