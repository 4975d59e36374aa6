"""Locating the tasks' data files offline, and TFF's SQLite client-data format.

TFF's dataset loaders (`tff.simulation.datasets.*.load_data`) download their
file when it is not in the cache directory, and offline they fail deep inside
`urllib` with a bare `URLError`. The tasks therefore look for the expected file
first and, when it is missing, raise `DataNotFoundError`: one message naming
the file expected in `--data_dir`, where it comes from, and the command that
fetches it on a machine with internet. `bin/train` prints it as a one-line
usage error, without a traceback.

`write_sql_client_data` writes the SQLite layout that
`tff.simulation.datasets.SqlClientData` reads (the layout of TFF's own
`*.sqlite` files): a table `examples(split_name, client_id,
serialized_example_proto)` holding one serialized `tf.train.Example` per row,
and a table `client_metadata(client_id, split_name, num_examples)`. The LEAF
tasks convert their JSON into this layout once, so that, like TFF's tasks,
they read one client's examples at a time instead of holding the dataset in
memory; the test fixtures use it to produce TFF's files in miniature.
"""

import os
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from typing import Optional, Union

import numpy as np

Feature = Union[bytes, str, int, float, np.ndarray, Sequence[int], Sequence[float]]


class DataNotFoundError(ValueError):
  """A task's data file is missing; the message says how to get it."""


def expand_dir(data_dir: str, default: str) -> str:
  """`--data_dir`, or `default` when the flag is empty, with `~` expanded."""
  return os.path.expanduser(data_dir or default)


def find_file(data_dir: str, names: Sequence[str],
              subdirs: Sequence[str] = ('', 'datasets')) -> Optional[str]:
  """First existing `data_dir/<subdir>/<name>`, or None.

  `datasets/` is searched too because Keras' `get_file(cache_dir=D)` (used by
  Keras' datasets and by TFF's Stack Overflow vocabularies) stores files in
  `D/datasets/`, so `--data_dir` may name either directory.
  """
  for subdir in subdirs:
    for name in names:
      path = os.path.join(data_dir, subdir, name)
      if os.path.exists(path):
        return path
  return None


def missing_message(task: str, data_dir: str, expected: str, source: str,
                    fetch_command: str) -> str:
  return (f'--task={task} needs {expected} in --data_dir={data_dir!r}, which does not have it. '
          f'It comes from {source}. On a machine with internet, fetch it with: {fetch_command} '
          f'-- then copy it into --data_dir (or point --data_dir at where it was saved).')


def _feature(value: Feature):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (see serialize_example)
  if isinstance(value, (bytes, str)):
    value = value.encode() if isinstance(value, str) else value
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
  array = np.asarray(value)
  if array.dtype.kind == 'S' or array.dtype.kind == 'O':
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(array.reshape(-1))))
  if np.issubdtype(array.dtype, np.floating):
    return tf.train.Feature(float_list=tf.train.FloatList(value=array.reshape(-1)))
  return tf.train.Feature(int64_list=tf.train.Int64List(value=array.reshape(-1).astype(np.int64)))


def serialize_example(features: Mapping[str, Feature]) -> bytes:
  """A `tf.train.Example` with bytes, float or int64 lists (flattened arrays).

  TensorFlow is imported here, not with the module: the Shakespeare builder
  writes this layout without it.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.train.Example(features=tf.train.Features(
      feature={k: _feature(v) for k, v in features.items()})).SerializeToString()


def write_sql_client_data(path: str,
                          clients: Iterable[tuple[str, str, Iterable[bytes]]]) -> dict[str, int]:
  """Writes `(split_name, client_id, serialized examples)` in TFF's SQLite layout.

  Written to a temporary name and renamed, so an interrupted conversion never
  leaves a half-written file that a later run would take for complete. An
  index on (client_id, split_name) keeps `SqlClientData`'s per-client queries
  from scanning the whole table.

  Returns:
    Number of examples written per split.
  """
  tmp_path = f'{path}.tmp{os.getpid()}'
  if os.path.exists(tmp_path):
    os.remove(tmp_path)
  counts: dict[str, int] = {}
  connection = sqlite3.connect(tmp_path)
  try:
    connection.execute('CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, '
                       'serialized_example_proto BLOB NOT NULL);')
    connection.execute('CREATE TABLE client_metadata (client_id TEXT NOT NULL, '
                       'split_name TEXT NOT NULL, num_examples INTEGER NOT NULL);')
    for split_name, client_id, examples in clients:
      rows = [(split_name, client_id, sqlite3.Binary(e)) for e in examples]
      connection.executemany('INSERT INTO examples VALUES (?, ?, ?);', rows)
      connection.execute('INSERT INTO client_metadata VALUES (?, ?, ?);',
                         (client_id, split_name, len(rows)))
      counts[split_name] = counts.get(split_name, 0) + len(rows)
    connection.execute('CREATE INDEX examples_by_client ON examples (client_id, split_name);')
    connection.commit()
  except BaseException:
    connection.close()
    os.remove(tmp_path)  # no half-written file left beside the data
    raise
  connection.close()
  os.replace(tmp_path, path)
  return counts
