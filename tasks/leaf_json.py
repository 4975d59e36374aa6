"""LEAF's JSON files: where they are in --data_dir, and each user's samples.

LEAF's preprocessing writes either per-user train/test split files
(`train/*.json`, `test/*.json`) or only the unsplit `all_data/*.json`, which
`iter_users` splits per user (80/20: a random 20% of each user's samples, or
for Shakespeare the last 20%). A missing layout raises `DataNotFoundError`
with the LEAF command that writes it; a malformed file, `DataFileError`
naming the file and the user.
"""

import dataclasses
import glob
import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from tasks import data_files

LEAF_URL = 'https://github.com/TalwalkarLab/leaf'
# LEAF commands giving the papers' splits (20% of each user's samples for test).
PREPROCESS_COMMANDS = {
    'sent140': './preprocess.sh -s niid --sf 1.0 -k 10 -t sample --tf 0.8',
    'femnist': './preprocess.sh -s niid --sf 1.0 -k 0 -t sample --tf 0.8',
    'shakespeare': './preprocess.sh -s niid --sf 1.0 -k 0 -t sample --tf 0.8',
}

UserSamples = tuple[list, list, list, list]  # train x, train y, test x, test y


@dataclasses.dataclass(frozen=True)
class Layout:
  """LEAF JSON files: paired train/test split files, or unsplit all_data files."""
  train_files: tuple[str, ...] = ()
  test_files: tuple[str, ...] = ()
  all_files: tuple[str, ...] = ()

  @property
  def sources(self) -> tuple[str, ...]:
    return self.train_files + self.test_files + self.all_files


def find_layout(task: str, leaf_name: str, data_dir: str) -> Layout:
  for root in (data_dir, os.path.join(data_dir, 'data')):
    train = sorted(glob.glob(os.path.join(root, 'train', '*.json')))
    test = sorted(glob.glob(os.path.join(root, 'test', '*.json')))
    if train and test:
      if len(train) != len(test):
        raise data_files.DataNotFoundError(
            f'--task={task}: {root} has {len(train)} train but {len(test)} test JSON files; '
            f'LEAF writes one test file per train file. Rerun LEAF\'s split.')
      return Layout(train_files=tuple(train), test_files=tuple(test))
    unsplit = sorted(glob.glob(os.path.join(root, 'all_data', '*.json')) +
                     glob.glob(os.path.join(root, 'all_data_*.json')))
    if unsplit:
      return Layout(all_files=tuple(unsplit))
  raise data_files.DataNotFoundError(data_files.missing_message(
      task, data_dir, "LEAF's JSON (train/*.json and test/*.json, or all_data/*.json)",
      f"LEAF's {leaf_name} benchmark ({LEAF_URL}), written by its preprocessing script",
      f'git clone {LEAF_URL} && cd leaf/data/{leaf_name} && {PREPROCESS_COMMANDS[leaf_name]} '
      f'(then use --data_dir=leaf/data/{leaf_name}/data)'))


class DataFileError(data_files.DataNotFoundError):
  """A LEAF file that is there but malformed; the message names it and what is wrong."""


def _load_json(task: str, path: str) -> Mapping[str, Any]:
  try:
    with open(path) as f:
      data = json.load(f)
    users = data['user_data']
    if not isinstance(users, dict):
      raise TypeError(f'"user_data" is a {type(users).__name__}, not an object')
    return users
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise data_files.DataNotFoundError(
        f'--task={task}: {path} is not a LEAF data file (a JSON object with "user_data"): '
        f'{e}') from None


def _split_user(x: list, y: list, last: bool, rng: np.random.Generator) -> UserSamples:
  n_test = int(round(0.2 * len(y)))
  if last:  # LEAF's Shakespeare split: the tail of the user's lines
    order = np.arange(len(y))
  else:
    order = rng.permutation(len(y))
  train_idx, test_idx = sorted(order[:len(y) - n_test]), sorted(order[len(y) - n_test:])
  return ([x[i] for i in train_idx], [y[i] for i in train_idx],
          [x[i] for i in test_idx], [y[i] for i in test_idx])


def _user_xy(task: str, path: str, users: Any, user: str) -> tuple[list, list]:
  """User `user`'s (x, y) lists, or DataFileError naming `path` and what is wrong."""
  try:
    x, y = users[user]['x'], users[user]['y']
  except (KeyError, TypeError, IndexError):
    raise DataFileError(f'--task={task}: {path}: user {user!r} is not an object with "x" and '
                        '"y" lists') from None
  if not isinstance(x, list) or not isinstance(y, list) or len(x) != len(y):
    raise DataFileError(f'--task={task}: {path}: user {user!r} needs "x" and "y" lists of equal '
                        f'length; got {type(x).__name__} of {_len(x)} and {type(y).__name__} of '
                        f'{_len(y)}')
  return x, y


def _len(value) -> str:
  return str(len(value)) if isinstance(value, (list, str, dict)) else '?'


def iter_users(task: str, layout: Layout,
                split_last: bool) -> Iterator[tuple[str, str, UserSamples]]:
  """(file, user, samples) in file order (files sorted by name, users sorted within a file).

  One file (pair) is in memory at a time.
  """
  if layout.all_files:
    rng = np.random.default_rng(0)  # fixed: the split is part of the cached data
    for path in layout.all_files:
      users = _load_json(task, path)
      for user in sorted(users):
        x, y = _user_xy(task, path, users, user)
        yield path, user, _split_user(list(x), list(y), split_last, rng)
    return
  for train_path, test_path in zip(layout.train_files, layout.test_files):
    train, test = _load_json(task, train_path), _load_json(task, test_path)
    for user in sorted(train):
      x, y = _user_xy(task, train_path, train, user)
      test_x, test_y = _user_xy(task, test_path, test, user) if user in test else ([], [])
      yield f'{train_path} (or {test_path})', user, (x, y, test_x, test_y)
