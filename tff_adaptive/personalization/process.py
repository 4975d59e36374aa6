"""Federated rounds with per-client private state and user-accuracy evaluation.

The machinery shared by MTFL (thesis ch. 4, Algorithm 5), Per-FedAvg and
pFedMe (SPEC §7): the composer's round (`composer.py`) with three additions.

  1. Private values. Some model weights (MTFL's batch-norm patches) and the
     client-optimiser values of those weights belong to the client. They enter
     the round as per-client data, are patched into the downloaded global model
     before local training, and leave it as per-client output (the new values,
     which the loop stores: `tff_adaptive/personalization/client_state.py`). They are never
     broadcast, uploaded or aggregated: the upload is the typed structure
     `OrderedDict(trainable=Δ shared, non_trainable=Δ shared, optimizer=shared
     client-optimiser state)` and the bits are counted from its TFF type.
  2. User accuracy (UA). Before local training each client evaluates its
     personalised model (global + patch; Per-FedAvg/pFedMe: adapted from the
     global model on one training batch) on its own test split; the counts come
     back per client so the loop can average over clients (and leave out noisy
     ones). `PersonalizedProcess.evaluate_clients` does the same for any list of
     clients (the periodic all-client evaluation).
  3. Non-trainable shared weights (e.g. batch-norm moving statistics when they
     are not private) are averaged like FedAvg averages them (Δ with the client
     weights, applied with step 1). The composer keeps them at their initial
     values; a server optimiser (FedAdam) acts only on trainable weights, where
     an Adam step on a variance could make it negative.

Per-client data: `OrderedDict(train=batched train dataset, test=batched test
dataset[, private=OrderedDict(name → tensor)])`; per-client output:
`OrderedDict(ua=OrderedDict(correct, examples, loss_sum)[, private=...])`.
The server state has the composer's layout (a
`tff.learning.templates.LearningAlgorithmState`: client_work =
OrderedDict(learning_rate=η, local_steps=K), aggregator, finalizer = the
server statistics), so round schedules and the loop's K-step handling work
unchanged; metrics likewise (`client_work/first_minibatch_loss`).
"""

import collections
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.accounting import costs
from tff_adaptive.algorithms import composer
from tff_adaptive.algorithms import validation
from tff_adaptive.rounds import client as client_lib
from tff_adaptive.rounds import layout as round_layout
from tff_adaptive.rounds import stateful

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


class _Counters:
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

  def __init__(self, model, trainable: list[tf.Variable], counters: _Counters):
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
    # Every gradient costs fb FLOPs per example (SPEC §8), also repeated ones;
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
    optimizer_ops_per_param: C of the FLOP model (SPEC §8).
    share_optimizer_state: the shared part of the client-optimiser state is
      broadcast, moved locally and averaged by the server (MFL / FedAvg-Adam);
      otherwise it restarts from `init_optimizer` every round.
  """
  name: str
  train_step: Callable[..., Structure]
  init_optimizer: Callable[[list], Structure] = lambda specs: collections.OrderedDict()
  personalize: Optional[Callable[..., None]] = None
  batches_per_step: int = 1
  optimizer_ops_per_param: float = composer.DEFAULT_OPTIMIZER_OPS
  share_optimizer_state: bool = False


def sgd_recipe() -> LocalRecipe:
  """Plain minibatch SGD (FedAvg, FedAdam clients)."""

  def train_step(ctx, opt, batch, lr, step):
    del step
    grads, _ = ctx.grad(batch)
    ctx.assign([w - lr * g for w, g in zip(ctx.values(), grads)])
    return opt

  return LocalRecipe(name='sgd', train_step=train_step)


class PersonalizedOutput(NamedTuple):
  """`next`'s result: like `LearningProcessOutput` plus per-client outputs."""
  state: Any
  metrics: Any
  clients: Any  # list (one per client, in input order) of OrderedDict(ua, [private])


class PersonalizedProcess(stateful.ClientStateProcess):
  """An iterative process whose clients keep private state between rounds.

  Not a `tff.learning.templates.LearningProcess`: TFF requires that
  process's outputs to be placed at SERVER, and the private state must come
  back to each client. It has the same `initialize`, `next` (returning
  `PersonalizedOutput`), `get_model_weights` and `set_model_weights`.

  Attributes:
    private_initial: name → np.ndarray, the private state of a client that
      has not trained yet (empty: nothing is private).
    upload_type: TFF type of one client's upload (what is aggregated).
    upload_bits: bits per client of `upload_type` (SPEC §8).
    fingerprint: describes the algorithm for the client-state store.
  """

  def __init__(self, initialize_fn, next_fn, evaluate_fn, get_model_weights, set_model_weights,
               *, private_initial, upload_type, upload_bits, fingerprint, name,
               get_hparams=None, set_hparams=None):
    super().__init__(initialize_fn, next_fn, get_model_weights, set_model_weights,
                     get_hparams, set_hparams)
    self._evaluate_fn = evaluate_fn
    self.private_initial = private_initial
    self.upload_type = upload_type
    self.upload_bits = upload_bits
    self.fingerprint = fingerprint
    self.name = name

  @property
  def evaluate_clients(self) -> tff.Computation:
    """(state, per-client data) → per-client OrderedDict(ua=...), no training."""
    return self._evaluate_fn

  @property
  def has_private_state(self) -> bool:
    return bool(self.private_initial)


def private_names(layout: PatchLayout, optimizer_lists: Sequence[str]) -> list[tuple[str, str, int]]:
  """(name, kind, index) of each private value, in a fixed order.

  kind: 'trainable' | 'non_trainable' | an optimiser list key ('m', 'v').
  """
  names = [(f'trainable_{i}', 'trainable', i) for i in layout.private_trainable]
  names += [(f'non_trainable_{i}', 'non_trainable', i) for i in layout.private_non_trainable]
  for key in optimizer_lists:
    names += [(f'optimizer_{key}_{i}', key, i) for i in layout.private_trainable]
  return names


def build_personalized_process(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    *,
    name: str,
    layout: PatchLayout,
    local: LocalRecipe,
    server_optimizer: tff.learning.optimizers.Optimizer,
    client_learning_rate: float,
    local_steps: int,
    client_weighting: tff.learning.ClientWeighting = tff.learning.ClientWeighting.NUM_EXAMPLES,
    fb_flops_per_example: Optional[float] = None,
    fingerprint: Optional[Mapping[str, Any]] = None,
) -> PersonalizedProcess:
  """Builds the personalised round of `local` with private `layout`.

  Args:
    model_fn: no-arg callable returning a `tff.learning.models.VariableModel`
      of a classifier (UA counts argmax hits on the label `y`).
    name: algorithm name.
    layout: the private weights.
    local: the client algorithm.
    server_optimizer: applied to the mean Δ of the shared trainable weights
      (`sgd` with rate 1: FedAvg's average; `adam`: FedAdam).
    client_learning_rate: initial η (state hparams; schedules may change it).
    local_steps: K > 0 local steps (cycling the data), 0: one pass.
    client_weighting: weights of the uploads in the average.
    fb_flops_per_example: forward+backward FLOPs per example (SPEC §8);
      None: counted from the model, or the FLOP metrics left out (warned).
    fingerprint: extra JSON-able identity for the client-state store.
  """
  if local_steps < 0:
    raise ValueError(f'{name}: local_steps must be non-negative; got {local_steps}')
  model_fn = validation.returning_a_model(model_fn, name)
  validation.check_client_weighting(client_weighting, name)
  client_weighting = client_weighting or tff.learning.ClientWeighting.NUM_EXAMPLES
  with tf.Graph().as_default():
    model = model_fn()
    metrics_aggregation_fn = tff.learning.metrics.sum_then_finalize(model.metric_finalizers())
    if fb_flops_per_example is None:
      fb_flops_per_example = costs.count_fb_flops(model, name)
  element_type = tff.types.tensorflow_to_type(model.input_spec)
  data_type = tff.SequenceType(element_type)
  weights_type = tff.learning.models.weights_type_from_model(model)
  trainable_specs = list(tf.nest.flatten(tff.types.type_to_tf_tensor_specs(weights_type.trainable)))
  non_trainable_specs = list(tf.nest.flatten(
      tff.types.type_to_tf_tensor_specs(weights_type.non_trainable)))
  n_train, n_non = len(trainable_specs), len(non_trainable_specs)
  for i in layout.private_trainable:
    if not 0 <= i < n_train:
      raise ValueError(f'private trainable index {i} out of range ({n_train} trainable weights)')
  for i in layout.private_non_trainable:
    if not 0 <= i < n_non:
      raise ValueError(f'private non-trainable index {i} out of range ({n_non} weights)')
  priv_t = list(layout.private_trainable)
  priv_n = list(layout.private_non_trainable)
  shared_t = [i for i in range(n_train) if i not in priv_t]
  shared_n = [i for i in range(n_non) if i not in priv_n]

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
  has_private = bool(names)

  # Private weights start where the server's model starts: from a model built
  # by `model_fn` (whose seeded initialisers make it the same model).
  initial_weights = tf.nest.map_structure(
      lambda v: np.asarray(v.numpy()), tff.learning.models.ModelWeights.from_model(model_fn()))
  initial_t = list(tf.nest.flatten(initial_weights.trainable))
  initial_n = list(tf.nest.flatten(initial_weights.non_trainable))
  private_initial = collections.OrderedDict()
  for key, kind, i in names:
    if kind == 'trainable':
      value = initial_t[i]
    elif kind == 'non_trainable':
      value = initial_n[i]
    else:
      value = opt_initial[kind][i]
    private_initial[key] = np.array(value)
  private_type = tff.StructWithPythonType(
      [(k, tff.TensorType(v.dtype, v.shape)) for k, v in private_initial.items()],
      collections.OrderedDict)

  def shared_opt(opt):
    out = collections.OrderedDict()
    for key in opt_lists:
      out[key] = tuple(opt[key][i] for i in shared_t)
    for key in opt_scalars:
      out[key] = opt[key]
    return out

  shared_opt_initial = shared_opt(opt_initial)

  hparams_type = tff.StructWithPythonType(
      [('learning_rate', np.float32), ('local_steps', np.int32)], collections.OrderedDict)
  members = [('train', data_type), ('test', data_type)]
  if has_private:
    members.append(('private', private_type))
  client_data_type = tff.StructWithPythonType(members, collections.OrderedDict)

  def split_weights(weights):
    """ModelWeights → the shared part that is broadcast."""
    t = list(tf.nest.flatten(weights.trainable))
    n = list(tf.nest.flatten(weights.non_trainable))
    return collections.OrderedDict(trainable=tuple(t[i] for i in shared_t),
                                   non_trainable=tuple(n[i] for i in shared_n))

  @tff.tensorflow.computation
  def init_stats():
    server_state = server_optimizer.initialize(
        tuple(tf.TensorSpec(trainable_specs[i].shape, trainable_specs[i].dtype) for i in shared_t))
    client_state = (tf.nest.map_structure(tf.constant, shared_opt_initial)
                    if local.share_optimizer_state else collections.OrderedDict())
    return collections.OrderedDict(server=server_state, client_optimizer=client_state)

  stats_type = init_stats.type_signature.result

  @tff.tensorflow.computation(weights_type, stats_type)
  def broadcast_fn(weights, stats):
    return collections.OrderedDict(weights=split_weights(weights),
                                   optimizer=stats['client_optimizer'])

  broadcast_type = broadcast_fn.type_signature.result

  # ---- client ----
  def assemble(model, broadcast, data):
    """Global (shared) values + the client's private values → the model."""
    variables = tff.learning.models.ModelWeights.from_model(model)
    trainable = list(variables.trainable)
    non_trainable = list(variables.non_trainable)
    for i, value in zip(shared_t, broadcast['weights']['trainable']):
      trainable[i].assign(value)
    for i, value in zip(shared_n, broadcast['weights']['non_trainable']):
      non_trainable[i].assign(value)
    # Optimiser state: shared entries from the server (FedAvg-Adam) or fresh
    # (SGD-like recipes), private entries from the client.
    opt = collections.OrderedDict()
    for key in opt_lists:
      values = [tf.constant(v) for v in opt_initial[key]]
      if local.share_optimizer_state:
        for i, value in zip(shared_t, broadcast['optimizer'][key]):
          values[i] = tf.identity(value)
      opt[key] = values
    for key in opt_scalars:
      opt[key] = (tf.identity(broadcast['optimizer'][key]) if local.share_optimizer_state
                  else tf.constant(opt_initial[key]))
    if has_private:
      private = data['private']
      for key, kind, i in names:
        if kind == 'trainable':
          trainable[i].assign(private[key])
        elif kind == 'non_trainable':
          non_trainable[i].assign(private[key])
        else:
          opt[kind][i] = tf.identity(private[key])
    return trainable, non_trainable, client_lib.tuples(opt)

  def user_accuracy(model, trainable, non_trainable, data, lr, counters):
    """UA before local training: personalise (if the recipe does), test, undo."""
    saved = [tf.identity(v) for v in trainable + non_trainable]
    if local.personalize is not None:
      ctx = StepContext(model, trainable, counters)
      for batch in data['train'].take(1):
        local.personalize(ctx, batch, lr)
    correct = tf.constant(0.0)
    loss_sum = tf.constant(0.0)
    examples = tf.constant(0, tf.int64)
    for batch in iter(data['test']):  # iterator loop: see composer.client_update
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

  def client_update(model, counters, broadcast, hparams, data):
    counters.reset()
    trainable, non_trainable, opt = assemble(model, broadcast, data)
    lr = hparams['learning_rate']
    ua = user_accuracy(model, trainable, non_trainable, data, lr, counters)
    x_t = [tf.identity(v) for v in trainable]
    n_t = [tf.identity(v) for v in non_trainable]
    ctx = StepContext(model, trainable, counters)
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
      opt = client_lib.tuples(local.train_step(ctx, opt, batch, lr, step))
      for b in (batch if local.batches_per_step > 1 else (batch,)):
        num_examples += tf.shape(tf.nest.flatten(b)[0], out_type=tf.int64)[0]
      step += 1
    delta_t = [x_t[i] - trainable[i] for i in shared_t]
    delta_n = [n_t[i] - non_trainable[i] for i in shared_n]
    finite = [tf.reduce_all(tf.math.is_finite(tf.cast(v, tf.float32)))
              for v in delta_t + delta_n + trainable + non_trainable]
    non_finite = tf.logical_not(tf.reduce_all(finite))
    zero = lambda t: tf.where(non_finite, tf.zeros_like(t), t)
    upload = collections.OrderedDict(trainable=tuple(map(zero, delta_t)),
                                     non_trainable=tuple(map(zero, delta_n)))
    if local.share_optimizer_state:
      upload['optimizer'] = tf.nest.map_structure(zero, shared_opt(opt))
    weight = client_lib.client_weight(num_examples, non_finite, client_weighting)
    out = collections.OrderedDict(ua=ua)
    if has_private:
      new_private = collections.OrderedDict()
      for key, kind, i in names:
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

  @tff.tensorflow.computation(broadcast_type, hparams_type, client_data_type)
  def client_update_fn(broadcast, hparams, data):
    # Variables (model, counters) must be created outside the tf.function.
    model, counters = model_fn(), _Counters()
    return tf.function(lambda *args: client_update(model, counters, *args))(
        broadcast, hparams, data)

  @tff.tensorflow.computation(broadcast_type, hparams_type, client_data_type)
  def client_eval_fn(broadcast, hparams, data):
    model, counters = model_fn(), _Counters()

    @tf.function
    def evaluate(broadcast, hparams, data):
      trainable, non_trainable, _ = assemble(model, broadcast, data)
      return collections.OrderedDict(ua=user_accuracy(
          model, trainable, non_trainable, data, hparams['learning_rate'], counters))

    return evaluate(broadcast, hparams, data)

  upload_type = client_update_fn.type_signature.result[0]
  aggregator = tff.aggregators.MeanFactory().create(upload_type, tff.TensorType(np.float32))

  # ---- server ----
  @tff.tensorflow.computation(weights_type, stats_type, upload_type)
  def server_update_fn(weights, stats, mean_upload):
    t = [tf.identity(w) for w in tf.nest.flatten(weights.trainable)]
    n = [tf.identity(w) for w in tf.nest.flatten(weights.non_trainable)]
    shared = tuple(t[i] for i in shared_t)
    server_state, new_shared = server_optimizer.next(stats['server'], shared,
                                                     tuple(mean_upload['trainable']))
    for i, value in zip(shared_t, new_shared):
      t[i] = value
    for i, d in zip(shared_n, mean_upload['non_trainable']):
      n[i] = n[i] - d  # the weighted average of the clients' final values
    client_state = mean_upload['optimizer'] if local.share_optimizer_state else stats['client_optimizer']
    new_weights = tff.learning.models.ModelWeights(
        trainable=tf.nest.pack_sequence_as(weights.trainable, t),
        non_trainable=tf.nest.pack_sequence_as(weights.non_trainable, n))
    new_stats = collections.OrderedDict(server=server_state, client_optimizer=client_state)
    # Same containers as the initial state: checkpoints restore into it.
    return new_weights, tf.nest.pack_sequence_as(stats, tf.nest.flatten(new_stats))

  down_bits = round_layout.num_bits(broadcast_type) + round_layout.num_bits(hparams_type)
  upload_bits = round_layout.num_bits(upload_type)
  num_params = sum(int(np.prod(s.shape)) for s in trainable_specs)
  opt_floats = sum(int(np.prod(np.shape(v))) for key in opt_lists for v in opt_initial[key])
  private_floats = sum(int(np.size(v)) for v in private_initial.values())
  optimizer_flops_per_step = local.optimizer_ops_per_param * num_params

  @tff.tensorflow.computation(tff.TensorType(np.int64), tff.TensorType(np.int32),
                              tff.TensorType(np.int32))
  def cost_fn(grad_examples, steps, clients):
    clients = tf.maximum(tf.cast(clients, tf.float64), 1.0)
    cost = collections.OrderedDict(
        download_bits_per_client=tf.constant(float(down_bits), tf.float64),
        upload_bits_per_client=tf.constant(float(upload_bits), tf.float64),
        download_bits=tf.constant(float(down_bits), tf.float64) * clients,
        upload_bits=tf.constant(float(upload_bits), tf.float64) * clients,
        client_steps=tf.cast(steps, tf.float64))
    if fb_flops_per_example is not None:
      flops = (tf.cast(grad_examples, tf.float64) * fb_flops_per_example +
               tf.cast(steps, tf.float64) * optimizer_flops_per_step)
      cost['client_flops'] = flops
      cost['client_flops_per_client'] = flops / clients
    cost['client_optimizer_state_floats'] = tf.constant(float(opt_floats), tf.float64)
    cost['client_private_state_floats'] = tf.constant(float(private_floats), tf.float64)
    return cost

  initialize_fn = composer.initial_state_computation(model_fn, client_learning_rate, local_steps,
                                                     aggregator, init_stats)

  state_type = initialize_fn.type_signature.result

  @tff.tensorflow.computation(np.int32)
  def one_client(n):
    del n
    return np.int32(1)

  federated_data_type = tff.FederatedType(client_data_type, tff.CLIENTS)

  @tff.federated_computation(state_type, federated_data_type)
  def next_fn(state, client_data):
    broadcast = tff.federated_broadcast(
        tff.federated_map(broadcast_fn, (state.global_model_weights, state.finalizer)))
    hparams = tff.federated_broadcast(state.client_work)
    upload, weight, local_metrics, client_stats, client_out = tff.federated_map(
        client_update_fn, (broadcast, hparams, client_data))
    agg = aggregator.next(state.aggregator, upload, weight)
    new_weights, new_stats = tff.federated_map(
        server_update_fn, (state.global_model_weights, state.finalizer, agg.result))
    num_clients = tff.federated_sum(tff.federated_map(one_client, client_stats.local_steps))
    cost = tff.federated_map(cost_fn, (tff.federated_sum(client_stats.grad_examples),
                                       tff.federated_sum(client_stats.local_steps), num_clients))
    new_state = tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        global_model_weights=new_weights, distributor=state.distributor,
        client_work=state.client_work, aggregator=agg.state, finalizer=new_stats))
    metrics = tff.federated_zip(collections.OrderedDict(
        distributor=tff.federated_value((), tff.SERVER),
        client_work=tff.federated_zip(collections.OrderedDict(
            train=metrics_aggregation_fn(local_metrics),
            first_minibatch_loss=tff.federated_mean(client_stats.first_minibatch_loss))),
        aggregator=agg.measurements,
        finalizer=tff.federated_value((), tff.SERVER),
        cost=cost))
    return PersonalizedOutput(new_state, metrics, client_out)

  @tff.federated_computation(state_type, federated_data_type)
  def evaluate_fn(state, client_data):
    broadcast = tff.federated_broadcast(
        tff.federated_map(broadcast_fn, (state.global_model_weights, state.finalizer)))
    return tff.federated_map(client_eval_fn,
                             (broadcast, tff.federated_broadcast(state.client_work), client_data))

  get_model_weights, set_model_weights = composer.model_weights_fns(state_type.member,
                                                                    weights_type)

  @tff.tensorflow.computation(state_type.member)
  def get_hparams_fn(state):
    return collections.OrderedDict(client_work=state.client_work,
                                   server=server_optimizer.get_hparams(state.finalizer['server']))

  @tff.tensorflow.computation(state_type.member, get_hparams_fn.type_signature.result)
  def set_hparams_fn(state, hparams):
    finalizer = collections.OrderedDict(state.finalizer)
    finalizer['server'] = server_optimizer.set_hparams(finalizer['server'], hparams['server'])
    finalizer = tf.nest.pack_sequence_as(state.finalizer, tf.nest.flatten(finalizer))
    return state._replace(client_work=hparams['client_work'], finalizer=finalizer)

  identity = collections.OrderedDict(
      algorithm=name, local=local.name,
      private=[[key, list(np.shape(v)), np.asarray(v).dtype.str]
               for key, v in private_initial.items()],
      patches=list(layout.description))
  identity.update(fingerprint or {})
  return PersonalizedProcess(
      initialize_fn, next_fn, evaluate_fn, get_model_weights, set_model_weights,
      private_initial=private_initial, upload_type=upload_type, upload_bits=upload_bits,
      fingerprint=identity, name=name, get_hparams=get_hparams_fn, set_hparams=set_hparams_fn)
