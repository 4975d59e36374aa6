"""A run's TensorBoard scalars are the events TFF's release manager writes."""

import asyncio
import glob
import logging

import tensorflow as tf
import tensorflow_federated as tff
from tensorboard.compat.proto import event_pb2
from tensorflow.python.eager.polymorphic_function import polymorphic_function

from workflow.training import run_files
from workflow.training import together

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


def test_a_shared_batch_writes_each_runs_scalars_as_its_own_writer(tmp_path):
  """A population's members add their rounds to one batch, written by one call:
  each member's events are those its own writer writes, and none before the call."""
  batch = run_files.ScalarBatch()
  members = [run_files.TensorBoardScalars(str(tmp_path / f'm{m}'), batch) for m in range(3)]
  for metrics, round_num in ROUNDS:
    for m, member in enumerate(members):
      member.release({**metrics, 'member': m}, round_num)
    if round_num == 1:
      members[1]._writer.flush()  # pylint: disable=protected-access
      assert not _events(tmp_path / 'm1')
    batch.write()
  for m, member in enumerate(members):
    alone = run_files.TensorBoardScalars(str(tmp_path / f'alone{m}'))
    for metrics, round_num in ROUNDS:
      alone.release({**metrics, 'member': m}, round_num)
    member._writer.flush()  # pylint: disable=protected-access
    alone._writer.flush()  # pylint: disable=protected-access
    assert len(_events(tmp_path / f'm{m}')) == 10
    assert _events(tmp_path / f'm{m}') == _events(tmp_path / f'alone{m}')


def test_a_populations_writers_say_nothing_of_retracing(tmp_path, monkeypatch):
  """A function traced once per object (here each writer's own batch; in
  --together each seed's evaluator): TensorFlow calls that retracing from the
  fifth on, and --together's filter drops the line."""
  def warnings_of(members, quiet):
    # TensorFlow warns twice per function per process: a fresh count, as in bin/train.
    monkeypatch.setattr(polymorphic_function, '_frequent_tracing_detector_manager',
                        polymorphic_function._FrequentTracingDetectorManager())
    records, handler = [], logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger('tensorflow')
    # As a fresh bin/train process has it (an in-process --together run before
    # this test leaves its filter on the logger, other tests its level).
    filters, level = logger.filters, logger.level
    logger.filters, logger.level = [], logging.WARNING
    logger.addHandler(handler)
    try:
      if quiet:
        together.quiet_member_traces()
      for m in range(members):
        run_files.TensorBoardScalars(str(tmp_path / f'{quiet}{m}')).release(*ROUNDS[0])
    finally:
      logger.removeHandler(handler)
      logger.filters, logger.level = filters, level
    return [r.getMessage() for r in records if 'retracing' in r.getMessage()]

  assert warnings_of(6, quiet=False)  # what the filter is for
  assert not warnings_of(6, quiet=True)
