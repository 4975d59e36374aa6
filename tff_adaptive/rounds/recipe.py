"""`Recipe`: an algorithm's math as TF functions; every execution runs these."""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Optional

import tensorflow_federated as tff

from tff_adaptive.rounds import extension as extension_lib

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
    init_local: (broadcast value, y_0[, the state keeper's `local_init_args`])
      → client optimiser state.
    local_step: (local, y, g, η, k[, the extensions' `step_context` keywords])
      → (local, y').
    server_update: (x, s, Δ̄, mean extra upload, η, K) → (x', s').
    upload: (local, g) → extra tensors averaged on the server, or None; g is
      an extension's `upload_gradient` (the first step's gradient, the pass
      at x_t's mean) or ().
    optimizer_ops_per_param: C in the FLOP model (docs/algorithms.md#costs).
    The client optimiser memory reported is the float size of `init_local`'s
    output (what a client holds besides the model).
    weighting: default client weighting.
    get_server_hparams: s → the server's hyperparameters (e.g. a server
      optimiser's `get_hparams`), the `finalizer` part of `process.get_hparams`;
      None: no server hyperparameters.
    set_server_hparams: (s, hparams) → s.
    sum_extra: the extra upload is summed over the clients (server_update
      receives Σ_i extra_i; a non-finite client adds zeros), not averaged
      with Δ's weights.
    extensions: what the clients do beyond this core (`rounds.extension`,
      `tff_adaptive/extensions/`): client state, private weights, more
      gradient passes, user accuracy, ...
    client_hparams: the client step's hyperparameters besides η and K, name →
      initial value (e.g. FedProx's μ): float32 entries of `state.client_work`
      beside η and K, so that they are state, not constants of the program (a
      population's members may differ in them, `set_hparams` changes them), sent
      with η and K and given to `local_step` as keywords.
  """
  name: str
  init_stats: Callable[[list], Structure]
  broadcast: Callable[[Structure], Structure]
  init_local: Callable[..., Structure]
  local_step: Callable[..., tuple[Structure, list]]
  server_update: Callable[..., tuple[list, Structure]]
  upload: Optional[Callable[[Structure, Any], Structure]] = None
  optimizer_ops_per_param: float = DEFAULT_OPTIMIZER_OPS
  weighting: tff.learning.ClientWeighting = tff.learning.ClientWeighting.NUM_EXAMPLES
  get_server_hparams: Optional[Callable[[Structure], Structure]] = None
  set_server_hparams: Optional[Callable[[Structure, Structure], Structure]] = None
  sum_extra: bool = False
  extensions: tuple = ()
  client_hparams: Mapping[str, float] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    extensions = tuple(self.extensions)
    object.__setattr__(self, 'extensions', extensions)
    for i, ext in enumerate(extensions):
      if not isinstance(ext, extension_lib.Extension):
        raise TypeError(f'{self.name}: extensions must be rounds.extension.Extension objects; '
                        f'got {type(ext).__name__}')
      try:
        ext.check(extensions[:i] + extensions[i + 1:])
      except ValueError as e:
        raise ValueError(f'{self.name}: {e}') from None
    extension_lib.one_of(extensions, extension_lib.StateKeeper, self.name)
    extension_lib.one_of(extensions, extension_lib.WeightsSplit, self.name)

  def with_extensions(self, *extensions) -> 'Recipe':
    """This recipe with `extensions` added."""
    return dataclasses.replace(self, extensions=self.extensions + tuple(extensions))

  @property
  def state_keeper(self) -> Optional[extension_lib.StateKeeper]:
    return extension_lib.one_of(self.extensions, extension_lib.StateKeeper, self.name)

  @property
  def weights_split(self) -> Optional[extension_lib.WeightsSplit]:
    return extension_lib.one_of(self.extensions, extension_lib.WeightsSplit, self.name)

  @property
  def has_client_state(self) -> bool:
    return self.state_keeper is not None

  @property
  def evaluates_clients(self) -> bool:
    return any(e.evaluates_clients for e in self.extensions)

  @property
  def has_client_output(self) -> bool:
    """Clients take something back from the round (their state, what they measured)."""
    return self.has_client_state or self.evaluates_clients

  @property
  def batches_per_step(self) -> int:
    """Minibatches one local step consumes, consecutive in the client's stream."""
    return max([1] + [e.batches_per_step for e in self.extensions])

  @property
  def min_local_steps(self) -> int:
    return max([0] + [e.min_local_steps for e in self.extensions])

  @property
  def fb_passes(self) -> float:
    """Forward/backward passes per trained example (1 + the extensions' extra ones)."""
    return 1.0 + sum(e.extra_passes_per_example for e in self.extensions)

  def initial_local(self, broadcast_value, y0, client_state=()):
    """`init_local`, given what the state keeper hands it of the client's state."""
    keeper = self.state_keeper
    args = keeper.local_init_args(client_state) if keeper is not None else ()
    return self.init_local(broadcast_value, y0, *args)

  def initial_client_state(self, trainable_specs, initial_weights=None):
    """A client's state before its first round (() : clients keep none)."""
    keeper = self.state_keeper
    return keeper.initial_state(list(trainable_specs), initial_weights) if keeper else ()

  def client_state_leaf_names(self, structure) -> list[str]:
    """Names of `structure`'s leaves (a client state) in `tf.nest.flatten` order."""
    return list(self.state_keeper.leaf_names(structure))

