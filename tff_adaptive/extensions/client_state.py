"""The clients keep a state from one round they take part in to the next.

SCAFFOLD's control variate c_i, FedDyn's linear term, MTFL's Adam moments of
its private weights: `init` gives a client's state before its first round,
`init_local` receives it as its third argument, and `update(local)` is the
client's new state after the round. The round's per-client input is then
OrderedDict(train=dataset, private=state) and each client returns its new
state, which the caller stores (`rounds.stateful.StatefulClientsProcess`).
"""

from collections.abc import Callable
from typing import Any, Optional

from tff_adaptive.rounds import extension


class ClientState(extension.StateKeeper):
  """Attributes:
    init: trainable TensorSpecs → the state a client holds before its first round.
    update: the recipe's local state after the steps → the client's new state.
    names: names of the state's leaves (`tf.nest.flatten` order) for the
      store; () : state_0, state_1, ...
  """
  name = 'client_state'

  def __init__(self, init: Callable[[list], Any], update: Callable[[Any], Any],
               names: tuple = ()):
    self.init, self.update, self.names = init, update, tuple(names)

  def initial_state(self, trainable_specs, initial_weights=None):
    del initial_weights
    return self.init(list(trainable_specs))

  def local_init_args(self, state) -> tuple:
    return (state,)

  def new_state(self, carry):
    return self.update(carry['local'])

  def leaf_names(self, structure) -> list:
    return list(self.names) or super().leaf_names(structure)

  def own_state_specs(self, trainable_specs) -> Optional[Any]:
    return self.init(list(trainable_specs))
