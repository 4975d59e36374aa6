"""`Recipe`: an algorithm's math as TF functions; every execution runs these."""

import collections
import dataclasses
from collections.abc import Callable
from typing import Any, Optional

import tensorflow as tf
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
    batches_per_step: minibatches one local step consumes, consecutive in
      the client's stream (Per-FedAvg's D, D'): K steps read K × this many
      batches (cycling); one pass reads whole groups, a last incomplete
      group is left out. The engine's g is at y on the group's first batch.
    gradient_fn: `local_step` also takes, by keyword, `grad_at(weights, j)`
      → (∇f(weights; the step's batch j), loss), for gradients at points
      other than y or on the step's other batches. Each call is one more
      forward/backward pass: its examples count in the model's metrics, as
      every forward pass of TFF's training does.
    gradient_at: (local, y) → where the engine's g of each step is taken
      (pFedMe: its personalised θ); None: at y.
    passes_per_example: forward/backward passes a step makes per trained
      example, for the FLOP count (pFedMe: its inner steps); `full_gradient`'s
      pass at x_t comes on top.
    user_accuracy: before training, each client measures its personalised
      model on its own test split (user accuracy, UA): the round's per-client
      input is OrderedDict(train=, test=[, private=]) and each client returns
      OrderedDict(ua=OrderedDict(correct, examples, loss_sum)[, private=its
      new state]). The test passes are not training: they count in no metric.
    personalize: (x_t, η, grad_at) → the personalised weights UA measures,
      `grad_at(weights, 0)` being the gradient on the client's first training
      batch; None: x_t (with the client's private weights, e.g. MTFL's patches).
    private_trainable, private_non_trainable: positions in `ModelWeights`
      (trainable, non-trainable) of weights each client keeps as its own
      (MTFL's batch-norm patches): part of the client's state (starting at
      the initial model's values), patched over x_t before UA and training,
      returned as the client's new state, never uploaded: Δ and the server
      step cover the shared positions only, and x keeps its private values.
      The client's state is then OrderedDict(weights=OrderedDict(trainable=,
      non_trainable=), local=the recipe's own state or ()).
    average_non_trainable: the shared non-trainable weights (batch-norm
      moving statistics) are averaged like FedAvg averages them: their Δ goes
      up with the trainable Δ, with the same weights, and the server sets them
      to x_nt − mean Δ_nt. Otherwise they stay at their initial values.
    client_state_names: names of the leaves of the recipe's own client state
      (`tf.nest.flatten` order) for the store; () : state_0, state_1, ...
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
  batches_per_step: int = 1
  gradient_fn: bool = False
  gradient_at: Optional[Callable[[Structure, list], list]] = None
  passes_per_example: float = 1.0
  user_accuracy: bool = False
  personalize: Optional[Callable[..., list]] = None
  private_trainable: tuple[int, ...] = ()
  private_non_trainable: tuple[int, ...] = ()
  average_non_trainable: bool = False
  client_state_names: tuple[str, ...] = ()

  def __post_init__(self):
    if self.uses_first_gradient and self.full_gradient:
      raise ValueError(f'{self.name}: uses_first_gradient and full_gradient exclude each other')
    if (self.init_client_state is None) != (self.client_state_update is None):
      raise ValueError(f'{self.name}: init_client_state and client_state_update go together')
    if self.batches_per_step < 1:
      raise ValueError(f'{self.name}: batches_per_step must be at least 1; got '
                       f'{self.batches_per_step}')
    if self.batches_per_step > 1 and self.full_gradient:
      # The pass at x_t is over single batches; a grouped step would need its own.
      raise ValueError(f'{self.name}: full_gradient takes one batch per step')
    if self.personalize is not None and not self.user_accuracy:
      raise ValueError(f'{self.name}: personalize is what user_accuracy measures')

  @property
  def has_private_weights(self) -> bool:
    return bool(self.private_trainable or self.private_non_trainable)

  @property
  def has_client_state(self) -> bool:
    return self.init_client_state is not None or self.has_private_weights

  @property
  def splits_weights(self) -> bool:
    """Δ is OrderedDict(trainable=shared Δ, non_trainable=shared Δ of the averaged
    non-trainable weights) rather than the trainable structure."""
    return self.has_private_weights or self.average_non_trainable

  @property
  def has_client_output(self) -> bool:
    """Clients take something back from the round (their state, their UA)."""
    return self.has_client_state or self.user_accuracy

  def initial_local(self, broadcast_value, y0, own_state=()):
    """`init_local`, given the recipe's own client state when it keeps one."""
    if self.init_client_state is not None:
      return self.init_local(broadcast_value, y0, own_state)
    return self.init_local(broadcast_value, y0)

  def own_state(self, client_state):
    """The recipe's own part of a client's state (without its private weights)."""
    return client_state['local'] if self.has_private_weights else client_state

  def initial_client_state(self, trainable_specs, initial_weights=None):
    """A client's state before its first round: the recipe's own, and with private
    weights those of `initial_weights` (the initial model's `ModelWeights`)."""
    own = self.init_client_state(list(trainable_specs)) if self.init_client_state else ()
    if not self.has_private_weights:
      return own
    constants = lambda weights: [tf.constant(w) for w in tf.nest.flatten(weights)]
    return self.private_state(constants(initial_weights.trainable),
                              constants(initial_weights.non_trainable), own)

  def private_state(self, trainable, non_trainable, own):
    """A client's state with private weights: theirs among `trainable` and
    `non_trainable` (flat lists of the model's weights), and `own`."""
    return collections.OrderedDict(
        weights=collections.OrderedDict(
            trainable=tuple(trainable[i] for i in self.private_trainable),
            non_trainable=tuple(non_trainable[i] for i in self.private_non_trainable)),
        local=own)

  def client_state_leaf_names(self, structure) -> list[str]:
    """Names of `structure`'s leaves (a client state) in `tf.nest.flatten` order."""
    own = (self.client_state_names or
           [f'state_{i}' for i in range(len(tf.nest.flatten(self.own_state(structure))))])
    if not self.has_private_weights:
      return list(own)
    names = collections.OrderedDict(
        weights=collections.OrderedDict(
            trainable=tuple(f'trainable_{i}' for i in self.private_trainable),
            non_trainable=tuple(f'non_trainable_{i}' for i in self.private_non_trainable)),
        local=tf.nest.pack_sequence_as(structure['local'], list(own)))
    return tf.nest.flatten(names)


def shared(private, count: int) -> list[int]:
  """The positions of `count` weights that are not in `private`."""
  return [i for i in range(count) if i not in private]
