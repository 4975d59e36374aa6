"""What a personalised algorithm writes: its private weights and its local step.

`PatchLayout` names the private weights (by position in `ModelWeights`),
`LocalRecipe` the client algorithm (one local step, and optionally a
personalisation before user accuracy is measured); the step works on the
client's model through a `StepContext`. `process.build_personalized_process`
runs a recipe in a round.
"""

import collections
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Optional

import tensorflow as tf

from tff_adaptive.rounds import recipe as round_recipe

Structure = Any


@dataclasses.dataclass(frozen=True)
class PatchLayout:
  """Which weights of `ModelWeights` are private, by position.

  Attributes:
    private_trainable: indices into `ModelWeights.trainable` (γ, β).
    private_non_trainable: indices into `ModelWeights.non_trainable` (μ, σ²).
    description: names for messages and the client-state fingerprint.
  """
  private_trainable: tuple[int, ...] = ()
  private_non_trainable: tuple[int, ...] = ()
  description: tuple[str, ...] = ()

  @property
  def empty(self) -> bool:
    return not self.private_trainable and not self.private_non_trainable


class Counters:
  """Per-client counters as variables: recipes update them from inside loops."""

  def __init__(self):
    self.grad_examples = tf.Variable(0, dtype=tf.int64, trainable=False)
    self.grad_calls = tf.Variable(0, dtype=tf.int64, trainable=False)
    self.first_loss = tf.Variable(0.0, dtype=tf.float32, trainable=False)

  def reset(self, keep_examples: bool = False):
    if not keep_examples:
      self.grad_examples.assign(0)
    self.grad_calls.assign(0)
    self.first_loss.assign(0.0)


class StepContext:
  """What a local recipe may do inside the client's `tf.function`."""

  def __init__(self, model, trainable: list[tf.Variable], counters: Counters):
    self.model = model
    self.trainable = trainable
    self._counters = counters

  def values(self) -> list[tf.Tensor]:
    return [tf.identity(v) for v in self.trainable]

  def assign(self, values: Sequence[tf.Tensor]) -> None:
    for v, t in zip(self.trainable, values):
      v.assign(t)

  def grad(self, batch) -> tuple[list[tf.Tensor], tf.Tensor]:
    """∇f(y; batch) at the current weights (training mode) and the loss."""
    with tf.GradientTape() as tape:
      output = self.model.forward_pass(batch, training=True)
    grads = tape.gradient(output.loss, self.trainable)
    grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
             for g, v in zip(grads, self.trainable)]
    loss = tf.cast(output.loss, tf.float32)
    # Every gradient costs fb FLOPs per example (docs/algorithms.md#costs), also repeated ones;
    # the first one's loss is the round's first-minibatch loss.
    self._counters.grad_examples.assign_add(tf.cast(output.num_examples, tf.int64))
    self._counters.first_loss.assign(
        tf.where(tf.equal(self._counters.grad_calls, 0), loss, self._counters.first_loss))
    self._counters.grad_calls.assign_add(1)
    return grads, loss


@dataclasses.dataclass(frozen=True)
class LocalRecipe:
  """A client algorithm in a personalised round.

  Attributes:
    name: for messages.
    init_optimizer: trainable TensorSpecs → client-optimiser state: lists
      aligned with the trainable weights (e.g. Adam's m, v) and scalars (its
      step counter). Entries of the lists at private positions are private.
    train_step: (ctx, optimizer state, step batches, η, k) → optimizer state;
      moves `ctx.trainable` by one local step. `step batches` is one batch,
      or a tuple of `batches_per_step` consecutive batches.
    personalize: optional (ctx, first training batch, η) → None: adapts the
      downloaded model before UA is measured (Per-FedAvg, pFedMe). MTFL's
      personalisation is the patch itself.
    batches_per_step: minibatches a local step consumes.
    optimizer_ops_per_param: C of the FLOP model (docs/algorithms.md#costs).
    share_optimizer_state: the shared part of the client-optimiser state is
      broadcast, moved locally and averaged by the server (MFL / FedAvg-Adam);
      otherwise it restarts from `init_optimizer` every round.
  """
  name: str
  train_step: Callable[..., Structure]
  init_optimizer: Callable[[list], Structure] = lambda specs: collections.OrderedDict()
  personalize: Optional[Callable[..., None]] = None
  batches_per_step: int = 1
  optimizer_ops_per_param: float = round_recipe.DEFAULT_OPTIMIZER_OPS
  share_optimizer_state: bool = False


def sgd_recipe() -> LocalRecipe:
  """Plain minibatch SGD (FedAvg, FedAdam clients)."""

  def train_step(ctx, opt, batch, lr, step):
    del step
    grads, _ = ctx.grad(batch)
    ctx.assign([w - lr * g for w, g in zip(ctx.values(), grads)])
    return opt

  return LocalRecipe(name='sgd', train_step=train_step)
