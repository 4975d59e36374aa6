"""The biased optimisers of FedGBO and MFL (docs/algorithms.md#fedgbo), as plain math.

Each optimiser O with state s has
  U(g, s)        the update direction with s held FIXED (FedGBO clients),
  moving(s, g)   one ordinary step that also moves s (MFL clients),
  T(g̃, s)        the state update from a gradient estimate (FedGBO server),
  I(Δ̄, s, K, η)  the inverse of K fixed-state steps: the g̃ whose K steps of
                 U from x_t reproduce x_{t+1} = x_t − Δ̄ (FedGBO tracking).
Corrected table (docs/algorithms.md#fedgbo: ε outside √, g² in v), init m = 0, v = 1, no bias
correction (MFL-Adam may switch it on; its step counter t is part of s):

  SGDm     U = βm + (1−β)g                 T: m ← βm + (1−β)g̃
           I = ((Δ̄/(ηK)) − βm)/(1−β)
  RMSProp  U = g/(√v + ε)                  T: v ← βv + (1−β)g̃²
           I = Δ̄(√v + ε)/(ηK)
  Adam     U = (β1 m + (1−β1)g)/(√v + ε)   T: m, v as above
           I = (Δ̄(√v + ε)/(ηK) − β1 m)/(1−β1)
Ops per parameter per step (docs/algorithms.md#costs): C_fixed / C_moving = SGDm 5/8,
RMSProp 5/5, Adam 8/11.

AdaGrad is not in the seed's table; it is the RMSProp row with the decay
replaced by accumulation (U = g/(√v + ε), T: v ← v + g̃², I as RMSProp's),
ε outside √ like the other rows, and v_0 = `initial_v` (the AdaGrad
optimiser's own initial accumulator, since the FedGBO paper's v = 1 is a choice for
its three rows). Ops 5/6.
"""

import collections
import dataclasses

import tensorflow as tf

from tff_adaptive import errors

NAMES = ('sgdm', 'rmsprop', 'adam', 'adagrad')
OPS = {'sgdm': (5, 8), 'rmsprop': (5, 5), 'adam': (8, 11), 'adagrad': (5, 6)}


@dataclasses.dataclass(frozen=True)
class BiasedOptimizer:
  """One optimiser of the table; all methods take and return lists of tensors."""
  name: str
  beta_1: float = 0.9
  beta_2: float = 0.99
  epsilon: float = 1e-8
  bias_correction: bool = False
  initial_v: float = 1.0

  def __post_init__(self):
    if self.name not in NAMES:
      raise errors.ArgumentError('BiasedOptimizer', 'name',
                                 f'must be one of {", ".join(NAMES)}; got {self.name!r}')
    if not 0.0 <= self.beta_1 < 1.0:
      raise errors.ArgumentError('BiasedOptimizer', 'beta_1', f'must be in [0, 1); got {self.beta_1}')
    if not 0.0 <= self.beta_2 < 1.0:
      raise errors.ArgumentError('BiasedOptimizer', 'beta_2', f'must be in [0, 1); got {self.beta_2}')
    if not self.epsilon > 0:
      raise errors.ArgumentError('BiasedOptimizer', 'epsilon', f'must be > 0; got {self.epsilon}')

  @property
  def ops_fixed(self) -> int:
    return OPS[self.name][0]

  @property
  def ops_moving(self) -> int:
    return OPS[self.name][1]

  def init(self, specs) -> collections.OrderedDict:
    state = collections.OrderedDict()
    if self.name in ('sgdm', 'adam'):
      state['m'] = [tf.zeros(s.shape, tf.float32) for s in specs]
    if self.name in ('rmsprop', 'adam', 'adagrad'):
      state['v'] = [tf.fill(s.shape, tf.constant(self.initial_v, tf.float32)) for s in specs]
    if self.name == 'adam':
      state['step'] = tf.constant(0.0)  # a float so that MFL can average it
    return state

  def _denominator(self, v):
    return [tf.sqrt(vi) + self.epsilon for vi in v]

  def fixed_direction(self, state, grads):
    """U(g, s): s is not changed."""
    return self.fixed_direction_from(self.fixed_factors(state), grads)

  def fixed_factors(self, state) -> collections.OrderedDict:
    """The parts of U that depend on s only: β1·m and √v + ε.

    s is fixed for a whole FedGBO round, so a client computes them once and
    not at every step (`fixed_direction_from`); the arithmetic is the same,
    so the direction is bit-identical to `fixed_direction`.
    """
    factors = collections.OrderedDict()
    if 'm' in state:
      factors['beta_m'] = [self.beta_1 * m for m in state['m']]
    if 'v' in state:
      factors['denominator'] = self._denominator(state['v'])
    return factors

  def fixed_direction_from(self, factors, grads):
    """U(g, s) from `fixed_factors(s)`."""
    if 'beta_m' in factors:
      grads = [bm + (1 - self.beta_1) * g for bm, g in zip(factors['beta_m'], grads)]
    if 'denominator' in factors:
      grads = [g / d for g, d in zip(grads, factors['denominator'])]
    return list(grads)

  def track(self, state, g_tilde):
    """T(g̃, s)."""
    new = collections.OrderedDict(state)
    if 'm' in state:
      new['m'] = [self.beta_1 * m + (1 - self.beta_1) * g for m, g in zip(state['m'], g_tilde)]
    if 'v' in state and self.name == 'adagrad':
      new['v'] = [v + tf.square(g) for v, g in zip(state['v'], g_tilde)]
    elif 'v' in state:
      beta = self.beta_1 if self.name == 'rmsprop' else self.beta_2
      new['v'] = [beta * v + (1 - beta) * tf.square(g) for v, g in zip(state['v'], g_tilde)]
    if 'step' in state:
      new['step'] = state['step'] + 1.0
    return new

  def moving_step(self, state, grads):
    """One ordinary optimiser step: (s', direction)."""
    new = self.track(state, grads)
    if self.name == 'sgdm':
      return new, list(new['m'])
    if self.name in ('rmsprop', 'adagrad'):
      return new, [g / d for g, d in zip(grads, self._denominator(new['v']))]
    m, v = new['m'], new['v']
    if self.bias_correction:
      t = new['step']
      m = [mi / (1 - self.beta_1 ** t) for mi in m]
      v = [vi / (1 - self.beta_2 ** t) for vi in v]
    return new, [mi / d for mi, d in zip(m, self._denominator(v))]

  def invert(self, state, mean_delta, learning_rate, local_steps):
    """I: the g̃ whose K fixed-state steps of size η give Δ̄."""
    scale = 1.0 / (learning_rate * tf.cast(local_steps, tf.float32))
    if self.name == 'sgdm':
      return [(d * scale - self.beta_1 * m) / (1 - self.beta_1)
              for d, m in zip(mean_delta, state['m'])]
    denom = self._denominator(state['v'])
    if self.name in ('rmsprop', 'adagrad'):
      return [d * scale * q for d, q in zip(mean_delta, denom)]
    return [(d * scale * q - self.beta_1 * m) / (1 - self.beta_1)
            for d, q, m in zip(mean_delta, denom, state['m'])]
