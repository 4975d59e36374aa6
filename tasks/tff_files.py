"""TFF's federated datasets read from their files in --data_dir, never downloaded.

TFF's `tff.simulation.datasets` loaders download what is missing; these check
that the file is there first and otherwise raise `DataNotFoundError` with the
command that fetches it. The SQLite client data
are read client by client (`SqlClientData`); Stack Overflow's held-out and
test splits on first use. `restrict_train_data` is the `--num_clients` /
`--max_client_examples` subset every TFF task takes.
"""

import dataclasses
import json
import lzma
import os
import shutil
import sqlite3
import tarfile
from collections.abc import Callable

import numpy as np
import tensorflow_federated as tff

from tasks import data_files

DEFAULT_CACHE_DIR = '~/.tff'
_STORAGE = 'https://storage.googleapis.com/tff-datasets-public'


@dataclasses.dataclass(frozen=True)
class _TffFile:
  filename: str
  loader: str  # Python call that downloads it into DIR


_SQLITE = {
    'cifar100': _TffFile('cifar100.sqlite',
                         "tff.simulation.datasets.cifar100.load_data(cache_dir='DIR')"),
    'emnist': _TffFile('emnist_all.sqlite',
                       "tff.simulation.datasets.emnist.load_data(only_digits=False, "
                       "cache_dir='DIR')"),
    'shakespeare': _TffFile('shakespeare.sqlite',
                            "tff.simulation.datasets.shakespeare.load_data(cache_dir='DIR')"),
    'stackoverflow': _TffFile('stackoverflow.sqlite',
                              "tff.simulation.datasets.stackoverflow.load_data(cache_dir='DIR')"),
}
_VOCABULARIES = {
    'word': _TffFile('stackoverflow.word_count',
                     "tff.simulation.datasets.stackoverflow.load_word_counts(cache_dir='DIR')"),
    'tag': _TffFile('stackoverflow.tag_count',
                    "tff.simulation.datasets.stackoverflow.load_tag_counts(cache_dir='DIR')"),
}


def _fetch_command(loader: str, data_dir: str) -> str:
  return (f'python -c "import tensorflow_federated as tff; '
          f'{loader.replace("DIR", data_dir)}"')


def load_sqlite(task: str, dataset: str, data_dir: str):
  """TFF's `load_data`, once the file it would download is known to be there."""
  spec = _SQLITE[dataset]
  path = os.path.join(data_dir, spec.filename)
  if not os.path.exists(path) and os.path.exists(path + '.lzma'):
    # TFF stores the download decompressed; accept the compressed file as
    # fetched by hand and decompress it the same way.
    with lzma.open(path + '.lzma') as src, open(path + '.tmp', 'wb') as dst:
      shutil.copyfileobj(src, dst, 1 << 20)
    os.replace(path + '.tmp', path)
  if not os.path.exists(path):
    raise data_files.DataNotFoundError(data_files.missing_message(
        task, data_dir, spec.filename,
        f"TFF's federated {dataset} dataset ({_STORAGE}/{spec.filename}.lzma, decompressed)",
        _fetch_command(spec.loader, data_dir)))
  module = getattr(tff.simulation.datasets, dataset)
  try:
    if dataset == 'emnist':
      return module.load_data(only_digits=False, cache_dir=data_dir)
    if dataset == 'stackoverflow':
      return load_stackoverflow(path)
    return module.load_data(cache_dir=data_dir)
  except (sqlite3.DatabaseError, tff.simulation.datasets.sql_client_data.DatabaseFormatError) as e:
    raise data_files.DataNotFoundError(
        f'--task={task}: {path} is not one of TFF\'s client-data SQLite files ({e}); '
        f'delete it and fetch it again with: {_fetch_command(spec.loader, data_dir)}') from None


class _LazyClientData(tff.simulation.datasets.ClientData):
  """A `ClientData` built on first use of its clients (its element type is known before)."""

  def __init__(self, build: Callable[[], tff.simulation.datasets.ClientData], element_type):
    self._build = build
    self._data = None
    self._element_type = element_type

  def _get(self) -> tff.simulation.datasets.ClientData:
    if self._data is None:
      self._data = self._build()
    return self._data

  @property
  def client_ids(self):
    return self._get().client_ids

  @property
  def serializable_dataset_fn(self):
    return self._get().serializable_dataset_fn

  def create_tf_dataset_for_client(self, client_id):
    return self._get().create_tf_dataset_for_client(client_id)

  @property
  def element_type_structure(self):
    return self._element_type


def load_stackoverflow(path: str):
  """TFF's `stackoverflow.load_data` (same splits, same parsing) on a file known to be there.

  The held-out and test splits read their client ids (38,758 and 204,088, one
  `SELECT DISTINCT` each, 1-2 s on the full-size file) on first use: the
  tasks never use the held-out split and sample the test split only when
  they first evaluate.
  """
  parse = tff.simulation.datasets.stackoverflow._add_proto_parsing  # pylint: disable=protected-access
  sql = tff.simulation.datasets.SqlClientData
  train = sql(path, 'train').preprocess(parse)

  def lazy(split):
    return _LazyClientData(lambda: sql(path, split).preprocess(parse),
                           train.element_type_structure)

  return train, lazy('heldout'), lazy('test')


def load_vocabulary(task: str, kind: str, data_dir: str, size: int) -> list[str]:
  """The most frequent Stack Overflow words or tags, read as TFF reads them.

  TFF's `load_word_counts` / `load_tag_counts` re-verify the archive's hash
  through Keras' `get_file` and download again on any mismatch (and the
  baseline builders ignore `cache_dir` for them), so we read the extracted
  file they produce ourselves, extracting the archive first if only it is
  there.
  """
  spec = _VOCABULARIES[kind]
  path = data_files.find_file(data_dir, [spec.filename])
  archive = data_files.find_file(data_dir, [spec.filename + '.tar.bz2'])
  if path is None and archive is not None:
    with tarfile.open(archive, 'r:bz2') as tar:
      tar.extractall(os.path.dirname(archive), filter='data')
    path = data_files.find_file(data_dir, [spec.filename])
  if path is None:
    raise data_files.DataNotFoundError(data_files.missing_message(
        task, data_dir, f'{spec.filename} (or datasets/{spec.filename})',
        f"TFF's Stack Overflow {kind} counts ({_STORAGE}/{spec.filename}.tar.bz2, extracted "
        'by Keras into DIR/datasets/)', _fetch_command(spec.loader, data_dir)))
  with open(path) as f:
    if kind == 'tag':
      counts = json.load(f)
      ordered = sorted(counts.items(), key=lambda item: item[1], reverse=True)
      return [tag for tag, _ in ordered][:size]
    words = []
    for line in f:
      words.append(line.split()[0])
      if len(words) >= size:
        break
    return words


def load_restricted(task: str, dataset: str, data_dir: str, num_clients: int,
                    max_client_examples: int, seed: int):
  """(train, test) of a two-split TFF dataset in `data_dir` (default: TFF's cache),
  its training clients restricted (`restrict_train_data`)."""
  data_dir = data_files.expand_dir(data_dir, DEFAULT_CACHE_DIR)
  train, test = load_sqlite(task, dataset, data_dir)
  return restrict_train_data(train, num_clients, max_client_examples, seed), test


def restrict_train_data(data: tff.simulation.datasets.ClientData, num_clients: int,
                         max_client_examples: int, seed: int) -> tff.simulation.datasets.ClientData:
  """Optionally caps each client's examples and samples a subset of clients.

  The cap keeps each client's first examples (the same ones every round, as
  the decaying-K paper's "maximum of 250 samples per client"); the subset is a seeded
  uniform sample, kept lazy by reusing the serializable per-client dataset
  function.
  """
  if max_client_examples < 0 or num_clients < 0:
    raise ValueError('--num_clients and --max_client_examples must be non-negative')
  if max_client_examples:
    data = data.preprocess(lambda ds: ds.take(max_client_examples))
  if num_clients:
    ids = data.client_ids
    if num_clients > len(ids):
      raise ValueError(f'--num_clients={num_clients} but the data has only {len(ids)} '
                       'training clients')
    if num_clients < len(ids):
      chosen = np.sort(np.random.default_rng(seed).choice(len(ids), num_clients, replace=False))
      data = tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
          [ids[i] for i in chosen], data.serializable_dataset_fn)
  return data
