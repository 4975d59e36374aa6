"""`Recipe`: an algorithm's math as TF functions; every execution runs these."""

import dataclasses
from collections.abc import Callable
from typing import Any, Optional

import tensorflow_federated as tff

Structure = Any
# Ops per parameter per local step of the optimiser, docs/algorithms.md#costs (SGD: 2).
DEFAULT_OPTIMIZER_OPS = 2.0


@dataclasses.dataclass(frozen=True)
class Recipe:
  """An algorithm's math as TF functions over lists of trainable tensors.

  Attributes:
    name: for messages.
    init_stats: trainable TensorSpecs → s_0 (server-side statistics).
    broadcast: s → what clients receive besides x (a sub-structure of s).
    init_local: (broadcast value, y_0) → client optimiser state.
    local_step: (local, y, g, η, k) → (local, y').
    server_update: (x, s, Δ̄, mean extra upload, η, K) → (x', s').
    upload: (local, g_0) → extra tensors averaged on the server, or None.
    optimizer_ops_per_param: C in the FLOP model (docs/algorithms.md#costs).
    The client optimiser memory reported is the float size of `init_local`'s
    output (what a client holds besides the model).
    equal_local_steps: the server step assumes every client ran exactly K
      steps (FedGBO's inverse step); a round violating it fails loudly.
    weighting: default client weighting.
    uses_first_gradient: `upload` reads g_0 (MimeXlite); otherwise the client
      loop does not keep it.
    full_gradient: before training, the client makes a pass over the batches
      it will train on with the model at x_t and hands `upload`, in place of
      g_0, the example-weighted mean gradient Σ_b n_b g_b / Σ_b n_b (Mime's
      "full" gradient, Karimireddy et al. 2021); this pass costs one more
      forward/backward per trained example. Exclusive with
      `uses_first_gradient`.
    get_server_hparams: s → the server's hyperparameters (e.g. a server
      optimiser's `get_hparams`), the `finalizer` part of `process.get_hparams`;
      None: no server hyperparameters.
    set_server_hparams: (s, hparams) → s.
    init_client_state: trainable TensorSpecs → the state every client keeps
      from one round it takes part in to the next, as a client that has not
      trained yet holds it (SCAFFOLD's c_i = 0); None: clients keep nothing.
      When set, `init_local` takes the client's state as a third argument,
      the round's per-client input is OrderedDict(train=dataset,
      private=state) and each client returns its new state
      (`client_state_update`), which the caller stores.
    client_state_update: local → the client's new state (required with
      `init_client_state`); a client whose update is not finite keeps its old
      state.
    sum_extra: the extra upload is summed over the clients (server_update
      receives Σ_i extra_i; a non-finite client adds zeros), not averaged
      with Δ's weights.
  """
  name: str
  init_stats: Callable[[list], Structure]
  broadcast: Callable[[Structure], Structure]
  init_local: Callable[[Structure, list], Structure]
  local_step: Callable[..., tuple[Structure, list]]
  server_update: Callable[..., tuple[list, Structure]]
  upload: Optional[Callable[[Structure, list], Structure]] = None
  optimizer_ops_per_param: float = DEFAULT_OPTIMIZER_OPS
  equal_local_steps: bool = False
  weighting: tff.learning.ClientWeighting = tff.learning.ClientWeighting.NUM_EXAMPLES
  uses_first_gradient: bool = False
  full_gradient: bool = False
  get_server_hparams: Optional[Callable[[Structure], Structure]] = None
  set_server_hparams: Optional[Callable[[Structure, Structure], Structure]] = None
  init_client_state: Optional[Callable[[list], Structure]] = None
  client_state_update: Optional[Callable[[Structure], Structure]] = None
  sum_extra: bool = False

  def __post_init__(self):
    if self.uses_first_gradient and self.full_gradient:
      raise ValueError(f'{self.name}: uses_first_gradient and full_gradient exclude each other')
    if (self.init_client_state is None) != (self.client_state_update is None):
      raise ValueError(f'{self.name}: init_client_state and client_state_update go together')

  @property
  def has_client_state(self) -> bool:
    return self.init_client_state is not None

  def initial_local(self, broadcast_value, y0, client_state=()):
    """`init_local`, given the client's state when clients keep one."""
    if self.has_client_state:
      return self.init_local(broadcast_value, y0, client_state)
    return self.init_local(broadcast_value, y0)
