"""Adaptive optimisers with the FedOpt paper's exact (Algorithm 2) semantics.

Reddi et al., "Adaptive Federated Optimization", ICLR 2021,
Algorithm 2. With Δ̄ the aggregated client update in TFF's sign convention
(x_t − y, so it is consumed as a gradient):

  m_t = β1 m_{t−1} + (1 − β1) Δ̄                          m_{−1} = 0
  Adagrad: v_t = v_{t−1} + Δ̄²
  Adam:    v_t = β2 v_{t−1} + (1 − β2) Δ̄²
  Yogi:    v_t = v_{t−1} − (1 − β2) Δ̄² sign(v_{t−1} − Δ̄²)
  x_{t+1} = x_t − η m_t / (√v_t + τ)                     v_{−1} = τ²

and no bias correction. This differs from `tff.learning.optimizers.build_*`
(bias-corrected Adam/Yogi, Adagrad without momentum and ε inside the √). Since
τ is outside the √ and v_{−1} = τ², scaling Δ̄ by c, τ by c and v_{−1} by c²
scales both m_t and √v_t + τ by c, which leaves the iterates unchanged
(docs/algorithms.md#fedopt).

The same update, with other options, is what the other papers call:
  * the FedGBO paper's AdaptiveFedOpt (docs/algorithms.md#fedopt): server Adam =
    `build_paper_adam(..., initial_accumulator_value=1.0)`, server RMSProp =
    the same with `beta_1=0.0`; its SGDm is TFF's `build_sgdm`.
  * the FedAda2 paper's server AdaGrad (docs/algorithms.md#fedada2, v = Σ Δ̄², optional momentum):
    `build_paper_adagrad(..., beta_1=β1 or 0.0, initial_accumulator_value=0.0)`.
  * the FedAda2 paper's client Adam/AdaGrad (FedAda2 baselines, docs/algorithms.md#fedada2):
    `build_paper_client_adam` / `build_paper_client_adagrad`: zero initial
    state, ε outside the √, Adam optionally bias-corrected
    (m̂ = m/(1 − β1^t), v̂ = v/(1 − β2^t)). For direct joint adaptivity the
    algorithm writes the server's v into `state['preconditioner']` before local
    training (bias correction assumes the zero start, so leave it off there).

State keys follow TFF's Adam: `accumulator` is m, `preconditioner` is v, and
τ/ε is stored under `epsilon` so that TFF-style hparam code works unchanged.
A literal `beta_1=0` drops m (and the `beta_1` hparam) from the state.
"""

import collections
from typing import Any, Optional

import tensorflow as tf
from tensorflow_federated.python.learning.optimizers import nest_utils
from tensorflow_federated.python.learning.optimizers import optimizer

from tff_adaptive.optimizers import common

_ACCUMULATOR = 'accumulator'
_PRECONDITIONER = 'preconditioner'
_KINDS = ('adagrad', 'adam', 'yogi')

State = collections.OrderedDict[str, Any]


class PaperAdaptive(common.HparamsInState, optimizer.Optimizer[State, Any, State]):
  """FedOpt Algorithm 2 Adagrad/Adam/Yogi; see the module docstring."""

  def __init__(self,
               kind: str,
               learning_rate: optimizer.Float,
               beta_1: optimizer.Float,
               beta_2: optimizer.Float,
               epsilon: optimizer.Float,
               initial_accumulator_value: optimizer.Float,
               bias_correction: bool = False):
    if kind not in _KINDS:
      raise ValueError(f'`kind` must be one of {_KINDS}, found {kind!r}.')
    if bias_correction and kind != 'adam':
      raise ValueError('`bias_correction` is only defined for kind="adam".')
    common.check_range('learning_rate', learning_rate, 0.0)
    common.check_range('beta_1', beta_1, 0.0, 1.0)
    common.check_range('beta_2', beta_2, 0.0, 1.0)
    # ε = 0 with a zero accumulator would divide 0 by 0 on untouched weights.
    common.check_range('epsilon', epsilon, 0.0, low_open=True)
    common.check_range('initial_accumulator_value', initial_accumulator_value, 0.0)
    self._kind = kind
    # A literal β1 = 0 (plain AdaGrad, RMSProp) keeps no first moment, so the
    # state holds only the floats the algorithm needs (client memory, docs/algorithms.md#fedada2).
    self._momentum = tf.is_tensor(beta_1) or beta_1 != 0
    self._hparams = collections.OrderedDict([(common.LR, learning_rate)])
    if self._momentum:
      self._hparams[common.BETA_1] = beta_1
    if kind != 'adagrad':
      self._hparams[common.BETA_2] = beta_2
    self._hparams[common.EPSILON] = epsilon
    self._v0 = initial_accumulator_value
    self._bias_correction = bias_correction

  def initialize(self, specs: Any) -> State:
    state = collections.OrderedDict(self._hparams)
    state[common.STEP] = 0
    state[_PRECONDITIONER] = tf.nest.map_structure(
        lambda s: tf.fill(s.shape, common.cast(self._v0, s.dtype)), specs)
    if self._momentum:
      state[_ACCUMULATOR] = tf.nest.map_structure(
          lambda s: tf.zeros(s.shape, s.dtype), specs)
    return state

  def next(self, state: State, weights: Any,
           gradients: Any) -> tuple[State, Any]:
    gradients = optimizer.handle_indexed_slices_gradients(gradients)
    optimizer.check_weights_gradients_match(weights, gradients)
    moments = [_PRECONDITIONER] + ([_ACCUMULATOR] if self._momentum else [])
    for key in moments:
      optimizer.check_weights_state_match(weights, state[key], key)
    step = state[common.STEP] + 1

    def update(w, g, v, *m):
      if g is None:
        return (w, v) + m
      hp = {k: common.cast(state[k], g.dtype) for k in self._hparams}
      b1 = hp.get(common.BETA_1, tf.zeros([], g.dtype))
      m = [b1 * mi + (1.0 - b1) * g for mi in m]
      g2 = tf.square(g)
      if self._kind == 'adagrad':
        v = v + g2
      elif self._kind == 'adam':
        v = hp[common.BETA_2] * v + (1.0 - hp[common.BETA_2]) * g2
      else:
        v = v - (1.0 - hp[common.BETA_2]) * g2 * tf.sign(v - g2)
      m_hat, v_hat = (m[0] if m else g), v
      if self._bias_correction:
        t = tf.cast(step, g.dtype)
        m_hat = m_hat / (1.0 - tf.pow(b1, t))
        v_hat = v / (1.0 - tf.pow(hp[common.BETA_2], t))
      w = w - hp[common.LR] * m_hat / (tf.sqrt(v_hat) + hp[common.EPSILON])
      return (w, v) + tuple(m)

    weights, *new_moments = nest_utils.map_at_leaves(
        update, weights, gradients, *[state[k] for k in moments],
        num_outputs=1 + len(moments))
    new_state = collections.OrderedDict(
        (k, state[k]) for k in self._hparams)
    new_state[common.STEP] = step
    new_state.update(zip(moments, new_moments))
    return new_state, weights


def _server(kind: str, learning_rate: optimizer.Float, beta_1: optimizer.Float,
            beta_2: optimizer.Float, tau: optimizer.Float,
            initial_accumulator_value: Optional[optimizer.Float]
           ) -> PaperAdaptive:
  if initial_accumulator_value is None:
    initial_accumulator_value = tau**2
  return PaperAdaptive(kind, learning_rate, beta_1, beta_2, tau,
                       initial_accumulator_value)


def build_paper_adagrad(
    learning_rate: optimizer.Float,
    beta_1: optimizer.Float = 0.9,
    beta_2: optimizer.Float = 0.0,
    tau: optimizer.Float = 1e-3,
    initial_accumulator_value: Optional[optimizer.Float] = None,
) -> optimizer.Optimizer:
  """FedAdagrad server optimiser of FedOpt Algorithm 2 (v_{−1} = τ² if None).

  `beta_2` is accepted (and ignored) so the three server builders share one
  signature.
  """
  del beta_2
  return _server('adagrad', learning_rate, beta_1, 0.0, tau,
                 initial_accumulator_value)


def _server_builder(kind: str, algorithm: str):
  """The FedAdam / FedYogi server optimiser builder: they differ only in `kind`."""

  def build(learning_rate: optimizer.Float,
            beta_1: optimizer.Float = 0.9,
            beta_2: optimizer.Float = 0.99,
            tau: optimizer.Float = 1e-3,
            initial_accumulator_value: Optional[optimizer.Float] = None,
           ) -> optimizer.Optimizer:
    return _server(kind, learning_rate, beta_1, beta_2, tau, initial_accumulator_value)

  build.__name__ = build.__qualname__ = f'build_paper_{kind}'
  build.__doc__ = f'{algorithm} server optimiser of FedOpt Algorithm 2 (v_{{−1}} = τ² if None).'
  return build


build_paper_adam = _server_builder('adam', 'FedAdam')
build_paper_yogi = _server_builder('yogi', 'FedYogi')


def build_paper_client_adam(
    learning_rate: optimizer.Float,
    beta_1: optimizer.Float = 0.9,
    beta_2: optimizer.Float = 0.999,
    epsilon: optimizer.Float = 1e-8,
    bias_correction: bool = False,
) -> optimizer.Optimizer:
  """FedAda2's client Adam: zero start, ε outside √, optional bias correction.

  `bias_correction` defaults to False to match `sm3.build_sm3_adam`, so the
  no-PC Adam baseline and FedAda2's SM3-Adam differ only in the preconditioner.
  """
  return PaperAdaptive('adam', learning_rate, beta_1, beta_2, epsilon, 0.0,
                       bias_correction)


def build_paper_client_adagrad(
    learning_rate: optimizer.Float,
    epsilon: optimizer.Float = 1e-8,
    beta_1: optimizer.Float = 0.0,
) -> optimizer.Optimizer:
  """FedAda2's client AdaGrad: v = Σ g², x ← x − η m/(√v + ε), v_0 = 0."""
  return PaperAdaptive('adagrad', learning_rate, beta_1, 0.0, epsilon, 0.0)
