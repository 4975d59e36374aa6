"""What the package's TFF optimisers share: hyperparameter keys, checks, casts, get/set."""

import collections
import math
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow_federated.python.learning.optimizers import optimizer

LR = optimizer.LEARNING_RATE_KEY
BETA_1 = 'beta_1'
BETA_2 = 'beta_2'
EPSILON = 'epsilon'
STEP = 'step'


def cast(value: Any, dtype: tf.DType) -> tf.Tensor:
  # tf.cast of a Python float goes through float32 first; keep float64 exact.
  return tf.cast(value if tf.is_tensor(value) else np.asarray(value), dtype)


def check_range(name: str, value: Any, low: float, high: float = math.inf,
                low_open: bool = False) -> None:
  """Raises ValueError unless value is in [low, high) (or (low, high))."""
  if tf.is_symbolic_tensor(value):
    return  # Traced hyperparameters can only be checked by the caller.
  ok = (value > low if low_open else value >= low) and value < high
  if not ok:
    bracket = '(' if low_open else '['
    raise ValueError(
        f'`{name}` must be in {bracket}{low}, {high}), found {value}.')


class HparamsInState:
  """`get_hparams`/`set_hparams` of an optimiser whose state holds the keys of `self._hparams`."""

  _hparams: collections.OrderedDict

  def get_hparams(self, state):
    return collections.OrderedDict((k, state[k]) for k in self._hparams)

  def set_hparams(self, state, hparams):
    unknown = set(hparams) - set(self._hparams)
    if unknown:
      raise KeyError(f'Unknown hyperparameters {sorted(unknown)}.')
    new_state = collections.OrderedDict(state)
    new_state.update(hparams)
    return new_state
