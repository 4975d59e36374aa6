"""Federated rounds with per-client private state and user-accuracy evaluation.

The machinery shared by MTFL (thesis ch. 4, Algorithm 5), Per-FedAvg and
pFedMe (docs/algorithms.md#mtfl): the round of `rounds/skeleton.py` with three additions.

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

What an algorithm writes (`PatchLayout`, `LocalRecipe`) is `recipe.py`, a
client's work in the round `client_work.py`; this module builds the process
around them (types, server update, costs, the federated computations).
"""

import collections
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive import errors
from tff_adaptive.accounting import costs
from tff_adaptive.personalization import client_work
from tff_adaptive.personalization import recipe as recipe_lib
from tff_adaptive.rounds import layout as round_layout
from tff_adaptive.rounds import skeleton
from tff_adaptive.rounds import stateful
from tff_adaptive.rounds import validation



class PersonalizedProcess(stateful.ClientStateProcess):
  """An iterative process whose clients keep private state between rounds.

  Not a `tff.learning.templates.LearningProcess`: TFF requires that
  process's outputs to be placed at SERVER, and the private state must come
  back to each client. It has the same `initialize`, `next` (returning
  `stateful.StatefulClientsOutput`: the state, the metrics and each client's
  output), `get_model_weights` and `set_model_weights`.

  Attributes:
    private_initial: name → np.ndarray, the private state of a client that
      has not trained yet (empty: nothing is private).
    upload_type: TFF type of one client's upload (what is aggregated).
    upload_bits: bits per client of `upload_type` (docs/algorithms.md#costs).
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


@dataclasses.dataclass(frozen=True)
class _Model:
  """What the computations need to know of the model and of the private split."""
  model_fn: Callable[[], tff.learning.models.VariableModel]
  metrics_aggregation_fn: Any
  fb_flops_per_example: Optional[float]
  weights_type: Any
  trainable_specs: list
  split: Any  # client_work.split_private's result
  private_type: Any
  hparams_type: Any
  client_data_type: Any


def _describe_model(model_fn, name: str, layout: recipe_lib.PatchLayout,
                    local: recipe_lib.LocalRecipe,
                    fb_flops_per_example: Optional[float]) -> _Model:
  """The model's types, metrics and FLOPs, and which of its values are private."""
  with tf.Graph().as_default():
    model = model_fn()
    metrics_aggregation_fn = tff.learning.metrics.sum_then_finalize(model.metric_finalizers())
    if fb_flops_per_example is None:
      fb_flops_per_example = costs.count_fb_flops(model, name)
  data_type = tff.SequenceType(tff.types.tensorflow_to_type(model.input_spec))
  weights_type = tff.learning.models.weights_type_from_model(model)
  trainable_specs = list(tf.nest.flatten(tff.types.type_to_tf_tensor_specs(weights_type.trainable)))
  non_trainable_specs = list(tf.nest.flatten(
      tff.types.type_to_tf_tensor_specs(weights_type.non_trainable)))
  split = client_work.split_private(layout, local, model_fn, trainable_specs,
                                   non_trainable_specs)
  private_type = tff.StructWithPythonType(
      [(k, tff.TensorType(v.dtype, v.shape)) for k, v in split.private_initial.items()],
      collections.OrderedDict)
  hparams_type = tff.StructWithPythonType(
      [('learning_rate', np.float32), ('local_steps', np.int32)], collections.OrderedDict)
  members = [('train', data_type), ('test', data_type)]
  if split.has_private:
    members.append(('private', private_type))
  client_data_type = tff.StructWithPythonType(members, collections.OrderedDict)
  return _Model(model_fn, metrics_aggregation_fn, fb_flops_per_example, weights_type,
                trainable_specs, split, private_type, hparams_type, client_data_type)


def _broadcast_computations(m: _Model, local: recipe_lib.LocalRecipe, server_optimizer):
  """(init_stats, message_fn): the server statistics' initial value, and what the
  clients receive (the shared weights and optimiser state, and the round's hparams)."""
  split = m.split

  def split_weights(weights):
    """ModelWeights → the shared part that is broadcast."""
    t = list(tf.nest.flatten(weights.trainable))
    n = list(tf.nest.flatten(weights.non_trainable))
    return collections.OrderedDict(trainable=tuple(t[i] for i in split.shared_t),
                                   non_trainable=tuple(n[i] for i in split.shared_n))

  @tff.tensorflow.computation
  def init_stats():
    server_state = server_optimizer.initialize(
        tuple(tf.TensorSpec(m.trainable_specs[i].shape, m.trainable_specs[i].dtype)
              for i in split.shared_t))
    client_state = (tf.nest.map_structure(tf.constant, split.shared_opt(split.opt_initial))
                    if local.share_optimizer_state else collections.OrderedDict())
    return collections.OrderedDict(server=server_state, client_optimizer=client_state)

  @tff.tensorflow.computation(m.weights_type, init_stats.type_signature.result, m.hparams_type)
  def message_fn(weights, stats, hparams):
    broadcast = collections.OrderedDict(weights=split_weights(weights),
                                        optimizer=stats['client_optimizer'])
    return collections.OrderedDict(broadcast=broadcast, hparams=hparams)

  return init_stats, message_fn


def _client_computations(m: _Model, local: recipe_lib.LocalRecipe, client_weighting,
                         message_type):
  """(client_round_fn, client_eval_fn): a client's round (client_work), and its UA alone."""
  split, model_fn = m.split, m.model_fn

  @tff.tensorflow.computation(message_type, m.client_data_type)
  def client_round_fn(message, data):
    # Variables (model, counters) must be created outside the tf.function.
    model, counters = model_fn(), recipe_lib.Counters()
    return tf.function(lambda message, data: client_work.client_update(
        split, local, client_weighting, model, counters, message['broadcast'],
        message['hparams'], data))(message, data)

  @tff.tensorflow.computation(message_type, m.client_data_type)
  def client_eval_fn(message, data):
    model, counters = model_fn(), recipe_lib.Counters()

    @tf.function
    def evaluate(message, data):
      trainable, non_trainable, _ = client_work.assemble(split, local, model,
                                                         message['broadcast'], data)
      return collections.OrderedDict(ua=client_work.user_accuracy(
          local, model, trainable, non_trainable, data, message['hparams']['learning_rate'],
          counters))

    return evaluate(message, data)

  return client_round_fn, client_eval_fn


def _server_update(m: _Model, local: recipe_lib.LocalRecipe, server_optimizer):
  """The server's step: the optimiser on shared trainable weights, the mean on the others."""
  split = m.split

  def server_update_fn(weights, stats, mean_upload):
    t = [tf.identity(w) for w in tf.nest.flatten(weights.trainable)]
    n = [tf.identity(w) for w in tf.nest.flatten(weights.non_trainable)]
    shared = tuple(t[i] for i in split.shared_t)
    server_state, new_shared = server_optimizer.next(stats['server'], shared,
                                                     tuple(mean_upload['trainable']))
    for i, value in zip(split.shared_t, new_shared):
      t[i] = value
    for i, d in zip(split.shared_n, mean_upload['non_trainable']):
      n[i] = n[i] - d  # the weighted average of the clients' final values
    client_state = (mean_upload['optimizer'] if local.share_optimizer_state
                    else stats['client_optimizer'])
    new_weights = tff.learning.models.ModelWeights(
        trainable=tf.nest.pack_sequence_as(weights.trainable, t),
        non_trainable=tf.nest.pack_sequence_as(weights.non_trainable, n))
    new_stats = collections.OrderedDict(server=server_state, client_optimizer=client_state)
    # Same containers as the initial state: checkpoints restore into it.
    return new_weights, tf.nest.pack_sequence_as(stats, tf.nest.flatten(new_stats))

  return server_update_fn


def _cost(m: _Model, local: recipe_lib.LocalRecipe, down_bits: int, upload_bits: int):
  """(grad examples, steps, clients) → the round's cost metrics (docs/algorithms.md#costs)."""
  split, fb_flops_per_example = m.split, m.fb_flops_per_example
  num_params = sum(int(np.prod(s.shape)) for s in m.trainable_specs)
  opt_floats = sum(int(np.prod(np.shape(v))) for key in split.opt_lists
                   for v in split.opt_initial[key])
  private_floats = sum(int(np.size(v)) for v in split.private_initial.values())
  optimizer_flops_per_step = local.optimizer_ops_per_param * num_params

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

  return cost_fn


COUNTERS_TYPE = tff.StructWithPythonType(
    [('grad_examples', np.int64), ('local_steps', np.int32), ('clients', np.int32)],
    collections.OrderedDict)


def _server_round_computation(m: _Model, stats_type, upload_type, server_update, cost):
  """(x_t, s_t, hparams, mean upload, counters, mean first loss) → (x_{t+1}, s_{t+1},
  the round's metrics)."""

  @tff.tensorflow.computation(m.weights_type, stats_type, m.hparams_type, upload_type,
                              COUNTERS_TYPE, np.float32)
  def server_round_fn(weights, stats, hparams, mean_upload, counters, first_loss):
    del hparams
    new_weights, new_stats = server_update(weights, stats, mean_upload)
    return new_weights, new_stats, collections.OrderedDict(
        first_minibatch_loss=first_loss,
        cost=cost(counters['grad_examples'], counters['local_steps'], counters['clients']))

  return server_round_fn


class _UploadMean:
  """`skeleton.RoundSteps.aggregation`: the clients' uploads through the mean, their
  counters summed, their first losses averaged, their metrics aggregated."""

  def __init__(self, aggregator, metrics_aggregation_fn, stats_type):
    self.aggregator = aggregator
    self.metrics_aggregation_fn = metrics_aggregation_fn
    self.counters = tff.tensorflow.computation(
        lambda stats: collections.OrderedDict(grad_examples=stats['grad_examples'],
                                              local_steps=stats['local_steps'],
                                              clients=np.int32(1)), stats_type)

  def aggregate(self, placement, aggregator_state, results):
    del placement  # TFF's executor: the clients' state goes back per client
    upload, weight, local_metrics, client_stats = results
    agg = self.aggregator.next(aggregator_state, upload, weight)
    counters = tff.federated_sum(tff.federated_map(self.counters, client_stats))
    first_loss = tff.federated_mean(client_stats.first_minibatch_loss)
    return skeleton.Aggregated((agg.result, counters, first_loss), counters,
                               self.metrics_aggregation_fn(local_metrics),
                               (agg.state, agg.measurements))


def _evaluate_computation(m: _Model, state_type, message_fn, client_eval_fn):
  """(state, per-client data) → each client's UA, without training."""

  @tff.federated_computation(state_type, tff.FederatedType(m.client_data_type, tff.CLIENTS))
  def evaluate_fn(state, client_data):
    message = tff.federated_broadcast(tff.federated_map(
        message_fn, (state.global_model_weights, state.finalizer, state.client_work)))
    return tff.federated_map(client_eval_fn, (message, client_data))

  return evaluate_fn


def _hparams_computations(state_type, server_optimizer):
  """(get_hparams_fn, set_hparams_fn) of the state: client work's and the server optimiser's."""

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

  return get_hparams_fn, set_hparams_fn


def _identity(name: str, local: recipe_lib.LocalRecipe, layout: recipe_lib.PatchLayout,
              private_initial,
              fingerprint: Optional[Mapping[str, Any]]) -> collections.OrderedDict:
  """What the client-state store checks a directory against."""
  identity = collections.OrderedDict(
      algorithm=name, local=local.name,
      private=[[key, list(np.shape(v)), np.asarray(v).dtype.str]
               for key, v in private_initial.items()],
      patches=list(layout.description))
  identity.update(fingerprint or {})
  return identity


def build_personalized_process(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    *,
    name: str,
    layout: recipe_lib.PatchLayout,
    local: recipe_lib.LocalRecipe,
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
    fb_flops_per_example: forward+backward FLOPs per example (docs/algorithms.md#costs);
      None: counted from the model, or the FLOP metrics left out (warned).
    fingerprint: extra JSON-able identity for the client-state store.
  """
  if local_steps < 0:
    raise errors.ArgumentError(name, 'local_steps', f'must be non-negative; got {local_steps}')
  model_fn = validation.returning_a_model(model_fn, name)
  validation.check_client_weighting(client_weighting, name)
  client_weighting = client_weighting or tff.learning.ClientWeighting.NUM_EXAMPLES
  m = _describe_model(model_fn, name, layout, local, fb_flops_per_example)
  init_stats, message_fn = _broadcast_computations(m, local, server_optimizer)
  message_type = message_fn.type_signature.result
  client_round_fn, client_eval_fn = _client_computations(m, local, client_weighting,
                                                         message_type)
  upload_type, _, _, stats_type, _ = client_round_fn.type_signature.result
  aggregator = tff.aggregators.MeanFactory().create(upload_type, tff.TensorType(np.float32))
  upload_bits = round_layout.num_bits(upload_type)
  server_round_fn = _server_round_computation(
      m, init_stats.type_signature.result, upload_type,
      _server_update(m, local, server_optimizer),
      _cost(m, local, round_layout.num_bits(message_type), upload_bits))
  initialize_fn = round_layout.initial_state_computation(
      model_fn, client_learning_rate, local_steps, aggregator, init_stats)
  state_type = initialize_fn.type_signature.result
  steps = skeleton.RoundSteps(
      message=message_fn, client_phase=client_round_fn, server=server_round_fn,
      aggregation=_UploadMean(aggregator, m.metrics_aggregation_fn, stats_type),
      stateful_clients=True)
  next_fn = skeleton.federated_next(state_type, m.client_data_type, steps)
  evaluate_fn = _evaluate_computation(m, state_type, message_fn, client_eval_fn)
  get_model_weights, set_model_weights = round_layout.model_weights_fns(state_type.member,
                                                                    m.weights_type)
  get_hparams_fn, set_hparams_fn = _hparams_computations(state_type, server_optimizer)
  private_initial = m.split.private_initial
  return PersonalizedProcess(
      initialize_fn, next_fn, evaluate_fn, get_model_weights, set_model_weights,
      private_initial=private_initial, upload_type=upload_type, upload_bits=upload_bits,
      fingerprint=_identity(name, local, layout, private_initial, fingerprint), name=name,
      get_hparams=get_hparams_fn, set_hparams=set_hparams_fn)
