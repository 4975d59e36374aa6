"""A run's hyperparameters for TensorBoard's HParams dashboard.

bin/train's metrics reach TensorBoard as TF2 scalar summaries (tensor tags)
as `tff.program.TensorBoardReleaseManager` writes them, in `<run>/tensorboard`. This
module adds, in the same directory, the run's flags as an HParams session
(`tensorboard.plugins.hparams.api.hparams`), so that `tensorboard
--logdir=<sweep or runs dir>` lists the runs in the HParams table with their
settings beside their final `eval/*` and `train/*` metrics.
"""

import os
from typing import Any

from workflow.flags import config

# Where the run writes and how it is executed: not hyperparameters.
NOT_HPARAMS = frozenset({'root_output_dir', 'experiment_name', 'data_dir', 'client_state_dir',
                         'show_progress', 'workers', 'worker_retry', 'data_on_workers',
                         'execution_concurrency', 'intra_op_threads'})


def hparam_values(settings: config.Settings) -> dict[str, Any]:
  """The run's flags as HParams values (bool, int, float or str; unset flags left out)."""
  values = {}
  # The HParams table has one column per flag, whatever its group: the flat view.
  for name, value in sorted(settings.flag_values().items()):
    if name in NOT_HPARAMS or value is None:
      continue
    values[name] = value if isinstance(value, (bool, int, float, str)) else str(value)
  return values


def write_hparams(run_dir: str, settings: config.Settings) -> str:
  """Writes the HParams session of a run into `<run_dir>/tensorboard`; returns that directory."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorboard.plugins.hparams import api as hp  # pylint: disable=g-import-not-at-top
  logdir = os.path.join(run_dir, 'tensorboard')
  writer = tf.summary.create_file_writer(logdir)
  try:
    with writer.as_default():
      hp.hparams(hparam_values(settings), trial_id=os.path.basename(os.path.normpath(run_dir)))
    writer.flush()
  finally:
    writer.close()
  return logdir


def read_hparams(logdir: str) -> dict[str, Any]:
  """The HParams session written in `logdir` ({} if none): for tests and tools."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorboard.plugins.hparams import metadata  # pylint: disable=g-import-not-at-top
  found = {}
  for name in sorted(os.listdir(logdir)):
    if 'tfevents' not in name:
      continue
    for event in tf.compat.v1.train.summary_iterator(os.path.join(logdir, name)):
      for value in event.summary.value:
        if (value.metadata.plugin_data.plugin_name == metadata.PLUGIN_NAME and
            value.tag == metadata.SESSION_START_INFO_TAG):
          info = metadata.parse_session_start_info_plugin_data(
              value.metadata.plugin_data.content)
          for key, hparam in info.hparams.items():
            kind = hparam.WhichOneof('kind')
            found[key] = getattr(hparam, kind)
  return found
