"""Learning-rate schedules of FedOpt (docs/algorithms.md#fedopt; Reddi et al. 2021).

Client and server learning-rate decays: constant, exp_decay, inv_lin_decay,
inv_sqrt_decay (optionally staircased), and a linear warm-up around any of
them. `ExponentialDecay` with steps = 1 is also the `exp` schedule of docs/algorithms.md#schedules (decaying-K paper §3),
for learning rates and for local steps.
"""

import math
from collections.abc import Mapping
from typing import Any

from tff_adaptive.schedules import core


class _StepDecay(core.Schedule):
  """A decay in p = t / steps (floor(t / steps) with staircase): FedOpt's decays."""

  def __init__(self, base: core.Number, decay_rate: float, decay_steps: int = 1,
               staircase: bool = False, quantity: str = core.LEARNING_RATE):
    super().__init__(base, quantity)
    self.decay_rate = float(decay_rate)
    self.decay_steps = int(decay_steps)
    self.staircase = bool(staircase)

  def _decayed(self, p: float) -> float:
    raise NotImplementedError

  def value(self, round_num: int) -> core.Number:
    p = round_num / self.decay_steps
    if self.staircase:
      p = math.floor(p)
    return self._as_quantity(self._decayed(p))

  def _config(self) -> dict[str, Any]:
    return {'decay_rate': self.decay_rate, 'decay_steps': self.decay_steps,
            'staircase': self.staircase}


@core.register
class ExponentialDecay(_StepDecay):
  """base * rate**(t / steps); staircase uses floor(t / steps).

  docs/algorithms.md#fedopt `exp_decay` (FedOpt; the paper's ExpDecay is rate 0.1, steps 500,
  staircase) and, with steps = 1, docs/algorithms.md#schedules `exp` (decaying-K paper §3: gamma_t =
  gamma_0 * d**t, K_t = ceil(K_0 * d**t)).  For local steps the ceiling is
  float-guarded (`CEIL_TOLERANCE`) and K >= 1.
  """

  TAG = 'exp_decay'

  def _decayed(self, p: float) -> float:
    return self.base * self.decay_rate**p

  @classmethod
  def _from_config(cls, state):
    return cls(state['base'], state['decay_rate'], state['decay_steps'],
               bool(state['staircase']), state['quantity'])


@core.register
class InverseDecay(_StepDecay):
  """base / (1 + rate * t / steps)**power (docs/algorithms.md#fedopt inv_lin_decay / inv_sqrt_decay).

  power = 1 is FedOpt's `inv_lin_decay`, power = 0.5 its `inv_sqrt_decay`;
  staircase uses floor(t / steps).
  """

  TAG = 'inverse_decay'

  def __init__(self, base: core.Number, decay_rate: float, decay_steps: int = 1,
               staircase: bool = False, power: float = 1.0,
               quantity: str = core.LEARNING_RATE):
    super().__init__(base, decay_rate, decay_steps, staircase, quantity)
    self.power = float(power)

  def _decayed(self, p: float) -> float:
    return self.base / (1.0 + self.decay_rate * p)**self.power

  def _config(self) -> dict[str, Any]:
    return {**super()._config(), 'power': self.power}

  @classmethod
  def _from_config(cls, state):
    return cls(state['base'], state['decay_rate'], state['decay_steps'],
               bool(state['staircase']), state['power'], state['quantity'])


@core.register
class LinearWarmup(core.Schedule):
  """Multiplies another schedule by min(1, (t + 1) / warmup_rounds).

  Round 0 already trains (at base / warmup_rounds), and round warmup_rounds - 1
  reaches the full value; the wrapped schedule keeps counting from round 0,
  so warm-up does not postpone its decay.  Learning rates only.  Feedback goes
  to the wrapped schedule.
  """

  TAG = 'linear_warmup'

  def __init__(self, schedule: core.Schedule, warmup_rounds: int):
    if schedule.quantity != core.LEARNING_RATE:
      raise ValueError('linear warm-up applies to learning rates only')
    super().__init__(schedule.base, core.LEARNING_RATE)
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
    return cls(core.schedule_from_state(state['inner']),
               int(core.scalar(state['warmup_rounds'])))

