"""The FedGBO paper's RMSProp and Adam as `tff.learning.optimizers.Optimizer`s.

TFF's `build_rmsprop` and `build_adam` start the second moment v at 0 and
bias-correct Adam; the FedGBO paper's optimisers (Mills et al., "Accelerating
Federated Learning with a Global Biased Optimiser", and `biased.BiasedOptimizer`,
the table of docs/algorithms.md#fedgbo) start v at 1 and do not correct. Early
in training that changes the step: with v = 1 a step is about η·g, small where
the gradient is; with v = 0 the first steps are about η/√(1−β) per coordinate
whatever the gradient's size.

These are that table's ordinary step (`BiasedOptimizer.moving_step`) behind
TFF's optimiser API, for the algorithms that take a TFF optimiser and call
`initialize`/`next` (Mime Lite's base optimiser and its server statistics):
`build_paper_rmsprop(η, decay, epsilon)`, `build_paper_adam(η, beta_1, beta_2,
epsilon)`. The state is TFF's layout: the learning rate under
`tff.learning.optimizers.LEARNING_RATE_KEY`, then the table's m, v (and Adam's
step count).
"""

import collections

import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.optimizers import biased

_LR = tff.learning.optimizers.LEARNING_RATE_KEY


class BiasedTFFOptimizer(tff.learning.optimizers.Optimizer):
  """`biased.BiasedOptimizer`'s ordinary step at `learning_rate`, as a TFF optimiser."""

  def __init__(self, learning_rate: float, table: biased.BiasedOptimizer):
    self._learning_rate = learning_rate
    self.table = table

  def initialize(self, specs):
    state = collections.OrderedDict([(_LR, tf.constant(self._learning_rate, tf.float32))])
    state.update(self.table.init(tf.nest.flatten(specs)))
    return state

  def next(self, state, weights, gradients):
    moments = collections.OrderedDict(
        (k, list(v) if isinstance(v, (list, tuple)) else v) for k, v in state.items() if k != _LR)
    new, direction = self.table.moving_step(moments, tf.nest.flatten(gradients))
    lr = state[_LR]
    stepped = [w - lr * d for w, d in zip(tf.nest.flatten(weights), direction)]
    out = collections.OrderedDict([(_LR, lr)])
    out.update(new)
    return out, tf.nest.pack_sequence_as(weights, stepped)

  def get_hparams(self, state):
    return collections.OrderedDict([(_LR, state[_LR])])

  def set_hparams(self, state, hparams):
    out = collections.OrderedDict(state)
    out[_LR] = hparams[_LR]
    return out


def build_paper_rmsprop(learning_rate: float, decay: float = 0.9,
                        epsilon: float = 1e-3) -> BiasedTFFOptimizer:
  """RMSProp with v₀ = 1: v ← βv + (1−β)g², x ← x − η g/(√v + ε)."""
  return BiasedTFFOptimizer(learning_rate, biased.BiasedOptimizer('rmsprop', beta_1=decay,
                                                                  epsilon=epsilon))


def build_paper_adam(learning_rate: float, beta_1: float = 0.9, beta_2: float = 0.99,
                     epsilon: float = 1e-3) -> BiasedTFFOptimizer:
  """Adam with v₀ = 1 and no bias correction: m ← β₁m + (1−β₁)g, v ← β₂v + (1−β₂)g²,
  x ← x − η m/(√v + ε)."""
  return BiasedTFFOptimizer(learning_rate, biased.BiasedOptimizer(
      'adam', beta_1=beta_1, beta_2=beta_2, epsilon=epsilon))
