"""Per-round learning-rate and local-step schedules, step accounting, runtime model.

Pure Python/NumPy building blocks; the TFF training loop asks a schedule for the
value of round `t` (rounds count from 0) and, for feedback-driven schedules,
reports what the schedule needs back through `observe`.

Sources (see /work/shared/SPEC.md):
  * SPEC §1 -- FedOpt client/server learning-rate schedules (Reddi et al.,
    "Adaptive Federated Optimization", seed 003): constant, exp_decay,
    inv_lin_decay, inv_sqrt_decay (optionally staircased), linear warm-up.
  * SPEC §5 -- decaying local work: "Faster Federated Learning with Decaying
    Number of Local SGD Steps" (seed 001, §3 and Table 1) and the thesis
    "Federated Machine Learning in Edge Computing" (seed 004), ch. 5: the
    `exp`, `rounds` (eqs. 5.10/5.12), `error` (eqs. 5.13-5.15), `step` and
    `theory` (seed 001, Theorem 2, eq. 11) schedules, the total-SGD-steps
    accounting of seed 001 Table 1 and the runtime model of thesis eqs. 5.3-5.5.
  * Seed 001 §3 -- the one-dimensional quadratic toy problem.

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
    TFF's program-state managers do); `schedule_from_state` rebuilds it.
"""

import abc
import fractions
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
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
_CEIL_TOLERANCE = 1e-9

# Thesis §5.1.5: the error schedule's rolling window of s = 100 rounds.
DEFAULT_SCHEDULE_WINDOW = 100
# Plateau detection for the `step` schedules (thesis Table 5.3: "K_0/10 if
# converged").  The thesis gives no numbers; these are the defaults of Keras'
# `ReduceLROnPlateau`, the heuristic the thesis cites.
DEFAULT_PLATEAU_PATIENCE = 10
DEFAULT_PLATEAU_MIN_DELTA = 1e-4
_STEP_FACTOR = 10

Number = Union[int, float]


def _guarded_ceil(x: float) -> int:
  """ceil(x), ignoring float error just above an integer (see _CEIL_TOLERANCE)."""
  return math.ceil(x - _CEIL_TOLERANCE * max(1.0, abs(x)))


def _exact_ceil_root(k0: int, ratio_num: fractions.Fraction,
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


def _as_float_list(values: Any) -> list[float]:
  return [float(v) for v in np.asarray(values, dtype=np.float64).reshape(-1)]


def _as_int_list(values: Any) -> list[int]:
  return [int(v) for v in np.asarray(values, dtype=np.int64).reshape(-1)]


def _scalar(value: Any) -> Any:
  """Unwraps NumPy scalars/0-d arrays (and bytes) from a restored state."""
  if isinstance(value, np.ndarray):
    value = value.item() if value.ndim == 0 else value
  if isinstance(value, np.generic):
    value = value.item()
  if isinstance(value, bytes):
    value = value.decode('utf-8')
  return value


_REGISTRY: dict[str, type['Schedule']] = {}


def _register(cls: type['Schedule']) -> type['Schedule']:
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
    state = {k: _scalar(v) for k, v in state.items()}
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
      return max(1, _guarded_ceil(x))
    return float(x)

  def __repr__(self) -> str:
    return f'{type(self).__name__}({self._config()!r}, base={self.base!r})'


def schedule_from_state(state: Mapping[str, Any]) -> Schedule:
  """Rebuilds any schedule from its `state()`."""
  tag = _scalar(state['schedule'])
  if tag not in _REGISTRY:
    raise ValueError(f'unknown schedule in state: {tag!r}')
  return _REGISTRY[tag].from_state(state)


@_register
class ConstantSchedule(Schedule):
  """K_t = K_0 or eta_t = eta_0."""

  TAG = 'constant'

  def value(self, round_num: int) -> Number:
    return self.base


@_register
class ExponentialDecay(Schedule):
  """base * rate**(t / steps); staircase uses floor(t / steps).

  SPEC §1 `exp_decay` (FedOpt; the paper's ExpDecay is rate 0.1, steps 500,
  staircase) and, with steps = 1, SPEC §5 `exp` (seed 001 §3: gamma_t =
  gamma_0 * d**t, K_t = ceil(K_0 * d**t)).  For local steps the ceiling is
  float-guarded (`_CEIL_TOLERANCE`) and K >= 1.
  """

  TAG = 'exp_decay'

  def __init__(self, base: Number, decay_rate: float, decay_steps: int = 1,
               staircase: bool = False, quantity: str = LEARNING_RATE):
    super().__init__(base, quantity)
    self.decay_rate = float(decay_rate)
    self.decay_steps = int(decay_steps)
    self.staircase = bool(staircase)

  def value(self, round_num: int) -> Number:
    p = round_num / self.decay_steps
    if self.staircase:
      p = math.floor(p)
    return self._as_quantity(self.base * self.decay_rate**p)

  def _config(self) -> dict[str, Any]:
    return {'decay_rate': self.decay_rate, 'decay_steps': self.decay_steps,
            'staircase': self.staircase}

  @classmethod
  def _from_config(cls, state):
    return cls(state['base'], state['decay_rate'], state['decay_steps'],
               bool(state['staircase']), state['quantity'])


@_register
class InverseDecay(Schedule):
  """base / (1 + rate * t / steps)**power (SPEC §1 inv_lin_decay / inv_sqrt_decay).

  power = 1 is FedOpt's `inv_lin_decay`, power = 0.5 its `inv_sqrt_decay`;
  staircase uses floor(t / steps).
  """

  TAG = 'inverse_decay'

  def __init__(self, base: Number, decay_rate: float, decay_steps: int = 1,
               staircase: bool = False, power: float = 1.0,
               quantity: str = LEARNING_RATE):
    super().__init__(base, quantity)
    self.decay_rate = float(decay_rate)
    self.decay_steps = int(decay_steps)
    self.staircase = bool(staircase)
    self.power = float(power)

  def value(self, round_num: int) -> Number:
    p = round_num / self.decay_steps
    if self.staircase:
      p = math.floor(p)
    return self._as_quantity(self.base / (1.0 + self.decay_rate * p)**self.power)

  def _config(self) -> dict[str, Any]:
    return {'decay_rate': self.decay_rate, 'decay_steps': self.decay_steps,
            'staircase': self.staircase, 'power': self.power}

  @classmethod
  def _from_config(cls, state):
    return cls(state['base'], state['decay_rate'], state['decay_steps'],
               bool(state['staircase']), state['power'], state['quantity'])


@_register
class LinearWarmup(Schedule):
  """Multiplies another schedule by min(1, (t + 1) / warmup_rounds).

  Round 0 already trains (at base / warmup_rounds), and round warmup_rounds - 1
  reaches the full value; the wrapped schedule keeps counting from round 0,
  so warm-up does not postpone its decay.  Learning rates only.  Feedback goes
  to the wrapped schedule.
  """

  TAG = 'linear_warmup'

  def __init__(self, schedule: Schedule, warmup_rounds: int):
    if schedule.quantity != LEARNING_RATE:
      raise ValueError('linear warm-up applies to learning rates only')
    super().__init__(schedule.base, LEARNING_RATE)
    self.schedule = schedule
    self.warmup_rounds = int(warmup_rounds)
    self.feedback = schedule.feedback

  def value(self, round_num: int) -> float:
    scale = min(1.0, (round_num + 1) / self.warmup_rounds)
    return scale * self.schedule.value(round_num)

  def observe(self, round_num: int, feedback: Any) -> None:
    self.schedule.observe(round_num, feedback)

  def state(self) -> dict[str, Any]:
    return {'schedule': self.TAG, 'quantity': self.quantity, 'base': self.base,
            'warmup_rounds': self.warmup_rounds, 'inner': self.schedule.state()}

  @classmethod
  def from_state(cls, state: Mapping[str, Any]) -> 'LinearWarmup':
    return cls(schedule_from_state(state['inner']),
               int(_scalar(state['warmup_rounds'])))


@_register
class RoundsDecay(Schedule):
  """Thesis Table 5.3 `rounds`: K_r = ceil(cbrt(1/r) * K_0), eta_r = sqrt(1/r) * eta_0.

  r = t + 1 counts rounds from 1 (thesis eqs. 5.10 and 5.12: the optimal K
  decays with R**(-1/3), the optimal eta with R**(-1/2)).  K_r is computed
  exactly in integers: the smallest k with k**3 * r >= K_0**3.
  """

  TAG = 'rounds'

  def value(self, round_num: int) -> Number:
    r = round_num + 1
    if self.quantity == LOCAL_STEPS:
      return max(1, _exact_ceil_root(self.base, fractions.Fraction(1),
                                     fractions.Fraction(r), 3))
    return self.base / math.sqrt(r)


@_register
class TheoryDecay(Schedule):
  """Seed 001 Theorem 2 (eq. 11): K_t = max(K_0 / (b + t), 1).

  Rounded up (float-guarded, `_CEIL_TOLERANCE`), so that K_t never falls below
  the continuous value the theorem assumes; seed 001 says only that "continuous
  K can be approximated by rounding K_t".  The guard, not exact rational
  arithmetic on the float b, is deliberate: b = 0.3 is stored as
  0.29999999999999998..., and 3 / that is just above 10, but the user meant 10.
  Local steps only.
  """

  TAG = 'theory'

  def __init__(self, base: int, b: float, quantity: str = LOCAL_STEPS):
    if quantity != LOCAL_STEPS:
      raise ValueError('the theory schedule is for local steps only')
    super().__init__(base, quantity)
    self.b = float(b)

  def value(self, round_num: int) -> int:
    return max(1, _guarded_ceil(self.base / (self.b + round_num)))

  def _config(self) -> dict[str, Any]:
    return {'b': self.b}

  @classmethod
  def _from_config(cls, state):
    return cls(state['base'], state['b'], state['quantity'])


@_register
class ErrorDrivenDecay(Schedule):
  """Thesis eqs. 5.13-5.15: K_r = ceil(cbrt(F_r/F_0) K_0), eta_r = sqrt(F_r/F_0) eta_0.

  Every sampled client reports the loss of its FIRST local minibatch (one extra
  float uploaded; `observe(t, losses)` after round t).  F_r is the mean of all
  finite losses reported in rounds r - s .. r - 1 (a pooled mean; equal to the
  thesis' 1/(sN) double sum when every round has N reports).  K = K_0 (eta =
  eta_0) for the first s rounds; F_0 is the mean over the first window (rounds
  0 .. s - 1), so round s again gets K_0.  The ceiling is exact (rational
  arithmetic on the float ratio F_r / F_0).

  Decisions where the thesis is silent: non-finite losses are dropped (SPEC
  §0); if the first window holds no finite loss, F_0 comes from the first later
  window that does; while F_0 is unknown or zero, or the current window is
  empty, the base value is used.  The formula is not capped: if the loss rises
  above F_0, K exceeds K_0 as eq. 5.13 says.

  State: the last s rounds' loss sums and counts in a ring buffer indexed by
  round % s, the next round expected and F_0 -- all plain floats/ints, so a
  restored schedule continues with the identical sequence.  Rounds must be
  observed in order, each exactly once (an empty report is allowed).
  """

  TAG = 'error'
  feedback = FEEDBACK_FIRST_MINIBATCH_LOSS

  def __init__(self, base: Number, window: int = DEFAULT_SCHEDULE_WINDOW,
               quantity: str = LOCAL_STEPS):
    super().__init__(base, quantity)
    self.window = int(window)
    if self.window < 1:
      raise ValueError(f'--schedule_window must be >= 1; got {window}')
    self._next_round = 0
    self._sums = [0.0] * self.window
    self._counts = [0] * self.window
    self._f0 = math.nan

  def _window_mean(self) -> Optional[float]:
    """Mean loss of the (up to) s rounds before `_next_round`, None if empty."""
    first = max(0, self._next_round - self.window)
    slots = [r % self.window for r in range(first, self._next_round)]
    count = sum(self._counts[i] for i in slots)
    if count == 0:
      return None
    # fsum is correctly rounded, so the mean does not depend on slot order.
    return math.fsum(self._sums[i] for i in slots) / count

  def value(self, round_num: int) -> Number:
    if round_num != self._next_round:
      raise ValueError(
          f'error schedule: value({round_num}) asked, but rounds up to '
          f'{self._next_round - 1} have been observed; the value is defined for '
          f'round {self._next_round} only (observe each round in order)')
    if round_num < self.window or not self._f0 > 0.0:
      return self.base
    f_r = self._window_mean()
    if f_r is None:
      return self.base
    if self.quantity == LOCAL_STEPS:
      return max(1, _exact_ceil_root(self.base, fractions.Fraction(f_r),
                                     fractions.Fraction(self._f0), 3))
    return self.base * math.sqrt(f_r / self._f0)

  def observe(self, round_num: int, feedback: Union[float, Sequence[float]]) -> None:
    """Records the first-minibatch losses that round `round_num`'s clients sent.

    Args:
      round_num: the round just run; must be the next unobserved round.
      feedback: the losses (a sequence, or a single float for one report).
    """
    if round_num != self._next_round:
      raise ValueError(f'error schedule: observe({round_num}) out of order; '
                       f'expected round {self._next_round}')
    losses = [x for x in _as_float_list(feedback) if math.isfinite(x)]
    slot = round_num % self.window
    self._sums[slot] = math.fsum(losses)
    self._counts[slot] = len(losses)
    self._next_round += 1
    if math.isnan(self._f0) and self._next_round >= self.window:
      f0 = self._window_mean()
      if f0 is not None:
        self._f0 = f0

  def _config(self) -> dict[str, Any]:
    return {'window': self.window}

  def _mutable_state(self) -> dict[str, Any]:
    return {'next_round': self._next_round, 'loss_sums': list(self._sums),
            'loss_counts': list(self._counts), 'f0': self._f0}

  def _load_mutable_state(self, state):
    self._next_round = int(state['next_round'])
    self._sums = _as_float_list(state['loss_sums'])
    self._counts = _as_int_list(state['loss_counts'])
    self._f0 = float(state['f0'])
    if len(self._sums) != self.window or len(self._counts) != self.window:
      raise ValueError('error schedule state: buffers do not match the window')

  @classmethod
  def _from_config(cls, state):
    return cls(state['base'], state['window'], state['quantity'])


@_register
class PlateauStepDecay(Schedule):
  """Thesis Table 5.3 `step`: K_0/10 (or eta_0/10) once validation accuracy plateaus.

  `observe(t, accuracy)` after each evaluation (made after round t).  An
  evaluation improves if accuracy > best + min_delta (strictly); after
  `patience` consecutive evaluations without improvement the value drops, once,
  from round t + 1 on.  Local steps become ceil(K_0 / 10) (at least 1).  A
  non-finite accuracy counts as no improvement.  Evaluation rounds must
  increase.
  """

  TAG = 'step'
  feedback = FEEDBACK_VALIDATION_ACCURACY

  def __init__(self, base: Number, patience: int = DEFAULT_PLATEAU_PATIENCE,
               min_delta: float = DEFAULT_PLATEAU_MIN_DELTA,
               quantity: str = LOCAL_STEPS):
    super().__init__(base, quantity)
    self.patience = int(patience)
    self.min_delta = float(min_delta)
    self._best = -math.inf
    self._wait = 0
    self._last_round = -1
    self._decay_round = -1

  @property
  def decay_round(self) -> Optional[int]:
    """First round with the reduced value, None while not yet decayed."""
    return None if self._decay_round < 0 else self._decay_round

  def value(self, round_num: int) -> Number:
    if 0 <= self._decay_round <= round_num:
      if self.quantity == LOCAL_STEPS:
        return max(1, -(-self.base // _STEP_FACTOR))
      return self.base / _STEP_FACTOR
    return self.base

  def observe(self, round_num: int, feedback: float) -> None:
    """Records the validation accuracy evaluated after round `round_num`."""
    if round_num <= self._last_round:
      raise ValueError(f'step schedule: evaluation round {round_num} is not after '
                       f'the previous one ({self._last_round})')
    self._last_round = round_num
    if self._decay_round >= 0:
      return  # Decays once only.
    accuracy = float(np.asarray(feedback, dtype=np.float64))
    if math.isfinite(accuracy) and accuracy > self._best + self.min_delta:
      self._best = accuracy
      self._wait = 0
    else:
      self._wait += 1
    if self._wait >= self.patience:
      self._decay_round = round_num + 1

  def _config(self) -> dict[str, Any]:
    return {'patience': self.patience, 'min_delta': self.min_delta}

  def _mutable_state(self) -> dict[str, Any]:
    return {'best': self._best, 'wait': self._wait, 'last_round': self._last_round,
            'decay_round': self._decay_round}

  def _load_mutable_state(self, state):
    self._best = float(state['best'])
    self._wait = int(state['wait'])
    self._last_round = int(state['last_round'])
    self._decay_round = int(state['decay_round'])

  @classmethod
  def _from_config(cls, state):
    return cls(state['base'], state['patience'], state['min_delta'], state['quantity'])


# ---------------------------------------------------------------------------
# Factories with flag-named validation.

LOCAL_STEPS_SCHEDULES = ('constant', 'exp', 'rounds', 'error', 'step', 'theory')
LR_SCHEDULES = ('constant', 'exp_decay', 'inv_lin_decay', 'inv_sqrt_decay', 'exp',
                'rounds', 'error', 'step')


def _is_real(x: Any) -> bool:
  return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_int(value: Any, flag: str, minimum: int) -> int:
  if not _is_real(value) or not float(value).is_integer() or value < minimum:
    raise ValueError(f'{flag} must be an integer >= {minimum}; got {value!r}')
  return int(value)


def _check_decay_factor(value: Any, flag: str) -> float:
  if not _is_real(value) or not 0.0 < float(value) <= 1.0:
    raise ValueError(f'{flag} must be a decay factor in (0, 1]; got {value!r}')
  return float(value)


def _check_nonnegative(value: Any, flag: str) -> float:
  if not _is_real(value) or not 0.0 <= float(value) < math.inf:
    raise ValueError(f'{flag} must be a finite number >= 0; got {value!r}')
  return float(value)


def _reject_unused(schedule_flag: str, name: str, given: Mapping[str, Any],
                   accepted: Sequence[str], flags: Mapping[str, str]) -> None:
  for param, value in given.items():
    if value is not None and param not in accepted:
      raise ValueError(f'{flags[param]} is not used by {schedule_flag}={name}; '
                       f'got {flags[param]}={value!r}')


def _window(window: Optional[int], total_rounds: Optional[int]) -> int:
  window = _check_int(DEFAULT_SCHEDULE_WINDOW if window is None else window,
                      '--schedule_window', 1)
  if total_rounds is not None and window > total_rounds:
    raise ValueError(f'--schedule_window={window} is larger than --total_rounds='
                     f'{total_rounds}: the error schedule would never leave K_0/eta_0')
  return window


def _plateau(patience: Optional[int], min_delta: Optional[float]) -> tuple[int, float]:
  patience = _check_int(DEFAULT_PLATEAU_PATIENCE if patience is None else patience,
                        '--plateau_patience', 1)
  min_delta = _check_nonnegative(
      DEFAULT_PLATEAU_MIN_DELTA if min_delta is None else min_delta,
      '--plateau_min_delta')
  return patience, min_delta


def make_local_steps_schedule(name: str, k0: int, *, decay: Optional[float] = None,
                              window: Optional[int] = None,
                              patience: Optional[int] = None,
                              min_delta: Optional[float] = None,
                              b: Optional[float] = None,
                              total_rounds: Optional[int] = None) -> Schedule:
  """Builds a local-steps (K) schedule of SPEC §5 from flag values.

  Args:
    name: `--local_steps_schedule`: constant | exp | rounds | error | step | theory.
    k0: `--local_steps`, K_0 (an integer >= 1).
    decay: `--local_steps_decay`, d_K in (0, 1] (`exp` only; required there).
    window: `--schedule_window`, s (`error` only; default 100).
    patience: `--plateau_patience` (`step` only; default 10 evaluations).
    min_delta: `--plateau_min_delta` (`step` only; default 1e-4).
    b: `--local_steps_theory_b`, b > 0 of seed 001 eq. 11 (`theory`; required).
    total_rounds: `--total_rounds`, used to validate `window` when given.

  Returns:
    A `Schedule` whose values are ints >= 1.

  Raises:
    ValueError: naming the offending flag.
  """
  flags = {'decay': '--local_steps_decay', 'window': '--schedule_window',
           'patience': '--plateau_patience', 'min_delta': '--plateau_min_delta',
           'b': '--local_steps_theory_b'}
  accepted = {'constant': (), 'exp': ('decay',), 'rounds': (), 'error': ('window',),
              'step': ('patience', 'min_delta'), 'theory': ('b',)}
  if name not in accepted:
    raise ValueError(f'--local_steps_schedule must be one of {LOCAL_STEPS_SCHEDULES}; '
                     f'got {name!r}')
  k0 = _check_int(k0, '--local_steps', 1)
  if total_rounds is not None:
    total_rounds = _check_int(total_rounds, '--total_rounds', 1)
  _reject_unused('--local_steps_schedule', name,
                 {'decay': decay, 'window': window, 'patience': patience,
                  'min_delta': min_delta, 'b': b}, accepted[name], flags)
  if name == 'constant':
    return ConstantSchedule(k0, LOCAL_STEPS)
  if name == 'exp':
    if decay is None:
      raise ValueError('--local_steps_schedule=exp needs --local_steps_decay')
    return ExponentialDecay(k0, _check_decay_factor(decay, flags['decay']),
                            quantity=LOCAL_STEPS)
  if name == 'rounds':
    return RoundsDecay(k0, LOCAL_STEPS)
  if name == 'error':
    return ErrorDrivenDecay(k0, _window(window, total_rounds), LOCAL_STEPS)
  if name == 'step':
    return PlateauStepDecay(k0, *_plateau(patience, min_delta), quantity=LOCAL_STEPS)
  if b is None:
    raise ValueError('--local_steps_schedule=theory needs --local_steps_theory_b')
  if not _is_real(b) or not 0.0 < float(b) < math.inf:
    raise ValueError(f'--local_steps_theory_b must be a finite number > 0; got {b!r}')
  return TheoryDecay(k0, float(b))


def make_lr_schedule(name: str, base: float, *, decay_rate: Optional[float] = None,
                     decay_steps: Optional[int] = None,
                     staircase: Optional[bool] = None,
                     warmup_rounds: Optional[int] = None,
                     window: Optional[int] = None,
                     patience: Optional[int] = None,
                     min_delta: Optional[float] = None,
                     total_rounds: Optional[int] = None,
                     flag_prefix: str = 'client') -> Schedule:
  """Builds a learning-rate schedule of SPEC §1 or §5 from flag values.

  Flags are `--{flag_prefix}_...`, e.g. `--client_lr_decay_rate`,
  `--server_lr_schedule`.

  Args:
    name: `--{p}_lr_schedule`: constant | exp_decay | inv_lin_decay |
      inv_sqrt_decay (SPEC §1, FedOpt) | exp | rounds | error | step (SPEC §5).
      `exp` is gamma_0 * d**t, i.e. exp_decay with steps 1.
    base: `--{p}_learning_rate` (> 0).
    decay_rate: `--{p}_lr_decay_rate`: in (0, 1] for exp_decay/exp, >= 0 for
      inv_lin_decay/inv_sqrt_decay (required by all four).
    decay_steps: `--{p}_lr_decay_steps` (>= 1, default 1; SPEC §1 only).
    staircase: `--{p}_lr_staircase` (default False; SPEC §1 only).
    warmup_rounds: `--{p}_lr_warmup_rounds` (>= 0; 0/None = no warm-up).
    window: `--schedule_window` (`error` only; default 100).
    patience: `--plateau_patience` (`step` only; default 10).
    min_delta: `--plateau_min_delta` (`step` only; default 1e-4).
    total_rounds: `--total_rounds`, used to validate `window` when given.
    flag_prefix: `client` or `server` (only changes the flag names in errors).

  Returns:
    A `Schedule` whose values are floats.

  Raises:
    ValueError: naming the offending flag.
  """
  p = flag_prefix
  flags = {'decay_rate': f'--{p}_lr_decay_rate', 'decay_steps': f'--{p}_lr_decay_steps',
           'staircase': f'--{p}_lr_staircase', 'window': '--schedule_window',
           'patience': '--plateau_patience', 'min_delta': '--plateau_min_delta'}
  sec1 = ('decay_rate', 'decay_steps', 'staircase')
  accepted = {'constant': (), 'exp_decay': sec1, 'inv_lin_decay': sec1,
              'inv_sqrt_decay': sec1, 'exp': ('decay_rate',), 'rounds': (),
              'error': ('window',), 'step': ('patience', 'min_delta')}
  if name not in accepted:
    raise ValueError(f'--{p}_lr_schedule must be one of {LR_SCHEDULES}; got {name!r}')
  if not _is_real(base) or not 0.0 < float(base) < math.inf:
    raise ValueError(f'--{p}_learning_rate must be a finite number > 0; got {base!r}')
  base = float(base)
  if total_rounds is not None:
    total_rounds = _check_int(total_rounds, '--total_rounds', 1)
  _reject_unused(f'--{p}_lr_schedule', name,
                 {'decay_rate': decay_rate, 'decay_steps': decay_steps,
                  'staircase': staircase, 'window': window, 'patience': patience,
                  'min_delta': min_delta}, accepted[name], flags)
  if accepted[name] and accepted[name][0] == 'decay_rate' and decay_rate is None:
    raise ValueError(f'--{p}_lr_schedule={name} needs {flags["decay_rate"]}')
  steps = 1 if decay_steps is None else _check_int(decay_steps, flags['decay_steps'], 1)
  stair = bool(staircase) if staircase is not None else False

  if name == 'constant':
    schedule = ConstantSchedule(base, LEARNING_RATE)
  elif name in ('exp_decay', 'exp'):
    schedule = ExponentialDecay(base, _check_decay_factor(decay_rate, flags['decay_rate']),
                                steps, stair, LEARNING_RATE)
  elif name in ('inv_lin_decay', 'inv_sqrt_decay'):
    schedule = InverseDecay(base, _check_nonnegative(decay_rate, flags['decay_rate']),
                            steps, stair, 1.0 if name == 'inv_lin_decay' else 0.5,
                            LEARNING_RATE)
  elif name == 'rounds':
    schedule = RoundsDecay(base, LEARNING_RATE)
  elif name == 'error':
    schedule = ErrorDrivenDecay(base, _window(window, total_rounds), LEARNING_RATE)
  else:
    schedule = PlateauStepDecay(base, *_plateau(patience, min_delta),
                                quantity=LEARNING_RATE)
  if warmup_rounds is not None:
    warmup_rounds = _check_int(warmup_rounds, f'--{p}_lr_warmup_rounds', 0)
    if warmup_rounds > 0:
      schedule = LinearWarmup(schedule, warmup_rounds)
  return schedule


# ---------------------------------------------------------------------------
# Accounting (seed 001 Table 1; thesis Table 5.4).

def local_steps_sequence(schedule: Schedule, num_rounds: int) -> list[int]:
  """K_t for t = 0 .. num_rounds - 1 of a schedule without feedback."""
  if schedule.quantity != LOCAL_STEPS:
    raise ValueError('not a local-steps schedule')
  if schedule.feedback is not None:
    raise ValueError(f'{schedule.TAG} depends on training feedback; record its '
                     'values during training instead')
  return [schedule.value(t) for t in range(num_rounds)]


def _per_round(values: Union[int, Sequence[int]], n: int, what: str) -> np.ndarray:
  arr = np.asarray(values, dtype=np.int64)
  if arr.ndim == 0:
    arr = np.full(n, int(arr), dtype=np.int64)
  if arr.shape != (n,):
    raise ValueError(f'{what} must be a scalar or one value per round ({n}); '
                     f'got shape {arr.shape}')
  return arr


def total_client_steps(k_sequence: Sequence[int],
                       clients_per_round: Union[int, Sequence[int]]) -> int:
  """Sum over rounds of |S_t| * K_t: the SGD steps all clients performed."""
  k = np.asarray(k_sequence, dtype=np.int64).reshape(-1)
  clients = _per_round(clients_per_round, k.size, 'clients_per_round')
  return int(np.sum(k * clients))


def step_fraction(k_sequence: Sequence[int], k0: int,
                  clients_per_round: Union[int, Sequence[int]] = 1) -> float:
  """total_client_steps against constant K_0 over the same rounds and clients.

  Seed 001 Table 1's "fraction SGD steps used": e.g. K_0 = 33, d = 0.999 over
  4000 rounds gives 0.2601 (the abstract's "3.8x fewer").
  """
  k = np.asarray(k_sequence, dtype=np.int64).reshape(-1)
  constant = total_client_steps(np.full(k.size, k0), clients_per_round)
  return total_client_steps(k, clients_per_round) / constant


# ---------------------------------------------------------------------------
# Runtime model (thesis §5.1.2, eqs. 5.3-5.5; numbers of §5.2.2).

BITS_PER_FLOAT = 32
DEFAULT_DOWN_MBPS = 20.0  # Thesis §5.2.2: 4G LTE in the UK.
DEFAULT_UP_MBPS = 5.0


def floats_to_mbit(num_floats: Number) -> float:
  """Size of `num_floats` 32-bit floats in megabits (10**6 bits)."""
  return num_floats * BITS_PER_FLOAT / 1e6


def simulated_round_seconds(num_params: int,
                            k_per_client: Union[int, Sequence[int]],
                            beta: Union[float, Sequence[float]],
                            down_mbps: Union[float, Sequence[float]] = DEFAULT_DOWN_MBPS,
                            up_mbps: Union[float, Sequence[float]] = DEFAULT_UP_MBPS,
                            down_floats: Optional[int] = None,
                            up_floats: Optional[int] = None) -> float:
  """Wall-clock time of one round, thesis eqs. 5.3-5.4.

  W_r = max over clients c of |x|/D^c + K_r^c beta^c + |x|/U^c, the server
  waiting for the slowest client.  `k_per_client`, `beta`, `down_mbps` and
  `up_mbps` broadcast over clients (scalars for the thesis' homogeneous model).

  Args:
    num_params: |x| in floats (32 bits each).
    k_per_client: local steps per client.
    beta: seconds per minibatch step per client (thesis Table 5.2).
    down_mbps: download bandwidth D in Mbit/s (default 20).
    up_mbps: upload bandwidth U in Mbit/s (default 5).
    down_floats: floats downloaded if not |x| (e.g. FedGBO's |x| + |s|).
    up_floats: floats uploaded if not |x| (e.g. MFL's |x| + |s|).
  """
  down = floats_to_mbit(num_params if down_floats is None else down_floats)
  up = floats_to_mbit(num_params if up_floats is None else up_floats)
  k, b, d, u = np.broadcast_arrays(
      np.asarray(k_per_client, dtype=np.float64), np.asarray(beta, dtype=np.float64),
      np.asarray(down_mbps, dtype=np.float64), np.asarray(up_mbps, dtype=np.float64))
  per_client = down / d + k * b + up / u
  return float(np.max(per_client))


def simulated_total_seconds(num_params: int, k_sequence: Sequence[int], beta: float,
                            down_mbps: float = DEFAULT_DOWN_MBPS,
                            up_mbps: float = DEFAULT_UP_MBPS,
                            down_floats: Optional[int] = None,
                            up_floats: Optional[int] = None) -> float:
  """Thesis eq. 5.5: sum over rounds of the homogeneous round time."""
  return math.fsum(
      simulated_round_seconds(num_params, k, beta, down_mbps, up_mbps, down_floats,
                              up_floats) for k in k_sequence)


# ---------------------------------------------------------------------------
# Seed 001 §3: f(x; z) = z x**2 / 2 - x with z ~ p(z) proportional to z**(-1/2)
# on [1, 3].  With u = sqrt(z), p(z) dz is proportional to du: u is uniform on
# [1, sqrt(3)], which gives both quadratures below.

QUADRATIC_TRUE_MINIMISER = 3.0 * (math.sqrt(3.0) - 1.0) / (3.0 * math.sqrt(3.0) - 1.0)


def quadratic_clients(num_clients: int) -> tuple[np.ndarray, np.ndarray]:
  """Deterministic clients for the toy: z_j and their probabilities.

  Midpoint rule in u = sqrt(z): z_j = u_j**2 with u_j the midpoints of
  `num_clients` equal cells of [1, sqrt(3)]; all clients are equally likely,
  so equal weights.  Each client holds one example z_j (seed 001 §3), hence
  its "minibatch" gradient is its full-batch gradient.
  """
  h = (math.sqrt(3.0) - 1.0) / num_clients
  u = 1.0 + h * (np.arange(num_clients) + 0.5)
  return u * u, np.full(num_clients, 1.0 / num_clients)


def quadratic_fixed_point(gamma: float, k: int, num_nodes: int = 200) -> float:
  """The FedSGD fixed point x~*(gamma, K) of the toy, by Gauss-Legendre quadrature.

  K client GD steps from x give y_K - 1/z = (1 - gamma z)**K (x - 1/z), so the
  expected update E_p[(1 - (1 - gamma z)**K)(x - 1/z)] vanishes at
  x = E_p[(1 - (1 - gamma z)**K) / z] / E_p[1 - (1 - gamma z)**K]
  (Charles & Konecny's surrogate minimiser, seed 001 eqs. 4-7).  K = 1 gives
  1/E_p[z], the true minimiser.
  """
  nodes, weights = np.polynomial.legendre.leggauss(num_nodes)
  u = 1.0 + (math.sqrt(3.0) - 1.0) * (nodes + 1.0) / 2.0
  z = u * u
  a = 1.0 - (1.0 - gamma * z)**k
  return float(np.sum(weights * a / z) / np.sum(weights * a))


ScheduleLike = Union[Schedule, Number, Callable[[int], Number]]


def _schedule_fn(schedule: ScheduleLike, what: str) -> Callable[[int], Number]:
  if isinstance(schedule, Schedule):
    if schedule.feedback is not None:
      raise ValueError(f'{what}: feedback-driven schedules are not supported by the toy '
                       '(its losses are negative)')
    return schedule.value
  if callable(schedule):
    return schedule
  return lambda t: schedule


def simulate_quadratic_fedsgd(local_steps: ScheduleLike, num_rounds: int, *,
                              gamma: ScheduleLike = 0.1, server_lr: float = 1.0,
                              x0: float = 0.4, num_clients: int = 1000,
                              clients_per_round: Optional[int] = None,
                              seed: int = 0) -> np.ndarray:
  """Runs FedSGD (seed 001 Algorithms 1-2) on the quadratic toy.

  Each participating client runs K_t explicit steps y <- y - gamma_t (z y - 1)
  on its single example; the server averages Delta = x - y_K with the clients'
  probabilities as weights (equal here) and sets x <- x - server_lr * Delta.

  Args:
    local_steps: K_t (a Schedule, an int, or a function of the round).
    num_rounds: rounds to run.
    gamma: client learning rate gamma_t (same kinds as `local_steps`).
    server_lr: eta (seed 001 uses 0.001 with 10 sampled clients; 1 is FedAvg).
    x0: initial model (seed 001: 0.4).
    num_clients: number of quadrature clients (`quadratic_clients`).
    clients_per_round: None for full participation (deterministic, the
      expected FedSGD update); else that many clients sampled uniformly
      without replacement each round, from `seed`.
    seed: sampling seed.

  Returns:
    x_0 .. x_{num_rounds}, shape [num_rounds + 1].
  """
  k_fn = _schedule_fn(local_steps, 'local_steps')
  gamma_fn = _schedule_fn(gamma, 'gamma')
  z_all, w_all = quadratic_clients(num_clients)
  rng = np.random.default_rng(seed)
  xs = np.empty(num_rounds + 1)
  xs[0] = x = float(x0)
  for t in range(num_rounds):
    if clients_per_round is None:
      z, w = z_all, w_all
    else:
      idx = rng.choice(num_clients, size=clients_per_round, replace=False)
      z, w = z_all[idx], np.full(clients_per_round, 1.0 / clients_per_round)
    g = float(gamma_fn(t))
    y = np.full(z.shape, x)
    for _ in range(int(k_fn(t))):
      y -= g * (z * y - 1.0)
    x = x - server_lr * float(np.sum(w * (x - y)))
    xs[t + 1] = x
  return xs
