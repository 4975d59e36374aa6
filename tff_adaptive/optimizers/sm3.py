"""SM3 client optimisers (memory-efficient AdaGrad and Adam) for FedAda2.

SM3 is from Anil, Gupta, Koren & Singer, "Memory-Efficient Adaptive
Optimization", NeurIPS 2019; FedAda2 (Lee et al. 2024, "Efficient Adaptive Federated
Optimization", Appendix B, Algorithms 3-4 and eq. (SM3)) uses it as the client
optimiser, with ε added outside the √ and optionally delayed statistics.

Covers (docs/algorithms.md#fedada2). A tensor of rank ≤ 1 gets one accumulator per coordinate
(singleton covers: plain diagonal AdaGrad). A tensor of rank r ≥ 2 with shape
(n_1, …, n_r) gets one accumulator vector per axis, μ_a of length n_a, whose
entry i covers the slice {j : j_a = i} (rows and columns for a matrix), so
the statistics take Σ_a n_a floats instead of Π_a n_a.

With g the gradient, η the learning rate and j a coordinate:
  SM3-I:   μ_b ← μ_b + max_{j∈S_b} g_j²;  ν_j = min_{b∋j} μ_b
  SM3-II:  ν_j = min_{b∋j} μ_b + g_j²;     μ_b ← max_{j∈S_b} ν_j
  both:    x_j ← x_j − η g_j / (√ν_j + ε)
  Adam:    μ_b ← β2 μ_b + (1 − β2) max_{j∈S_b} g_j²;  ν_j = min_{b∋j} μ_b
           m ← β1 m + (1 − β1) g (dense);  x ← x − η m̂ / (√ν̂ + ε)
           with m̂ = m/(1 − β1^t), ν̂ = ν/(1 − β2^r) if bias-corrected, else
           m̂ = m, ν̂ = ν.
Every μ_b upper-bounds the sum (or EMA) of g_j² over its cover, hence
ν ≥ Σ_s g_s², ν^II ≤ ν^I, and |Δx_j| ≤ η per step without delay.

Delayed statistics (z = `delay`). Local steps are numbered t = 1, 2, …
(`state['step']` counts the steps already taken). Step t is a refresh step iff
(t − 1) mod z = 0, i.e. t ∈ {1, 1 + z, 1 + 2z, …}: the first step of a round
always refreshes, so ν is never the all-zero start. A refresh step is exactly
the undelayed rule above with the current g_t. On any other step μ is left
untouched and g_t only enters the numerator (and Adam's dense m), with
ν_j = min_{b∋j} μ_b. For SM3-I and Adam this is exactly the ν of the last
refresh; for SM3-II it is the cover bound min_b max_{i∈S_b} ν_i ≥ that stale
ν, because keeping the stale ν itself would need |x| floats and forfeit SM3's
memory saving. Gradients of non-refresh steps never enter μ, so with z > 1
the |Δx_j| ≤ η bound no longer holds (the FedAda2 paper, Appendix F). The Adam bias
correction for ν uses r = ⌊(t − 1)/z⌋ + 1, the number of refreshes so far,
as the FedAda2 paper (Appendix E) asks for an adjusted debiasing term.

State: hparams (`learning_rate`, `epsilon`, and for Adam `beta_1`, `beta_2`),
`step`, Adam's dense first moment `accumulator` (weights' structure), and
`sm3_statistics`: one tuple of μ tensors per leaf of `tf.nest.flatten(weights)`.

Client memory in floats (`client_state_floats`): Adam 2|x|, AdaGrad |x|,
SM3-AdaGrad Σ covers, SM3-Adam |x| + Σ covers; scalar hyperparameters and the
step counter are not counted. Stack Overflow LR (10000 × 500 kernel plus a
500 bias): Σ covers = 10000 + 500 + 500 = 11,000 floats.
"""

import collections
import math
import numbers
from typing import Any, Iterable

import tensorflow as tf
from tensorflow_federated.python.learning.optimizers import optimizer

from tff_adaptive.optimizers import common

_ACCUMULATOR = 'accumulator'  # Adam's dense first moment, as in TFF's Adam.
_STATISTICS = 'sm3_statistics'  # Per flattened weight: a tuple of μ tensors.
_FORMS = ('I', 'II', 'adam')

State = collections.OrderedDict[str, Any]


def cover_shapes(shape: Iterable[int]) -> list[tuple[int, ...]]:
  """Shapes of the SM3 accumulators of a tensor of the given static shape."""
  shape = tuple(tf.TensorShape(shape).as_list())
  if len(shape) <= 1:
    return [shape]
  return [(n,) for n in shape]


def _cover_max(x: tf.Tensor) -> list[tf.Tensor]:
  """max_{j∈S_b} x_j for every cover b of x."""
  rank = x.shape.rank
  if rank <= 1:
    return [x]
  return [tf.reduce_max(x, axis=[b for b in range(rank) if b != a])
          for a in range(rank)]


def _cover_min(stats: tuple[tf.Tensor, ...], rank: int) -> tf.Tensor:
  """ν_j = min_{b∋j} μ_b, broadcast back to the full tensor shape."""
  if rank <= 1:
    return stats[0]
  nu = None
  for a, mu in enumerate(stats):
    mu = tf.reshape(mu, [-1 if i == a else 1 for i in range(rank)])
    nu = mu if nu is None else tf.minimum(nu, mu)
  return nu


def _num_floats(x: Any) -> int:
  return tf.TensorShape(x.shape).num_elements()


def sm3_statistics_floats(specs: Any) -> int:
  """Σ covers: floats in SM3's second-moment statistics for `specs`."""
  return sum(math.prod(s) for x in tf.nest.flatten(specs)
             for s in cover_shapes(x.shape))


def client_state_floats(optimizer_name: str, specs: Any) -> int:
  """Floats of client optimiser state for weights shaped like `specs`.

  Args:
    optimizer_name: one of 'sgd', 'sgdm', 'adagrad', 'adam', 'yogi',
      'sm3_adagrad', 'sm3_adam'.
    specs: a nested structure of anything with a static `.shape`
      (`tf.TensorSpec`, variables, tensors, arrays).

  Returns:
    Number of floats, excluding scalar hyperparameters and step counters.
  """
  n = sum(_num_floats(x) for x in tf.nest.flatten(specs))
  covers = sm3_statistics_floats(specs)
  table = {'sgd': 0, 'sgdm': n, 'adagrad': n, 'adam': 2 * n, 'yogi': 2 * n,
           'sm3_adagrad': covers, 'sm3_adam': n + covers}
  if optimizer_name not in table:
    raise ValueError(f'`optimizer_name` must be one of {sorted(table)}, '
                     f'found {optimizer_name!r}.')
  return table[optimizer_name]


class SM3(common.HparamsInState, optimizer.Optimizer[State, Any, State]):
  """SM3-I, SM3-II or SM3-Adam with delayed statistics; see module docstring."""

  def __init__(self,
               form: str,
               learning_rate: optimizer.Float,
               epsilon: optimizer.Float,
               delay: int = 1,
               beta_1: optimizer.Float = 0.9,
               beta_2: optimizer.Float = 0.999,
               bias_correction: bool = False):
    if form not in _FORMS:
      raise ValueError(f'`form` must be one of {_FORMS}, found {form!r}.')
    common.check_range('learning_rate', learning_rate, 0.0)
    common.check_range('epsilon', epsilon, 0.0, low_open=True)
    if (isinstance(delay, bool) or not isinstance(delay, numbers.Integral)
        or delay < 1):
      raise ValueError(f'`delay` must be an integer >= 1, found {delay!r}.')
    self._form = form
    self._delay = int(delay)
    self._bias_correction = bias_correction
    self._hparams = collections.OrderedDict(
        [(common.LR, learning_rate), (common.EPSILON, epsilon)])
    if form == 'adam':
      common.check_range('beta_1', beta_1, 0.0, 1.0)
      common.check_range('beta_2', beta_2, 0.0, 1.0)
      self._hparams[common.BETA_1] = beta_1
      self._hparams[common.BETA_2] = beta_2

  def initialize(self, specs: Any) -> State:
    state = collections.OrderedDict(self._hparams)
    state[common.STEP] = 0
    if self._form == 'adam':
      state[_ACCUMULATOR] = tf.nest.map_structure(
          lambda s: tf.zeros(s.shape, s.dtype), specs)
    # Tuples, not lists: tf.data (TFF's client loop) would stack a list.
    state[_STATISTICS] = tuple(
        tuple(tf.zeros(c, s.dtype) for c in cover_shapes(s.shape))
        for s in tf.nest.flatten(specs))
    return state

  def next(self, state: State, weights: Any,
           gradients: Any) -> tuple[State, Any]:
    gradients = optimizer.handle_indexed_slices_gradients(gradients)
    optimizer.check_weights_gradients_match(weights, gradients)
    adam = self._form == 'adam'
    flat_w = tf.nest.flatten(weights)
    flat_g = tf.nest.flatten(gradients)
    flat_m = (tf.nest.flatten(state[_ACCUMULATOR]) if adam
              else [None] * len(flat_w))
    flat_stats = tuple(state[_STATISTICS])
    if len(flat_stats) != len(flat_w) or len(flat_m) != len(flat_w):
      raise ValueError('Optimizer state does not match the weights; was '
                       '`initialize` called with specs of these weights?')
    step = state[common.STEP]  # Steps already taken: this is step t = step + 1.
    refresh = tf.equal(tf.math.floormod(step, self._delay), 0)
    refreshes = tf.math.floordiv(step, self._delay) + 1

    new_w, new_m, new_stats = [], [], []
    for w, g, m, stats in zip(flat_w, flat_g, flat_m, flat_stats):
      if g is None:
        new_w.append(w)
        new_m.append(m)
        new_stats.append(stats)
        continue
      hp = {k: common.cast(state[k], g.dtype) for k in self._hparams}
      rank = g.shape.rank
      g2 = tf.square(g)
      if self._form == 'I':
        fresh = tuple(mu + c for mu, c in zip(stats, _cover_max(g2)))
        stats = tuple(tf.where(refresh, f, mu) for f, mu in zip(fresh, stats))
        nu = _cover_min(stats, rank)
      elif self._form == 'II':
        nu = _cover_min(stats, rank) + tf.where(refresh, g2, tf.zeros_like(g2))
        stats = tuple(tf.where(refresh, c, mu)
                      for c, mu in zip(_cover_max(nu), stats))
      else:
        b1, b2 = hp[common.BETA_1], hp[common.BETA_2]
        fresh = tuple(b2 * mu + (1.0 - b2) * c
                      for mu, c in zip(stats, _cover_max(g2)))
        stats = tuple(tf.where(refresh, f, mu) for f, mu in zip(fresh, stats))
        nu = _cover_min(stats, rank)
        m = b1 * m + (1.0 - b1) * g
      numerator = m if adam else g
      if adam and self._bias_correction:
        numerator = m / (1.0 - tf.pow(b1, tf.cast(step + 1, g.dtype)))
        nu = nu / (1.0 - tf.pow(b2, tf.cast(refreshes, g.dtype)))
      new_w.append(w - hp[common.LR] * numerator / (tf.sqrt(nu) + hp[common.EPSILON]))
      new_m.append(m)
      new_stats.append(stats)

    new_state = collections.OrderedDict((k, state[k]) for k in self._hparams)
    new_state[common.STEP] = step + 1
    if adam:
      new_state[_ACCUMULATOR] = tf.nest.pack_sequence_as(
          state[_ACCUMULATOR], new_m)
    new_state[_STATISTICS] = tuple(new_stats)
    return new_state, tf.nest.pack_sequence_as(weights, new_w)


def build_sm3_adagrad(learning_rate: optimizer.Float,
                      variant: str = 'II',
                      epsilon: optimizer.Float = 1e-8,
                      delay: int = 1) -> optimizer.Optimizer:
  """SM3 AdaGrad (`variant` 'I' or 'II'), ε outside √, statistics every `delay` steps."""
  if variant not in ('I', 'II'):
    raise ValueError(f'`variant` must be "I" or "II", found {variant!r}.')
  return SM3(variant, learning_rate, epsilon, delay)


def build_sm3_adam(learning_rate: optimizer.Float,
                   beta_1: optimizer.Float = 0.9,
                   beta_2: optimizer.Float = 0.999,
                   epsilon: optimizer.Float = 1e-8,
                   bias_correction: bool = False,
                   delay: int = 1) -> optimizer.Optimizer:
  """SM3 Adam: dense first moment, SM3 second moment, statistics every `delay` steps."""
  return SM3('adam', learning_rate, epsilon, delay, beta_1, beta_2,
             bias_correction)
