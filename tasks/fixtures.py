"""Tiny data files in the exact on-disk formats the tasks read, for tests and smoke runs.

Each writer produces, in a directory of the caller's choosing, a miniature of
the real file: TFF's client-data SQLite files (the `examples` and
`client_metadata` tables, serialized `tf.train.Example`s with the features
TFF's parsers expect, the real split names) and the Stack Overflow vocabulary
archives; LEAF's JSON split files; Keras' `mnist.npz` and CIFAR-10 pickle
batches. Contents are random but deterministic in `seed`, with labels drawn
from the full label range so that every class index is exercised.
"""

import io
import json
import os
import pickle
import tarfile
from collections.abc import Sequence

import numpy as np

from tasks import data_files

_WORDS = ('the', 'a', 'to', 'is', 'in', 'of', 'and', 'i', 'it', 'you', 'this', 'that', 'for',
          'with', 'on', 'not', 'be', 'can', 'use', 'error', 'file', 'code', 'function', 'how',
          'python', 'java', 'string', 'array', 'list', 'class', '.', ',', '?', '(', ')')
_TAGS = ('python', 'java', 'javascript', 'c#', 'android', 'php', 'jquery', 'html', 'css', 'sql')
_TEXT = ('To be, or not to be: that is the question. Whether tis nobler in the mind to suffer '
         'the slings and arrows of outrageous fortune, or to take arms against a sea of troubles')


def _client_ids(prefix: str, n: int) -> list[str]:
  return [f'{prefix}{i:03d}' for i in range(n)]


def write_tff_emnist(data_dir: str, num_clients: int = 3, examples: int = 6, seed: int = 0) -> str:
  """`emnist_all.sqlite` with TFF's `all_train`/`all_test` (and digits-only) splits."""
  rng = np.random.default_rng(seed)
  rows = []
  for split, n in (('train', examples), ('test', max(2, examples // 2))):
    for cid in _client_ids('f0000_', num_clients):
      for prefix, classes in (('all', 62), ('digits_only', 10)):
        rows.append((f'{prefix}_{split}', cid, [data_files.serialize_example({
            'pixels': rng.uniform(0, 1, (28, 28)).astype(np.float32),
            'label': int(rng.integers(classes))}) for _ in range(n)]))
  path = os.path.join(data_dir, 'emnist_all.sqlite')
  data_files.write_sql_client_data(path, rows)
  return path


def write_tff_cifar100(data_dir: str, num_clients: int = 3, examples: int = 6,
                       seed: int = 0) -> str:
  """`cifar100.sqlite` with TFF's `train`/`test` splits (uint8 images stored as int64)."""
  rng = np.random.default_rng(seed)
  rows = []
  for split, n in (('train', examples), ('test', max(2, examples // 2))):
    for cid in _client_ids('', num_clients):
      rows.append((split, cid, [data_files.serialize_example({
          'image': rng.integers(0, 256, (32, 32, 3)), 'label': int(rng.integers(100)),
          'coarse_label': int(rng.integers(20))}) for _ in range(n)]))
  path = os.path.join(data_dir, 'cifar100.sqlite')
  data_files.write_sql_client_data(path, rows)
  return path


def write_tff_shakespeare(data_dir: str, num_clients: int = 3, examples: int = 5,
                          seed: int = 0) -> str:
  """`shakespeare.sqlite`: snippets of text per speaking role."""
  rng = np.random.default_rng(seed)
  rows = []
  for split, n in (('train', examples), ('test', max(2, examples // 2))):
    for cid in _client_ids('THE_TRAGEDY_OF_HAMLET_ROLE', num_clients):
      snippets = []
      for _ in range(n):
        start = int(rng.integers(0, len(_TEXT) - 40))
        snippets.append(data_files.serialize_example(
            {'snippets': _TEXT[start:start + int(rng.integers(20, 120))]}))
      rows.append((split, cid, snippets))
  path = os.path.join(data_dir, 'shakespeare.sqlite')
  data_files.write_sql_client_data(path, rows)
  return path


def _tar_bz2(path: str, member: str, payload: bytes) -> None:
  with tarfile.open(path, 'w:bz2') as tar:
    info = tarfile.TarInfo(member)
    info.size = len(payload)
    tar.addfile(info, io.BytesIO(payload))


def write_tff_stackoverflow(data_dir: str, num_clients: int = 3, examples: int = 4,
                            seed: int = 0) -> str:
  """`stackoverflow.sqlite` (`train`/`heldout`/`test`) and Keras-cached vocabulary archives.

  The archives `datasets/stackoverflow.{word,tag}_count.tar.bz2` are what
  Keras' `get_file(cache_dir=data_dir)` leaves; they are not extracted, so
  readers exercise the extraction path.
  """
  rng = np.random.default_rng(seed)
  rows = []
  for split in ('train', 'heldout', 'test'):
    for cid in _client_ids('', num_clients):
      posts = []
      for _ in range(examples):
        words = rng.choice(_WORDS, int(rng.integers(3, 25)))
        tags = rng.choice(_TAGS, int(rng.integers(1, 4)), replace=False)
        posts.append(data_files.serialize_example({
            'creation_date': '2016-01-01 00:00:00.1 UTC', 'score': int(rng.integers(-2, 50)),
            'tags': '|'.join(tags), 'title': ' '.join(rng.choice(_WORDS, 4)),
            'tokens': ' '.join(words), 'type': str(rng.choice(['question', 'answer']))}))
      rows.append((split, cid, posts))
  path = os.path.join(data_dir, 'stackoverflow.sqlite')
  data_files.write_sql_client_data(path, rows)
  cache = os.path.join(data_dir, 'datasets')
  os.makedirs(cache, exist_ok=True)
  word_counts = ''.join(f'{w} {1000 - i}\n' for i, w in enumerate(_WORDS))
  _tar_bz2(os.path.join(cache, 'stackoverflow.word_count.tar.bz2'), 'stackoverflow.word_count',
           word_counts.encode())
  tag_counts = {t: 500 - 7 * i for i, t in enumerate(_TAGS)}
  _tar_bz2(os.path.join(cache, 'stackoverflow.tag_count.tar.bz2'), 'stackoverflow.tag_count',
           json.dumps(tag_counts).encode())
  return path


def write_tff_all(data_dir: str, seed: int = 0) -> str:
  os.makedirs(data_dir, exist_ok=True)
  write_tff_emnist(data_dir, seed=seed)
  write_tff_cifar100(data_dir, seed=seed)
  write_tff_shakespeare(data_dir, seed=seed)
  write_tff_stackoverflow(data_dir, seed=seed)
  return data_dir


# ---- LEAF --------------------------------------------------------------------


def _write_leaf_file(path: str, user_data: dict) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  users = sorted(user_data)
  with open(path, 'w') as f:
    json.dump({'users': users, 'num_samples': [len(user_data[u]['y']) for u in users],
               'user_data': user_data}, f)


def _leaf_split(data_dir: str, stem: str, files: Sequence[dict], split: bool) -> str:
  """Writes LEAF's `train/`+`test/` split files (80/20 per user) or `all_data/`."""
  for i, users in enumerate(files):
    if not split:
      _write_leaf_file(os.path.join(data_dir, 'all_data', f'all_data_{i}.json'), users)
      continue
    train, test = {}, {}
    for user, data in users.items():
      n_test = max(1, len(data['y']) // 5)
      train[user] = {'x': data['x'][:-n_test], 'y': data['y'][:-n_test]}
      test[user] = {'x': data['x'][-n_test:], 'y': data['y'][-n_test:]}
    _write_leaf_file(os.path.join(data_dir, 'train', f'all_data_{i}_{stem}_train_8.json'), train)
    _write_leaf_file(os.path.join(data_dir, 'test', f'all_data_{i}_{stem}_test_8.json'), test)
  return data_dir


def write_leaf_femnist(data_dir: str, users_per_file: Sequence[int] = (3, 2), samples: int = 6,
                       split: bool = True, seed: int = 0) -> str:
  rng = np.random.default_rng(seed)
  files = [{f'f{1000 * i + u:04d}_{u:02d}': {
      'x': np.round(rng.uniform(0, 1, (samples, 784)), 3).tolist(),
      'y': rng.integers(0, 62, samples).tolist()} for u in range(n)}
           for i, n in enumerate(users_per_file)]
  return _leaf_split(data_dir, 'niid_0_keep_0', files, split)


def write_leaf_sent140(data_dir: str, num_users: int = 4, samples: int = 12, split: bool = True,
                       seed: int = 0) -> str:
  """Users of `samples` tweets, plus one user below the 10-tweet filter and one
  tweet per user with no vocabulary token at all ("zzz" words are rare)."""
  rng = np.random.default_rng(seed)
  users = {}
  for u in range(num_users + 1):
    n = samples if u < num_users else 5  # the last user has too few tweets
    texts = [' '.join(rng.choice(_WORDS[:20], int(rng.integers(3, 12)))) for _ in range(n)]
    texts[0] = ' '.join(f'zzz{u}x{k}' for k in range(3))
    users[f'user{u:02d}'] = {
        'x': [[str(1000 + k), 'Mon Apr 06 22:19:49 PDT 2009', 'NO_QUERY', f'user{u:02d}', t]
              for k, t in enumerate(texts)],
        'y': rng.integers(0, 2, n).tolist()}
  return _leaf_split(data_dir, 'niid_0_keep_10', [users], split)


def write_leaf_shakespeare(data_dir: str, num_users: int = 3, samples: int = 10,
                           split: bool = True, seed: int = 0) -> str:
  rng = np.random.default_rng(seed)
  users = {}
  for u in range(num_users):
    starts = rng.integers(0, len(_TEXT) - 81, samples)
    users[f'THE_TRAGEDY_OF_HAMLET_ROLE{u}'] = {
        'x': [_TEXT[s:s + 80] for s in starts], 'y': [_TEXT[s + 80] for s in starts]}
  return _leaf_split(data_dir, 'niid_0_keep_0', [users], split)


# ---- Keras -------------------------------------------------------------------


def write_keras_mnist(data_dir: str, train: int = 400, test: int = 200, seed: int = 0) -> str:
  rng = np.random.default_rng(seed)
  path = os.path.join(data_dir, 'mnist.npz')
  os.makedirs(data_dir, exist_ok=True)
  np.savez(path, x_train=rng.integers(0, 256, (train, 28, 28), dtype=np.uint8),
           y_train=rng.integers(0, 10, train).astype(np.uint8),
           x_test=rng.integers(0, 256, (test, 28, 28), dtype=np.uint8),
           y_test=rng.integers(0, 10, test).astype(np.uint8))
  return path


def write_keras_cifar10(data_dir: str, per_batch: int = 60, test: int = 100, seed: int = 0,
                        archive: bool = False) -> str:
  """`cifar-10-batches-py/` as Keras extracts it (or the `.tar.gz` it downloads)."""
  rng = np.random.default_rng(seed)
  batches = {}
  for name, n in [(f'data_batch_{i}', per_batch) for i in range(1, 6)] + [('test_batch', test)]:
    batches[name] = pickle.dumps({
        b'batch_label': name.encode(), b'labels': rng.integers(0, 10, n).tolist(),
        b'data': rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        b'filenames': [f'img_{k}.png'.encode() for k in range(n)]})
  os.makedirs(data_dir, exist_ok=True)
  if archive:
    path = os.path.join(data_dir, 'cifar-10-python.tar.gz')
    with tarfile.open(path, 'w:gz') as tar:
      for name, payload in batches.items():
        info = tarfile.TarInfo(f'cifar-10-batches-py/{name}')
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    return path
  path = os.path.join(data_dir, 'cifar-10-batches-py')
  os.makedirs(path, exist_ok=True)
  for name, payload in batches.items():
    with open(os.path.join(path, name), 'wb') as f:
      f.write(payload)
  return path
