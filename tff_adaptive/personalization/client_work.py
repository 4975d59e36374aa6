"""A personalised round's client: its private values in, user accuracy, local steps, Δ out.

`split_private` decides, once per process, which values are shared and which
private (`PrivateSplit`); `client_update` is one client's work in a round:
patch its private values into the downloaded model (`assemble`), measure user
accuracy (`user_accuracy`), run the recipe's local steps, and return the
shared Δ (the upload) and the new private values. All three run inside the
client's `tf.function` (`process.build_personalized_process`).
"""

import collections
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.personalization import recipe as recipe_lib
from tff_adaptive.rounds import client as client_lib


def private_names(layout: recipe_lib.PatchLayout,
                  optimizer_lists: Sequence[str]) -> list[tuple[str, str, int]]:
  """(name, kind, index) of each private value, in a fixed order.

  kind: 'trainable' | 'non_trainable' | an optimiser list key ('m', 'v').
  """
  names = [(f'trainable_{i}', 'trainable', i) for i in layout.private_trainable]
  names += [(f'non_trainable_{i}', 'non_trainable', i) for i in layout.private_non_trainable]
  for key in optimizer_lists:
    names += [(f'optimizer_{key}_{i}', key, i) for i in layout.private_trainable]
  return names


@dataclasses.dataclass(frozen=True)
class PrivateSplit:
  """Which weights and client-optimiser values are shared, which private.

  Attributes:
    shared_t, shared_n: positions of the shared trainable / non-trainable
      weights (the others are private).
    opt_initial: the client-optimiser state a client starts from (NumPy):
      lists aligned with the trainable weights, and scalars.
    opt_lists, opt_scalars: the keys of `opt_initial` of each kind.
    names: `private_names` of the layout.
    private_initial: name → np.ndarray, a new client's private values.
  """
  shared_t: list[int]
  shared_n: list[int]
  opt_initial: Mapping[str, Any]
  opt_lists: list[str]
  opt_scalars: list[str]
  names: list[tuple[str, str, int]]
  private_initial: Mapping[str, np.ndarray]

  @property
  def has_private(self) -> bool:
    return bool(self.names)

  def shared_opt(self, opt):
    """The shared part of client-optimiser state `opt` (what FedAvg-Adam averages)."""
    out = collections.OrderedDict()
    for key in self.opt_lists:
      out[key] = tuple(opt[key][i] for i in self.shared_t)
    for key in self.opt_scalars:
      out[key] = opt[key]
    return out


def split_private(layout: recipe_lib.PatchLayout, local: recipe_lib.LocalRecipe,
                  model_fn: Callable[[], tff.learning.models.VariableModel],
                  trainable_specs: Sequence[tf.TensorSpec],
                  non_trainable_specs: Sequence[tf.TensorSpec]) -> PrivateSplit:
  """The `PrivateSplit` of `layout` for `local`'s optimiser on `model_fn`'s model."""
  n_train, n_non = len(trainable_specs), len(non_trainable_specs)
  for i in layout.private_trainable:
    if not 0 <= i < n_train:
      raise ValueError(f'private trainable index {i} out of range ({n_train} trainable weights)')
  for i in layout.private_non_trainable:
    if not 0 <= i < n_non:
      raise ValueError(f'private non-trainable index {i} out of range ({n_non} weights)')
  shared_t = [i for i in range(n_train) if i not in layout.private_trainable]
  shared_n = [i for i in range(n_non) if i not in layout.private_non_trainable]

  # Client-optimiser state: lists over all trainable weights (split into
  # shared / private by position) and scalars (shared). Built eagerly: it is
  # a constant (zeros, ones) the clients and the store start from.
  opt_initial = tf.nest.map_structure(
      np.asarray, local.init_optimizer([tf.TensorSpec(s.shape, s.dtype) for s in trainable_specs]))
  opt_lists = [k for k, v in opt_initial.items() if isinstance(v, (list, tuple))]
  opt_scalars = [k for k in opt_initial if k not in opt_lists]
  for key in opt_lists:
    if len(opt_initial[key]) != n_train:
      raise ValueError(f'{local.name}: optimiser list {key!r} must align with the trainable '
                       'weights')
  names = private_names(layout, opt_lists)

  # Private weights start where the server's model starts: from a model built
  # by `model_fn` (whose seeded initialisers make it the same model).
  initial_weights = tf.nest.map_structure(
      lambda v: np.asarray(v.numpy()), tff.learning.models.ModelWeights.from_model(model_fn()))
  initial = {'trainable': list(tf.nest.flatten(initial_weights.trainable)),
             'non_trainable': list(tf.nest.flatten(initial_weights.non_trainable))}
  private_initial = collections.OrderedDict()
  for key, kind, i in names:
    value = initial[kind][i] if kind in initial else opt_initial[kind][i]
    private_initial[key] = np.array(value)
  return PrivateSplit(shared_t, shared_n, opt_initial, opt_lists, opt_scalars, names,
                      private_initial)


def assemble(split: PrivateSplit, local: recipe_lib.LocalRecipe, model, broadcast, data):
  """Global (shared) values + the client's private values → the model."""
  variables = tff.learning.models.ModelWeights.from_model(model)
  trainable = list(variables.trainable)
  non_trainable = list(variables.non_trainable)
  for i, value in zip(split.shared_t, broadcast['weights']['trainable']):
    trainable[i].assign(value)
  for i, value in zip(split.shared_n, broadcast['weights']['non_trainable']):
    non_trainable[i].assign(value)
  # Optimiser state: shared entries from the server (FedAvg-Adam) or fresh
  # (SGD-like recipes), private entries from the client.
  opt = collections.OrderedDict()
  for key in split.opt_lists:
    values = [tf.constant(v) for v in split.opt_initial[key]]
    if local.share_optimizer_state:
      for i, value in zip(split.shared_t, broadcast['optimizer'][key]):
        values[i] = tf.identity(value)
    opt[key] = values
  for key in split.opt_scalars:
    opt[key] = (tf.identity(broadcast['optimizer'][key]) if local.share_optimizer_state
                else tf.constant(split.opt_initial[key]))
  if split.has_private:
    private = data['private']
    for key, kind, i in split.names:
      if kind == 'trainable':
        trainable[i].assign(private[key])
      elif kind == 'non_trainable':
        non_trainable[i].assign(private[key])
      else:
        opt[kind][i] = tf.identity(private[key])
  return trainable, non_trainable, client_lib.tuples(opt)


def user_accuracy(local: recipe_lib.LocalRecipe, model, trainable, non_trainable, data, lr,
                  counters: recipe_lib.Counters):
  """UA before local training: personalise (if the recipe does), test, undo."""
  saved = [tf.identity(v) for v in trainable + non_trainable]
  if local.personalize is not None:
    ctx = recipe_lib.StepContext(model, trainable, counters)
    for batch in data['train'].take(1):
      local.personalize(ctx, batch, lr)
  correct = tf.constant(0.0)
  loss_sum = tf.constant(0.0)
  examples = tf.constant(0, tf.int64)
  for batch in iter(data['test']):  # iterator loop: see per_client.client_update
    output = model.forward_pass(batch, training=False)
    labels = tf.reshape(batch['y'] if isinstance(batch, Mapping) else batch[1], [-1])
    logits = tf.reshape(output.predictions, [tf.shape(labels)[0], -1])
    hits = tf.equal(tf.argmax(logits, axis=-1), tf.cast(labels, tf.int64))
    correct += tf.reduce_sum(tf.cast(hits, tf.float32))
    n = tf.cast(output.num_examples, tf.int64)
    loss_sum += tf.cast(output.loss, tf.float32) * tf.cast(n, tf.float32)
    examples += n
  # Personalisation steps also moved batch-norm statistics: undo all.
  for v, t in zip(trainable + non_trainable, saved):
    v.assign(t)
  # Evaluation must not count as training in the round's metrics.
  model.reset_metrics()
  counters.reset(keep_examples=True)
  return collections.OrderedDict(correct=correct, examples=examples, loss_sum=loss_sum)


def _local_steps(local: recipe_lib.LocalRecipe, ctx, opt, data, hparams):
  """The recipe's steps on the client's data: (optimizer state, steps, examples)."""
  steps64 = tf.cast(hparams['local_steps'], tf.int64)
  cycle = steps64 > 0
  # K > 0: exactly K steps, cycling the data; K = 0: the dataset as given.
  repeated = data['train'].repeat(tf.where(cycle, tf.constant(-1, tf.int64), 1))
  if local.batches_per_step > 1:
    # Consecutive batches per step: (b0, b1), (b2, b3), ...
    repeated = tf.data.Dataset.zip(tuple(
        repeated.shard(local.batches_per_step, j) for j in range(local.batches_per_step)))
  step = tf.constant(0, tf.int32)
  num_examples = tf.constant(0, tf.int64)
  for batch in iter(repeated.take(tf.where(cycle, steps64, -1))):
    opt = client_lib.tuples(local.train_step(ctx, opt, batch, hparams['learning_rate'], step))
    for b in (batch if local.batches_per_step > 1 else (batch,)):
      num_examples += tf.shape(tf.nest.flatten(b)[0], out_type=tf.int64)[0]
    step += 1
  return opt, step, num_examples


def client_update(split: PrivateSplit, local: recipe_lib.LocalRecipe,
                  client_weighting: tff.learning.ClientWeighting, model,
                  counters: recipe_lib.Counters, broadcast, hparams, data):
  """One client's round: (upload, weight, local metrics, client stats, per-client output)."""
  counters.reset()
  trainable, non_trainable, opt = assemble(split, local, model, broadcast, data)
  ua = user_accuracy(local, model, trainable, non_trainable, data, hparams['learning_rate'],
                     counters)
  x_t = [tf.identity(v) for v in trainable]
  n_t = [tf.identity(v) for v in non_trainable]
  ctx = recipe_lib.StepContext(model, trainable, counters)
  opt, step, num_examples = _local_steps(local, ctx, opt, data, hparams)
  delta_t = [x_t[i] - trainable[i] for i in split.shared_t]
  delta_n = [n_t[i] - non_trainable[i] for i in split.shared_n]
  finite = [tf.reduce_all(tf.math.is_finite(tf.cast(v, tf.float32)))
            for v in delta_t + delta_n + trainable + non_trainable]
  non_finite = tf.logical_not(tf.reduce_all(finite))
  zero = lambda t: tf.where(non_finite, tf.zeros_like(t), t)
  upload = collections.OrderedDict(trainable=tuple(map(zero, delta_t)),
                                   non_trainable=tuple(map(zero, delta_n)))
  if local.share_optimizer_state:
    upload['optimizer'] = tf.nest.map_structure(zero, split.shared_opt(opt))
  weight = client_lib.client_weight(num_examples, non_finite, client_weighting)
  out = collections.OrderedDict(ua=ua)
  if split.has_private:
    new_private = collections.OrderedDict()
    for key, kind, i in split.names:
      if kind == 'trainable':
        value = trainable[i]
      elif kind == 'non_trainable':
        value = non_trainable[i]
      else:
        value = opt[kind][i]
      # A client whose training diverged keeps its previous private values
      # (its upload is dropped too).
      new_private[key] = tf.where(non_finite, data['private'][key], tf.identity(value))
    out['private'] = new_private
  client_stats = collections.OrderedDict(
      first_minibatch_loss=counters.first_loss.read_value(), local_steps=step,
      num_examples=num_examples, grad_examples=counters.grad_examples.read_value())
  return upload, weight, model.report_local_unfinalized_metrics(), client_stats, out
