"""Which client's training data holds NaN or inf, asked when a round turns non-finite.

A non-finite loss or model after a round is most often a learning rate too
large, but a task whose data holds NaN or inf produces the same symptom from
round 1, and no learning rate fixes it. Before the learning-rate advice the
training loop looks at the first batches of the round's clients, as their
training pipeline (the task's preprocessing) yields them.
"""

from collections.abc import Mapping, Sequence
from typing import Optional

import numpy as np
import tensorflow as tf

# Batches read per client: the first steps are where a round's first NaN enters
# (a diverged round 1 has run at most K of them), and the check runs only after
# a divergence, so it is cheap either way.
FIRST_BATCHES = 20


def _leaves(value, path: str = ''):
  """(name, array) of every leaf of a batch: dict keys and tuple positions joined by '/'."""
  if isinstance(value, Mapping):
    for key, item in value.items():
      yield from _leaves(item, f'{path}/{key}' if path else str(key))
  elif isinstance(value, (tuple, list)):
    for i, item in enumerate(value):
      yield from _leaves(item, f'{path}/{i}' if path else f'element {i}')
  else:
    yield path or 'the batch', np.asarray(value)


def _kinds(array: np.ndarray) -> str:
  kinds = [k for k, bad in (('NaN', np.isnan(array).any()), ('inf', np.isinf(array).any()))
           if bad]
  return ' and '.join(kinds)


def non_finite_in_first_batches(dataset: tf.data.Dataset,
                                batches: int = FIRST_BATCHES) -> Optional[str]:
  """'NaN in x (batch 1)' for the first non-finite float value of `dataset`; else None."""
  for number, batch in enumerate(dataset.take(batches).as_numpy_iterator(), 1):
    for name, array in _leaves(batch):
      if np.issubdtype(array.dtype, np.floating) and not np.all(np.isfinite(array)):
        return f'{_kinds(array)} in {name} (batch {number})'
  return None


def non_finite_client(task, client_ids: Sequence[str]) -> Optional[str]:
  """The first of `client_ids` whose training batches hold NaN/inf, as a phrase naming it."""
  for client_id, dataset in zip(client_ids, task.client_train_datasets(list(client_ids))):
    found = non_finite_in_first_batches(dataset)
    if found:
      return f'the training data of client {client_id!r} holds {found}'
  return None


def data_problem(task, client_ids: Sequence[str]) -> str:
  """'' or the phrase a divergence message puts before its learning-rate advice.

  The check must not hide the divergence it explains: a task whose datasets
  cannot be rebuilt here leaves the message as it was.
  """
  try:
    found = non_finite_client(task, client_ids)
  except Exception:  # pylint: disable=broad-except
    return ''
  if not found:
    return ''
  return (f'{found}: a data problem (the task\'s training data produces them); fix the data, '
          'or if it is right, ')
