"""Some of the model's weights are each client's own (MTFL's batch-norm patches).

`split(...)` gives a recipe's extensions for it:

  `SplitWeights`    Δ and the server step cover the shared positions only:
                    Δ = OrderedDict(trainable=shared Δ, non_trainable=Δ of the
                    averaged non-trainable weights); x keeps its private
                    values; with `average_non_trainable` the shared
                    non-trainable weights (batch-norm moving statistics) are
                    averaged like FedAvg averages them (x_nt − mean Δ_nt),
                    otherwise they stay at their initial values.
  `PrivateWeights`  (when some position is private) the clients' state:
                    OrderedDict(weights=OrderedDict(trainable=, non_trainable=),
                    local=the recipe's own client state or ()), starting at
                    the initial model's values, patched over x_t before UA
                    and training, returned as the client's new state, never
                    uploaded.

Positions are in `ModelWeights` order (flattened trainable, non-trainable).
"""

import collections
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_adaptive.extensions import client_state as client_state_lib
from tff_adaptive.rounds import extension


def split(trainable: tuple = (), non_trainable: tuple = (), average_non_trainable: bool = False,
          own: Optional[client_state_lib.ClientState] = None) -> tuple:
  """The extensions of private weights at these positions, with the recipe's
  own client state `own` kept beside them."""
  trainable, non_trainable = tuple(trainable), tuple(non_trainable)
  extensions = (SplitWeights(trainable, non_trainable, average_non_trainable),)
  if trainable or non_trainable:
    return extensions + (PrivateWeights(trainable, non_trainable, own),)
  return extensions + ((own,) if own is not None else ())


def shared(private, count: int) -> list[int]:
  """The positions of `count` weights that are not in `private`."""
  return [i for i in range(count) if i not in private]


class SplitWeights(extension.WeightsSplit):
  name = 'split_weights'

  def __init__(self, trainable: tuple, non_trainable: tuple, average_non_trainable: bool):
    self.trainable, self.non_trainable = trainable, non_trainable
    self.average_non_trainable = average_non_trainable

  def delta_structure(self, trainable, non_trainable):
    t, n = tf.nest.flatten(trainable), tf.nest.flatten(non_trainable)
    averaged = shared(self.non_trainable, len(n)) if self.average_non_trainable else []
    return collections.OrderedDict(
        trainable=tuple(t[i] for i in shared(self.trainable, len(t))),
        non_trainable=tuple(n[i] for i in averaged))

  def cohort_unsupported(self, view, others: tuple):
    # The program does not thread the statistics that extra training passes
    # move, and these weights keep or average them.
    if any(o.extra_training_passes for o in others) and view.has_non_trainable:
      return extension.MOVED_STATISTICS
    return None

  def kept(self, carry) -> list:
    return ([carry['y'][i] for i in self.trainable] +
            [carry['n'][i] for i in self.non_trainable])

  def server_delta(self, x: list, mean_delta) -> list:
    """Δ̄ of the shared positions as a list over all of x, zeros at the private ones."""
    values = iter(mean_delta['trainable'])
    return [tf.zeros_like(w) if i in self.trainable else next(values) for i, w in enumerate(x)]

  def server_weights(self, x: list, new_x: list, non_trainable, mean_delta):
    new_x = list(new_x)
    for i in self.trainable:  # never the server's to move
      new_x[i] = x[i]
    if not self.average_non_trainable:
      return new_x, non_trainable
    n = [tf.identity(t) for t in tf.nest.flatten(non_trainable)]
    for i, d in zip(shared(self.non_trainable, len(n)), mean_delta['non_trainable']):
      n[i] = n[i] - d
    return new_x, tf.nest.pack_sequence_as(non_trainable, n)

  def undownloaded_specs(self, trainable_specs, non_trainable_specs) -> list:
    # Private weights are never read by a client (its own are patched over them).
    return ([trainable_specs[i] for i in self.trainable] +
            [non_trainable_specs[i] for i in self.non_trainable])


class PrivateWeights(extension.StateKeeper):
  name = 'private_weights'
  needs_initial_weights = True

  def __init__(self, trainable: tuple, non_trainable: tuple,
               own: Optional[client_state_lib.ClientState] = None):
    self.trainable, self.non_trainable, self.own = trainable, non_trainable, own

  def start_weights(self, y0: list, n0: list, state) -> tuple:
    y0, n0 = list(y0), list(n0)
    for i, value in zip(self.trainable, state['weights']['trainable']):
      y0[i] = value
    for i, value in zip(self.non_trainable, state['weights']['non_trainable']):
      n0[i] = value
    return y0, n0

  def initial_state(self, trainable_specs, initial_weights=None):
    own = self.own.initial_state(trainable_specs) if self.own is not None else ()
    constants = lambda weights: [tf.constant(w) for w in tf.nest.flatten(weights)]
    return self._state(constants(initial_weights.trainable),
                       constants(initial_weights.non_trainable), own)

  def _state(self, trainable, non_trainable, own):
    return collections.OrderedDict(
        weights=collections.OrderedDict(
            trainable=tuple(trainable[i] for i in self.trainable),
            non_trainable=tuple(non_trainable[i] for i in self.non_trainable)),
        local=own)

  def local_init_args(self, state) -> tuple:
    return (state['local'],) if self.own is not None else ()

  def new_state(self, carry):
    own = self.own.new_state(carry) if self.own is not None else ()
    return self._state(carry['y'], carry['n'], own)

  def leaf_names(self, structure) -> list:
    own = (self.own.leaf_names(structure['local']) if self.own is not None else [])
    names = collections.OrderedDict(
        weights=collections.OrderedDict(
            trainable=tuple(f'trainable_{i}' for i in self.trainable),
            non_trainable=tuple(f'non_trainable_{i}' for i in self.non_trainable)),
        local=tf.nest.pack_sequence_as(structure['local'], list(own)))
    return tf.nest.flatten(names)

  def own_state_specs(self, trainable_specs):
    return self.own.own_state_specs(trainable_specs) if self.own is not None else None

  def private_state_floats(self, trainable_specs, non_trainable_specs) -> Optional[int]:
    specs = ([trainable_specs[i] for i in self.trainable] +
             [non_trainable_specs[i] for i in self.non_trainable])
    own = self.own_state_specs(trainable_specs)
    return (sum(int(np.prod(s.shape)) for s in specs) +
            sum(int(np.prod(t.shape)) for t in tf.nest.flatten(own if own is not None else ())))
