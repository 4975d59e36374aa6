"""A run's files: checkpoints, metrics.csv and TensorBoard events, and their recovery.

`recover` finds the newest checkpoint that loads (partial saves removed,
damaged ones set aside); `MetricsFile` and `trim_tensorboard` keep the
metrics consistent with it, so a crash, Ctrl-C or full disk loses no more than
the rounds since the last intact checkpoint and never duplicates a round.
docs/reliability.md lists what is guaranteed and each failure's message.
The training loop (workflow/training/program.py) uses them.
"""

import csv
import glob
import io
import os
import shutil
import sys
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from workflow.training import run_dir


class IncompatibleCheckpoint(ValueError):
  """A checkpoint whose state cannot be this process's state."""


async def _load_checkpoint(state_manager, output_dir: str, version: int, structure):
  """Loads checkpoint `version` into `structure`.

  Containers may differ (a list saved where the process now has a tuple, as
  MFL's state did before it kept s_0's containers): the values are then
  matched leaf by leaf, which needs the same number, order and shapes of
  leaves. Anything else is a checkpoint of another program version or
  configuration, reported in one line instead of TFF's structure dump.
  """
  from tensorflow_federated.python.program import file_utils  # pylint: disable=g-import-not-at-top
  try:
    return await state_manager.load(version, structure)
  except (ValueError, TypeError):
    pass
  path = os.path.join(output_dir, 'checkpoints', f'program_state_{version}')
  saved = tf.nest.flatten(await file_utils.read_saved_model(path))
  expected = tf.nest.flatten(structure)
  if len(saved) == len(expected) and all(
      np.shape(a) == np.shape(b) for a, b in zip(saved, expected)):
    return tf.nest.pack_sequence_as(structure, saved)
  raise IncompatibleCheckpoint(
      f'{path} (round {version}) does not hold this run\'s state ({len(saved)} saved values '
      f'for {len(expected)} expected): it was written by another version of tff_adaptive. '
      f'Use another --experiment_name or --root_output_dir, or delete {output_dir} to start '
      'over.')


class NoIntactCheckpoint(RuntimeError):
  """Checkpoints exist but none of them loads."""


def newest_checkpoint(output_dir: str) -> int:
  """The round of the newest checkpoint in `output_dir` (0: none).

  TFF writes a checkpoint to `program_state_N_temp*` and renames it when
  complete, so every `program_state_N` is whole (a damaged one is set aside
  as `.damaged` by `recover` at the next start).
  """
  try:
    names = os.listdir(os.path.join(output_dir, 'checkpoints'))
  except OSError:
    return 0
  prefix = 'program_state_'
  return max((int(n[len(prefix):]) for n in names
              if n.startswith(prefix) and n[len(prefix):].isdigit()), default=0)


def checkpoint_phrase(output_dir: str) -> str:
  """'the last checkpoint is after round N (DIR/checkpoints/program_state_N)' or 'no checkpoint'.

  Read from the disk at the moment of the message: whatever the loop noted,
  this names the checkpoint a rerun resumes from.
  """
  last_checkpoint = newest_checkpoint(output_dir)
  if last_checkpoint <= 0:
    return f'no checkpoint was kept in {output_dir} (a rerun starts at round 1)'
  path = os.path.join(output_dir, 'checkpoints', f'program_state_{last_checkpoint}')
  return f'the last checkpoint is after round {last_checkpoint} ({path})'


def first_line(error: BaseException, limit: int = 160) -> str:
  text = (str(error).strip().splitlines() or [''])[0]
  text = text if len(text) <= limit else text[:limit - 3] + '...'
  return f'{type(error).__name__}: {text}' if text else type(error).__name__


def warn(message: str) -> None:
  print(f'warning: {message}', file=sys.stderr, flush=True)


def remove_partial_checkpoints(checkpoint_dir: str) -> list[str]:
  """Removes `program_state_N_temp*` directories (a save cut short); returns their names."""
  removed = []
  for path in sorted(glob.glob(os.path.join(glob.escape(checkpoint_dir), 'program_state_*_temp*'))):
    shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else _remove_quietly(path)
    removed.append(os.path.basename(path))
  return removed


def _remove_quietly(path: str) -> None:
  try:
    os.remove(path)
  except OSError:
    pass


def _set_aside(path: str) -> str:
  """Renames `path` to `path.damaged` (or .damaged2, ...); returns the new name."""
  target, n = f'{path}.damaged', 1
  while os.path.exists(target):
    n += 1
    target = f'{path}.damaged{n}'
  os.rename(path, target)
  return target


async def recover(state_manager, output_dir: str, structure) -> tuple[int, Any]:
  """(round, program state) of the newest checkpoint that loads; (0, None) if none exists.

  Partial saves (`program_state_N_temp*`) are removed. A checkpoint that does
  not load (truncated, garbled or missing files, an empty or stray directory)
  is renamed to `program_state_N.damaged` with a one-line warning once an
  older one loads; if none loads, nothing is renamed and `NoIntactCheckpoint`
  says what to do. A checkpoint that loads but holds another program's state
  raises `IncompatibleCheckpoint` (a configuration error, not damage).
  """
  checkpoint_dir = os.path.join(output_dir, 'checkpoints')
  removed = remove_partial_checkpoints(checkpoint_dir)
  if removed:
    warn(f'removed {len(removed)} partial checkpoint(s) left by an interrupted save in '
         f'{checkpoint_dir} ({", ".join(removed)})')
  versions = await state_manager.get_versions() or []
  failures = []
  for version in reversed(versions):
    try:
      loaded = await _load_checkpoint(state_manager, output_dir, version, structure)
    except IncompatibleCheckpoint:
      raise
    except Exception as e:  # pylint: disable=broad-except  (any damage: TF, protobuf, OS errors)
      failures.append((version, e))
      continue
    for bad, error in failures:
      path = os.path.join(checkpoint_dir, f'program_state_{bad}')
      moved = _set_aside(path)
      warn(f'checkpoint {path} does not load ({first_line(error)}); set aside as '
           f'{os.path.basename(moved)}; resuming from the one after round {version}')
    return version, loaded
  if failures:
    rounds = ', '.join(str(v) for v, _ in reversed(failures))
    raise NoIntactCheckpoint(
        f'none of the checkpoints in {checkpoint_dir} loads (rounds {rounds}; newest: '
        f'{first_line(failures[0][1])}): restore that directory from a copy, or move it '
        f'away to start the run over from round 1')
  return 0, None


_METRICS_KEY = 'round'


class MetricsFile:
  """metrics.csv: one row per round, appended and flushed as each round ends.

  Same format as `tff.program.CSVFileReleaseManager` (a `round` key column,
  columns in order of first appearance, values as Python writes floats) but
  written so that it cannot be lost: appends go to the end of the file and a
  failed append is cut off again; a rewrite (new columns, dropped rows) goes
  to a temporary file renamed over the old one. `open_at(round)` keeps the
  readable rows up to that round (a damaged file is rebuilt from them, or
  moved aside if it has no readable header).
  """

  def __init__(self, path: str):
    self._path = path
    self._fieldnames: list[str] = [_METRICS_KEY]
    self._rows: list[dict[str, str]] = []
    self._must_rewrite = False

  @property
  def rounds(self) -> list[int]:
    return [int(r[_METRICS_KEY]) for r in self._rows]

  def open_at(self, start_round: int) -> None:
    path = self._path
    if not os.path.exists(path):
      if start_round > 0:
        warn(f'{path} is missing: the rows of rounds 1-{start_round} are lost (the checkpoint '
             f'holds the model, not the metrics); rows from round {start_round + 1} on are written')
      self._rewrite()
      return
    damage = None
    try:
      with open(path, 'rb') as f:
        text = f.read().decode('utf-8')
      if '\0' in text:
        raise ValueError('binary data')
      reader = csv.reader(io.StringIO(text, newline=''))
      header = next(reader, None)
      if not header or header[0] != _METRICS_KEY or len(set(header)) != len(header):
        raise ValueError('no "round" header')
      rows, last = [], 0
      complete = text.endswith('\n')
      lines = list(reader)
      for i, values in enumerate(lines):
        if i == len(lines) - 1 and not complete:
          damage = damage or 'its last line is cut off'
          break
        try:
          round_num = int(values[0])
        except (ValueError, IndexError):
          damage = damage or f'an unreadable row after round {last}'
          continue
        if len(values) != len(header) or round_num <= last:
          damage = damage or f'a malformed row after round {last}'
          continue
        last = round_num
        if round_num <= start_round:
          rows.append(dict(zip(header, values)))
    except (OSError, UnicodeDecodeError, ValueError, csv.Error) as e:
      moved = _set_aside(path)
      warn(f'{path} is unreadable ({first_line(e)}); moved aside as {os.path.basename(moved)}; '
           f'a new one starts' + (f' at round {start_round + 1}' if start_round else ''))
      self._rewrite()
      return
    self._fieldnames, self._rows = header, rows
    if damage:
      warn(f'{path} was damaged ({damage}); rebuilt from its {len(rows)} readable rows')
    if damage or len(rows) != len(lines):
      self._rewrite()

  def release(self, row: Mapping[str, Any], round_num: int) -> None:
    values = {_METRICS_KEY: str(round_num)}
    for key, value in row.items():
      value = np.array(value).tolist()
      values[key] = '' if value is None else str(value)
    while self._rows and int(self._rows[-1][_METRICS_KEY]) >= round_num:
      self._rows.pop()  # a replayed round replaces its row
      self._must_rewrite = True
    new_fields = [k for k in values if k not in self._fieldnames]
    rewrite = bool(new_fields) or self._must_rewrite
    self._fieldnames = self._fieldnames + new_fields
    self._rows.append(values)
    if rewrite:
      try:
        self._rewrite()
      except BaseException:
        self._rows.pop()
        raise
      self._must_rewrite = False
      return
    size = os.path.getsize(self._path)
    try:
      with run_dir.write_text(self._path, 'a') as f:
        csv.DictWriter(f, fieldnames=self._fieldnames).writerow(values)
        f.flush()
        os.fsync(f.fileno())
    except BaseException:
      self._rows.pop()
      try:  # no half row left behind
        os.truncate(self._path, size)
      except OSError:
        pass
      raise

  def _rewrite(self) -> None:
    temp = f'{self._path}.tmp'
    try:
      with run_dir.write_text(temp) as f:
        writer = csv.DictWriter(f, fieldnames=self._fieldnames)
        writer.writeheader()
        writer.writerows(self._rows)
        f.flush()
        os.fsync(f.fileno())
      os.replace(temp, self._path)
    except BaseException:
      _remove_quietly(temp)
      raise


class Releases:
  """A run's metrics.csv and TensorBoard scalars, keyed by round, opened at the
  checkpoint's round (what later rounds wrote is dropped)."""

  def __init__(self, output_dir: str, start_round: int, scalars: 'ScalarBatch'):
    self.csv = MetricsFile(os.path.join(output_dir, 'metrics.csv'))
    self.csv.open_at(start_round)
    tensorboard_dir = os.path.join(output_dir, 'tensorboard')
    trim_tensorboard(tensorboard_dir, start_round)
    self._tensorboard = TensorBoardScalars(tensorboard_dir, scalars)

  def release(self, metrics: Mapping[str, Any], round_num: int) -> None:
    self.csv.release(metrics, round_num)
    self._tensorboard.release(metrics, round_num)


def trim_tensorboard(log_dir: str, last_round: int) -> None:
  """Drops events of rounds after `last_round` (and cut-off records) from the event files."""
  from tensorboard.compat.proto import event_pb2  # pylint: disable=g-import-not-at-top
  for path in sorted(glob.glob(os.path.join(glob.escape(log_dir), '**', 'events.out.tfevents.*'),
                               recursive=True)):
    kept, dropped = [], 0
    try:
      for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
        event = event_pb2.Event.FromString(record)
        if event.step <= last_round or event.WhichOneof('what') == 'file_version':
          kept.append(record)
        else:
          dropped += 1
    except (tf.errors.OpError, ValueError) as e:  # cut off by a kill or a full disk
      dropped += 1
      warn(f'{path}: the events after its last readable record are dropped ({first_line(e)})')
    except Exception:  # pylint: disable=broad-except
      dropped += 1
    if not dropped:
      continue
    temp = f'{path}.tmp'
    with tf.io.TFRecordWriter(temp) as writer:
      for record in kept:
        writer.write(record)
    os.replace(temp, path)


class TensorBoardScalars:
  """A run's metrics as TensorBoard scalars, as TFF's `TensorBoardReleaseManager`
  writes a flat mapping of numbers (`tf.summary.scalar(name, value, step=round)`),
  with tf.summary.scalar's tag, float32 value and metadata. Values that are not
  numbers are left out, as TFF leaves them.

  A run's scalars go into `batch` (its own unless given) and are written at once;
  a population's members share one batch, which its round loop writes after every
  member's release of the round, before their checkpoints.
  """

  def __init__(self, log_dir: str, batch: Optional['ScalarBatch'] = None):
    os.makedirs(log_dir, exist_ok=True)
    self._writer = tf.summary.create_file_writer(log_dir)
    self._batch, self._own = (batch, False) if batch is not None else (ScalarBatch(), True)

  def release(self, metrics: Mapping[str, Any], round_num: int) -> None:
    numbers = {k: v for k, v in metrics.items()
               if np.asarray(v).dtype.kind in 'biuf' and np.ndim(v) == 0}
    if numbers:
      self._batch.add(self._writer, list(numbers), list(numbers.values()), round_num)
    if self._own:
      self._batch.write()


class ScalarBatch:
  """Scalars of one or more writers, written by one call of one graph (traced
  once per set of writers, whatever the metric names).

  TFF's manager writes each scalar eagerly (~0.1 ms of Python and op dispatch
  each), which at ~30 metrics × 25 members per round cost a 25-member digits
  sweep a tenth of its wall-clock; one graph call per member and round still
  cost it a tenth of what remained.
  """

  def __init__(self):
    self._pending, self._graphs = [], {}

  def add(self, writer, tags: list[str], values: list[Any], step: int) -> None:
    self._pending.append((writer, tags, values, step))

  def write(self) -> None:
    """Writes what was added (nothing left pending, even when writing fails)."""
    pending, self._pending = self._pending, []
    if not pending:
      return
    writers = tuple(writer for writer, _, _, _ in pending)
    if writers not in self._graphs:
      self._graphs[writers] = _scalar_graph(writers)
    bounds = np.cumsum([0] + [len(tags) for _, tags, _, _ in pending], dtype=np.int32)
    self._graphs[writers](
        np.asarray([t for _, tags, _, _ in pending for t in tags], object),
        np.asarray([v for _, _, values, _ in pending for v in values], np.float32),
        bounds, np.asarray([step for _, _, _, step in pending], np.int64))


def _scalar_graph(writers):
  """(tags, values, bounds, steps) → writer p writes tags[bounds[p]:bounds[p+1]] at steps[p]."""
  from tensorboard.plugins.scalar import metadata  # pylint: disable=g-import-not-at-top
  scalar = metadata.create_summary_metadata(display_name=None, description=None)

  @tf.function(input_signature=(tf.TensorSpec([None], tf.string),
                                tf.TensorSpec([None], tf.float32),
                                tf.TensorSpec([len(writers) + 1], tf.int32),
                                tf.TensorSpec([len(writers)], tf.int64)))
  def write(tags, values, bounds, steps):
    for p, writer in enumerate(writers):
      with writer.as_default(step=steps[p]):
        for i in tf.range(bounds[p], bounds[p + 1]):
          tf.summary.write(tags[i], values[i], metadata=scalar)
  return write
