"""`Extension`: a client behaviour beyond the core recipe, as hooks the engine calls.

A `Recipe`'s core is what every algorithm has (server statistics, broadcast,
local initialisation, local step, upload, server update). What only some
algorithms' clients do is an extension object (`tff_adaptive/extensions/`),
listed in `Recipe.extensions`. Both executions call the same hooks at the
same points of a client's round; neither knows which extensions exist:

  hook                                   called at                           default
  check(others)                          the recipe's construction           accept
  batches_per_step                       data: batches one local step reads  1
  input_fields(info)                     data: per-client inputs beside the  []
                                         training batches ('test', ...)
  start_weights(y0, n0, state)           start: the client's weights         as given
  init_carry(x_t)                        loop.init: the hook's carry entries {}
  before_steps(carry, passes)            before the first step               carry
  measure(passes)                        what an evaluation returns          {}
  gradient_point(carry)                  each step: where g is taken         None (y)
  step_context(carry, grad_at)           each step: keywords of local_step   {}
  after_step(carry, stepped, step)       each step                           stepped
  upload_gradient(carry)                 final: `upload`'s second argument   None
  outputs(carry)                         final: what goes back to the client {}
  server_checks(recipe, sums)            the server step's assertions        []
  min_local_steps                        the builder's check of K            0
  extra_passes_per_example               the FLOP count                      0.0
  cohort_unsupported(view, others)       why the cohort program cannot run   None
  steps_outside_unsupported              why the steps-outside nesting       None
                                         (recurrent models) cannot run it
  evaluates_clients                      clients measure before training     False
                                         (their process evaluates them too)

What an execution supplies the hooks (`passes` of `before_steps`: passes over
the client's own batches; `grad_at` of `step_context`: more gradients on the
step's batches) is `ClientPasses`, implemented once per execution.

A client's state across rounds is one extension's, its `StateKeeper`
(`Recipe.state_keeper`; at most one per recipe), and so is the split of the
weights into shared and private ones (`weights_split`, at most one): the
engine asks them for the state's layout, what `init_local` receives, Δ's
structure and the server's treatment of private weights.
"""

import collections
from typing import Any, Optional

import tensorflow as tf

# Why the cohort program does not run a recipe whose extra training passes
# move batch-norm statistics it must keep (the program does not thread them).
MOVED_STATISTICS = ('the batch-norm statistics moved by its personalisation or extra gradient '
                    'passes would be lost')


class ClientPasses:
  """What an execution offers a client's hooks besides its training steps.

  Attributes:
    start: (y0, n0): the client's starting weights (`start_weights`), lists.
    learning_rate: η of the round.
  """
  start: tuple
  learning_rate: Any

  def over_batches(self, fn, carry):
    """carry = fn(carry, grads, num_examples) for each of the client's training
    batches in training order, the gradient at the start weights; the passes
    count in no metric and leave the batches the steps read unchanged."""
    raise NotImplementedError

  def evaluate(self, personalize=None):
    """The client's test batches in inference mode at the start weights, or at
    `personalize(grad_at)`'s, `grad_at(weights, 0)` being the gradient on its
    first training batch: OrderedDict(correct, examples, loss_sum); no metric
    counts it."""
    raise NotImplementedError


class Extension:
  """One client behaviour: hooks whose defaults do nothing (module docstring)."""
  name = 'extension'
  batches_per_step = 1
  min_local_steps = 0
  extra_passes_per_example = 0.0
  # True for extensions whose gradient passes train on the client's batches
  # besides the steps' own (they move batch-norm statistics).
  extra_training_passes = False
  evaluates_clients = False
  steps_outside_unsupported: Optional[str] = None

  def check(self, others: tuple) -> None:
    """Raises ValueError when this extension does not combine with `others`."""
    del others

  def input_fields(self, info) -> list:
    """[(name, TFF type)] a client takes beside its training dataset."""
    del info
    return []

  def start_weights(self, y0: list, n0: list, state) -> tuple:
    del state
    return y0, n0

  def init_carry(self, x_t) -> dict:
    del x_t
    return {}

  def before_steps(self, carry, passes: ClientPasses):
    del passes
    return carry

  def measure(self, passes: ClientPasses) -> dict:
    """What the client measures before training ({name: value}), when
    `evaluates_clients`; also the whole of an evaluation without training."""
    del passes
    return {}

  def gradient_point(self, carry) -> Optional[list]:
    del carry
    return None

  def step_context(self, carry, grad_at) -> dict:
    del carry, grad_at
    return {}

  def after_step(self, carry, stepped, step) -> collections.OrderedDict:
    del carry, step
    return stepped

  def upload_gradient(self, carry):
    del carry
    return None

  def outputs(self, carry) -> dict:
    del carry
    return {}

  def server_checks(self, recipe, sums) -> list:
    del recipe, sums
    return []

  def cohort_unsupported(self, view, others: tuple) -> Optional[str]:
    del view, others
    return None


class Step(collections.namedtuple('Step', 'grads is_first branchless')):
  """What `after_step` learns of a step: its gradient, whether it is the first,
  and whether the execution must select rather than branch (`ClientLoop.branchless`)."""


class StateKeeper(Extension):
  """An extension that gives the clients a state across rounds (at most one a recipe).

  The state is a structure of tensors; `initial_state` is a client's before
  its first round, `local_init_args(state)` what `init_local` receives after
  (broadcast, y_0), `new_state(carry)` the state after the round (a client
  whose update is not finite keeps its old one), `leaf_names` its leaves'
  names for the store.
  """
  needs_initial_weights = False

  def initial_state(self, trainable_specs, initial_weights=None):
    raise NotImplementedError

  def local_init_args(self, state) -> tuple:
    del state
    return ()

  def new_state(self, carry):
    raise NotImplementedError

  def leaf_names(self, structure) -> list:
    return [f'state_{i}' for i in range(len(tf.nest.flatten(structure)))]

  def own_state_specs(self, trainable_specs):
    """The part of the state `init_local` receives, for the cost count (None: none)."""
    del trainable_specs
    return None

  def private_state_floats(self, trainable_specs, non_trainable_specs) -> Optional[int]:
    """Floats a client keeps between rounds, reported when not None."""
    del trainable_specs, non_trainable_specs
    return None


class WeightsSplit(Extension):
  """An extension that splits the weights into shared and private ones (at most one).

  Δ is then OrderedDict(trainable=shared Δ, non_trainable=averaged shared Δ)
  (`delta_structure`), the carry keeps the non-trainable weights, and the
  server step asks `server_delta` and `server_weights`.
  """
  keeps_non_trainable = True

  def delta_structure(self, trainable, non_trainable):
    raise NotImplementedError

  def kept(self, carry) -> list:
    """The values besides Δ whose finiteness decides whether a client is dropped."""
    del carry
    return []

  def server_delta(self, x: list, mean_delta) -> list:
    raise NotImplementedError

  def server_weights(self, x: list, new_x: list, non_trainable, mean_delta):
    """(new trainable list, new non-trainable structure)."""
    raise NotImplementedError

  def undownloaded_specs(self, trainable_specs, non_trainable_specs) -> list:
    """Specs of the weights a deployment would not send (clients patch their own)."""
    del trainable_specs, non_trainable_specs
    return []


def one_of(extensions, kind, name: str):
  """The extension of `kind` among `extensions` (None), refusing two."""
  found = [e for e in extensions if isinstance(e, kind)]
  if len(found) > 1:
    raise ValueError(f'{name}: at most one {kind.__name__} extension; got '
                     f'{", ".join(e.name for e in found)}')
  return found[0] if found else None


def one_upload_gradient(ext: Extension, others: tuple) -> None:
  """Refuses a second extension that gives `upload` its gradient."""
  for other in others:
    if type(other).upload_gradient is not Extension.upload_gradient:
      raise ValueError(f'{ext.name} and {other.name} both give upload its gradient')
