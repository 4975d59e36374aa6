"""What every per-round schedule is: a value for round t, feedback, a plain-data state.

The TFF training loop asks a schedule for the value of round `t` (rounds count
from 0) and, for feedback-driven schedules, reports what the schedule needs back
through `observe`. The schedules themselves are in `learning_rate` (docs/algorithms.md#fedopt,
FedOpt's decays and warm-up, the FedOpt paper) and `local_steps` (docs/algorithms.md#schedules, decaying
local work: the decaying-K paper and the thesis, ch. 5); `driver` applies them to
a learning process between rounds.

Conventions fixed here (the sources are silent):
  * Local steps are always integers >= 1.  Every K formula with a ceiling uses
    an exact or float-guarded ceiling, documented per schedule.  In particular
    K_r = ceil(cbrt(1/r) * K_0) is computed in integers as the smallest k with
    k**3 * r >= K_0**3, so cbrt(1/1000) * 50 gives 5 and not 6.
  * `value(t)` of a feedback-driven schedule depends only on what was observed
    in rounds < t, never on round t itself (its losses are only known after the
    round's local work, whose size must be known before it starts).
  * Every schedule's whole state (configuration included) is a dict of Python
    scalars, strings and lists (`state()`), which is JSON-serialisable with
    exact float round-trips and also survives conversion to NumPy arrays (as
    TFF's program-state managers do); `schedule_from_state` rebuilds it (the
    package's `__init__` imports every schedule module, so all are registered).
"""

import abc
import fractions
import math
from collections.abc import Mapping
from typing import Any, Optional, Union

import numpy as np

LOCAL_STEPS = 'local_steps'
LEARNING_RATE = 'learning_rate'
_QUANTITIES = (LOCAL_STEPS, LEARNING_RATE)

# What a feedback-driven schedule wants passed to `observe`.
FEEDBACK_FIRST_MINIBATCH_LOSS = 'first_minibatch_loss'
FEEDBACK_VALIDATION_ACCURACY = 'validation_accuracy'

# A value within this (relative) distance above an integer is taken to be that
# integer before a ceiling.  Float error in K_0 * d**t is ~1e-16 relative, far
# below it, and a genuine excess this small is meaningless for a step count.
CEIL_TOLERANCE = 1e-9

Number = Union[int, float]


def guarded_ceil(x: float) -> int:
  """ceil(x), ignoring float error just above an integer (see CEIL_TOLERANCE)."""
  return math.ceil(x - CEIL_TOLERANCE * max(1.0, abs(x)))


def exact_ceil_root(k0: int, ratio_num: fractions.Fraction,
                     ratio_den: fractions.Fraction, root: int) -> int:
  """Smallest integer k >= 0 with k >= k0 * (ratio_num / ratio_den)**(1/root).

  For k >= 0 the condition is k**root * ratio_den >= k0**root * ratio_num,
  which rationals decide exactly; a float root cannot (cbrt(1/1000) * 50 is
  5.000000000000001 in binary floating point).

  Args:
    k0: the initial value K_0 (a positive integer).
    ratio_num: numerator of the ratio under the root (>= 0).
    ratio_den: denominator of the ratio under the root (> 0).
    root: 2 or 3.
  """
  target = (k0**root) * ratio_num
  if target <= 0:
    return 0
  # A float estimate, then exact correction by at most a step or two.
  k = max(0, math.ceil(k0 * (float(ratio_num) / float(ratio_den))**(1.0 / root)))
  while k > 0 and ((k - 1)**root) * ratio_den >= target:
    k -= 1
  while (k**root) * ratio_den < target:
    k += 1
  return k


def _check_quantity(quantity: str) -> None:
  if quantity not in _QUANTITIES:
    raise ValueError(f'quantity must be one of {_QUANTITIES}; got {quantity!r}')


def as_float_list(values: Any) -> list[float]:
  return [float(v) for v in np.asarray(values, dtype=np.float64).reshape(-1)]


def as_int_list(values: Any) -> list[int]:
  return [int(v) for v in np.asarray(values, dtype=np.int64).reshape(-1)]


def scalar(value: Any) -> Any:
  """Unwraps NumPy scalars/0-d arrays (and bytes) from a restored state."""
  if isinstance(value, np.ndarray):
    value = value.item() if value.ndim == 0 else value
  if isinstance(value, np.generic):
    value = value.item()
  if isinstance(value, bytes):
    value = value.decode('utf-8')
  return value


_REGISTRY: dict[str, type['Schedule']] = {}


def register(cls: type['Schedule']) -> type['Schedule']:
  _REGISTRY[cls.TAG] = cls
  return cls


class Schedule(abc.ABC):
  """A per-round value: a learning rate (float) or a number of local steps (int).

  Attributes:
    quantity: `LOCAL_STEPS` (values are ints >= 1) or `LEARNING_RATE` (floats).
    base: the initial value (K_0 or eta_0).
    feedback: None for schedules that are a pure function of the round number;
      otherwise what `observe` expects (`FEEDBACK_FIRST_MINIBATCH_LOSS` or
      `FEEDBACK_VALIDATION_ACCURACY`).
  """

  TAG: str = ''
  feedback: Optional[str] = None

  def __init__(self, base: Number, quantity: str):
    _check_quantity(quantity)
    self.quantity = quantity
    self.base = int(base) if quantity == LOCAL_STEPS else float(base)

  @abc.abstractmethod
  def value(self, round_num: int) -> Number:
    """The value to use in round `round_num` (counted from 0)."""

  def observe(self, round_num: int, feedback: Any) -> None:
    """Reports feedback after round `round_num`; a no-op without feedback."""
    del round_num, feedback

  def state(self) -> dict[str, Any]:
    """The whole state (configuration included), as plain Python values."""
    return {'schedule': self.TAG, 'quantity': self.quantity, 'base': self.base,
            **self._config(), **self._mutable_state()}

  @classmethod
  def from_state(cls, state: Mapping[str, Any]) -> 'Schedule':
    """Rebuilds a schedule, bit for bit, from `state()` (or its NumPy form)."""
    state = {k: scalar(v) for k, v in state.items()}
    if state['schedule'] != cls.TAG:
      raise ValueError(f'state is for schedule {state["schedule"]!r}, not {cls.TAG!r}')
    schedule = cls._from_config(state)
    schedule._load_mutable_state(state)
    return schedule

  def _config(self) -> dict[str, Any]:
    return {}

  def _mutable_state(self) -> dict[str, Any]:
    return {}

  def _load_mutable_state(self, state: Mapping[str, Any]) -> None:
    del state

  @classmethod
  def _from_config(cls, state: Mapping[str, Any]) -> 'Schedule':
    return cls(base=state['base'], quantity=state['quantity'])

  def _as_quantity(self, x: float) -> Number:
    """A K formula's float result as an integer >= 1 (guarded ceiling)."""
    if self.quantity == LOCAL_STEPS:
      return max(1, guarded_ceil(x))
    return float(x)

  def __repr__(self) -> str:
    return f'{type(self).__name__}({self._config()!r}, base={self.base!r})'


def schedule_from_state(state: Mapping[str, Any]) -> Schedule:
  """Rebuilds any schedule from its `state()`."""
  tag = scalar(state['schedule'])
  if tag not in _REGISTRY:
    raise ValueError(f'unknown schedule in state: {tag!r}')
  return _REGISTRY[tag].from_state(state)


@register
class ConstantSchedule(Schedule):
  """K_t = K_0 or eta_t = eta_0."""

  TAG = 'constant'

  def value(self, round_num: int) -> Number:
    return self.base

