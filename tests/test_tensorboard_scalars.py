"""A run's TensorBoard scalars are the events TFF's release manager writes."""

import asyncio
import glob

import tensorflow as tf
import tensorflow_federated as tff
from tensorboard.compat.proto import event_pb2

from workflow.training import run_files

ROUNDS = [({'train/loss': 2.5, 'cost/steps': 40, 'note': 'text'}, 1),
          ({'train/loss': 1.25, 'cost/steps': 41, 'eval/accuracy': float('nan')}, 2),
          ({'train/loss': 0.5, 'cost/steps': 39, 'note': 'text'}, 3)]


def _events(log_dir):
  out = []
  for path in glob.glob(f'{log_dir}/events.out.tfevents.*'):
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
      event = event_pb2.Event.FromString(record)
      for value in event.summary.value:
        out.append((event.step, value.tag, value.metadata.plugin_data.plugin_name,
                    str(tf.make_ndarray(value.tensor))))
  return sorted(out)


def test_the_scalars_are_tffs(tmp_path):
  ours = run_files.TensorBoardScalars(str(tmp_path / 'ours'))
  theirs = tff.program.TensorBoardReleaseManager(str(tmp_path / 'tff'))
  for metrics, round_num in ROUNDS:
    ours.release(metrics, round_num)
    asyncio.run(theirs.release(metrics, key=round_num))
  ours._writer.flush()  # pylint: disable=protected-access
  theirs._summary_writer.flush()  # pylint: disable=protected-access
  events = _events(tmp_path / 'ours')
  assert len(events) == 7 and events == _events(tmp_path / 'tff')
