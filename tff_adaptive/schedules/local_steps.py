"""Decaying local work (docs/algorithms.md#schedules) and its step accounting.

"Faster Federated Learning with Decaying Number of Local SGD Steps" (the decaying-K paper,
§3 and Table 1) and the thesis "Federated Machine Learning in Edge Computing"
(the thesis), ch. 5: the `rounds` (eqs. 5.10/5.12), `error` (eqs. 5.13-5.15),
`step` and `theory` (the decaying-K paper, Theorem 2, eq. 11) schedules, each for local
steps K and (but `theory`) for a learning rate, and the total-SGD-steps
accounting of decaying-K paper Table 1. `exp` is `learning_rate.ExponentialDecay`
with steps = 1.
"""

import fractions
import math
from collections.abc import Sequence
from typing import Any, Optional, Union

import numpy as np

from tff_adaptive import errors
from tff_adaptive.schedules import core

# Thesis §5.1.5: the error schedule's rolling window of s = 100 rounds.
DEFAULT_SCHEDULE_WINDOW = 100
# Plateau detection for the `step` schedules (thesis Table 5.3: "K_0/10 if
# converged").  The thesis gives no numbers; these are the defaults of Keras'
# `ReduceLROnPlateau`, the heuristic the thesis cites.
DEFAULT_PLATEAU_PATIENCE = 10
DEFAULT_PLATEAU_MIN_DELTA = 1e-4
_STEP_FACTOR = 10


@core.register
class RoundsDecay(core.Schedule):
  """Thesis Table 5.3 `rounds`: K_r = ceil(cbrt(1/r) * K_0), eta_r = sqrt(1/r) * eta_0.

  r = t + 1 counts rounds from 1 (thesis eqs. 5.10 and 5.12: the optimal K
  decays with R**(-1/3), the optimal eta with R**(-1/2)).  K_r is computed
  exactly in integers: the smallest k with k**3 * r >= K_0**3.
  """

  TAG = 'rounds'

  def value(self, round_num: int) -> core.Number:
    r = round_num + 1
    if self.quantity == core.LOCAL_STEPS:
      return max(1, core.exact_ceil_root(self.base, fractions.Fraction(1),
                                     fractions.Fraction(r), 3))
    return self.base / math.sqrt(r)


@core.register
class TheoryDecay(core.Schedule):
  """decaying-K paper Theorem 2 (eq. 11): K_t = max(K_0 / (b + t), 1).

  Rounded up (float-guarded, `CEIL_TOLERANCE`), so that K_t never falls below
  the continuous value the theorem assumes; the decaying-K paper says only that "continuous
  K can be approximated by rounding K_t".  The guard, not exact rational
  arithmetic on the float b, is deliberate: b = 0.3 is stored as
  0.29999999999999998..., and 3 / that is just above 10, but the user meant 10.
  Local steps only.
  """

  TAG = 'theory'

  def __init__(self, base: int, b: float, quantity: str = core.LOCAL_STEPS):
    if quantity != core.LOCAL_STEPS:
      raise ValueError('the theory schedule is for local steps only')
    super().__init__(base, quantity)
    self.b = float(b)

  def value(self, round_num: int) -> int:
    return max(1, core.guarded_ceil(self.base / (self.b + round_num)))

  def _config(self) -> dict[str, Any]:
    return {'b': self.b}

  @classmethod
  def _from_config(cls, state):
    return cls(state['base'], state['b'], state['quantity'])


@core.register
class ErrorDrivenDecay(core.Schedule):
  """Thesis eqs. 5.13-5.15: K_r = ceil(cbrt(F_r/F_0) K_0), eta_r = sqrt(F_r/F_0) eta_0.

  Every sampled client reports the loss of its FIRST local minibatch (one extra
  float uploaded; `observe(t, losses)` after round t).  F_r is the mean of all
  finite losses reported in rounds r - s .. r - 1 (a pooled mean; equal to the
  thesis' 1/(sN) double sum when every round has N reports).  K = K_0 (eta =
  eta_0) for the first s rounds; F_0 is the mean over the first window (rounds
  0 .. s - 1), so round s again gets K_0.  The ceiling is exact (rational
  arithmetic on the float ratio F_r / F_0).

  Decisions where the thesis is silent: non-finite losses are dropped (a
  non-finite update gets weight 0 everywhere, docs/algorithms.md#conventions); if
 the first window holds no finite loss, F_0 comes from the first later
  window that does; while F_0 is unknown or zero, or the current window is
  empty, the base value is used.  The formula is not capped: if the loss rises
  above F_0, K exceeds K_0 as eq. 5.13 says.

  State: the last s rounds' loss sums and counts in a ring buffer indexed by
  round % s, the next round expected and F_0 -- all plain floats/ints, so a
  restored schedule continues with the identical sequence.  Rounds must be
  observed in order, each exactly once (an empty report is allowed).
  """

  TAG = 'error'
  feedback = core.FEEDBACK_FIRST_MINIBATCH_LOSS

  def __init__(self, base: core.Number, window: int = DEFAULT_SCHEDULE_WINDOW,
               quantity: str = core.LOCAL_STEPS):
    super().__init__(base, quantity)
    self.window = int(window)
    if self.window < 1:
      raise errors.ArgumentError('ErrorDrivenDecay', 'window',
                                 f'must be an integer >= 1; got {window}')
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

  def value(self, round_num: int) -> core.Number:
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
    if self.quantity == core.LOCAL_STEPS:
      return max(1, core.exact_ceil_root(self.base, fractions.Fraction(f_r),
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
    losses = [x for x in core.as_float_list(feedback) if math.isfinite(x)]
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
    self._sums = core.as_float_list(state['loss_sums'])
    self._counts = core.as_int_list(state['loss_counts'])
    self._f0 = float(state['f0'])
    if len(self._sums) != self.window or len(self._counts) != self.window:
      raise ValueError('error schedule state: buffers do not match the window')

  @classmethod
  def _from_config(cls, state):
    return cls(state['base'], state['window'], state['quantity'])


@core.register
class PlateauStepDecay(core.Schedule):
  """Thesis Table 5.3 `step`: K_0/10 (or eta_0/10) once validation accuracy plateaus.

  `observe(t, accuracy)` after each evaluation (made after round t).  An
  evaluation improves if accuracy > best + min_delta (strictly); after
  `patience` consecutive evaluations without improvement the value drops, once,
  from round t + 1 on.  Local steps become ceil(K_0 / 10) (at least 1).  A
  non-finite accuracy counts as no improvement.  Evaluation rounds must
  increase.
  """

  TAG = 'step'
  feedback = core.FEEDBACK_VALIDATION_ACCURACY

  def __init__(self, base: core.Number, patience: int = DEFAULT_PLATEAU_PATIENCE,
               min_delta: float = DEFAULT_PLATEAU_MIN_DELTA,
               quantity: str = core.LOCAL_STEPS):
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

  def value(self, round_num: int) -> core.Number:
    if 0 <= self._decay_round <= round_num:
      if self.quantity == core.LOCAL_STEPS:
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
# Accounting (decaying-K paper Table 1; thesis Table 5.4).

def local_steps_sequence(schedule: core.Schedule, num_rounds: int) -> list[int]:
  """K_t for t = 0 .. num_rounds - 1 of a schedule without feedback."""
  if schedule.quantity != core.LOCAL_STEPS:
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

  decaying-K paper Table 1's "fraction SGD steps used": e.g. K_0 = 33, d = 0.999 over
  4000 rounds gives 0.2601 (the abstract's "3.8x fewer").
  """
  k = np.asarray(k_sequence, dtype=np.int64).reshape(-1)
  constant = total_client_steps(np.full(k.size, k0), clients_per_round)
  return total_client_steps(k, clients_per_round) / constant

