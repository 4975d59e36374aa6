"""Execution 1: every client its own call of a TFF computation (TFF's model).

  next(state, client_datasets):
    message = broadcast(x_t, broadcast(s_t), (η, K))
    per client (tff.federated_map): y_k from the model's variables over its
      tf.data batches; `client.ClientLoop` does the algorithm's part
    one federated_sum of the client sums (the mean fused in), or Δ through
      `model_aggregator` / `upload_compression`
    server: `server.ServerRound`
  A recipe whose clients keep state (`Recipe.init_client_state`) takes, per
  client, OrderedDict(train=dataset, private=state) and returns the new states
  per client: a `stateful.StatefulClientsProcess`.
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.rounds import client as client_lib
from tff_adaptive.rounds import layout
from tff_adaptive.rounds import model_info as model_info_lib
from tff_adaptive.rounds import options as options_lib
from tff_adaptive.rounds import recipe as recipe_lib
from tff_adaptive.rounds import server as server_lib
from tff_adaptive.rounds import stateful


def _batches(dataset, steps):
  """K > 0: exactly K batches, cycling the data; K <= 0: the dataset as given."""
  steps64 = tf.cast(steps, tf.int64)
  cycle = steps64 > 0
  return dataset.repeat(tf.where(cycle, tf.constant(-1, tf.int64), 1)).take(
      tf.where(cycle, steps64, -1))


def client_update(model, loop: client_lib.ClientLoop, message, dataset, iterate: bool,
                  client_state=()):
  """One client's round on the model's variables: Δ_i, extra_i, weight, stats[, state]."""
  variables = tff.learning.models.ModelWeights.from_model(model)
  tf.nest.map_structure(lambda v, t: v.assign(t), variables, message['model_weights'])
  trainable = list(tf.nest.flatten(variables.trainable))
  x_t = [tf.identity(v) for v in trainable]
  lr = message['hparams']['learning_rate']
  carry = loop.init(x_t, message['broadcast'], client_state)
  batches = _batches(dataset, message['hparams']['local_steps'])
  # An iterator loop, not `for batch in dataset` (which autograph lowers to
  # `dataset.reduce`): in TFF's C++ executor the reduce form costs ~3x more per
  # client (bench/results, docs/performance.md).
  for batch in (iter(batches) if iterate else batches):
    for v, w in zip(trainable, carry['y']):
      v.assign(w)
    with tf.GradientTape() as tape:
      output = model.forward_pass(batch, training=True)
    grads = tape.gradient(output.loss, trainable)
    grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
             for g, v in zip(grads, trainable)]
    carry = loop.step(carry, grads, output.loss, output.num_examples, lr)
  return loop.final(carry, x_t), variables.trainable


def build(model_fn, recipe: recipe_lib.Recipe, *, client_learning_rate: float,
          local_steps: int, options: options_lib.RoundOptions,
          info: model_info_lib.ModelInfo) -> tff.learning.templates.LearningProcess:
  """The per-client `LearningProcess` of `recipe` (see `composer.build_process`)."""
  del model_fn  # `info` holds the model
  metrics_aggregator = options.metrics_aggregator
  if metrics_aggregator is tff.learning.metrics.sum_then_finalize:
    metrics_aggregator = None  # what the fused sum computes
  check_client_state_options(recipe, options)
  shape = _RoundShape(recipe, options, info, metrics_aggregator)
  client_round_fn = _client_round_computation(shape)
  types = _ResultTypes(shape, client_round_fn.type_signature.result)
  aggregation = _Aggregation(options, recipe, types.delta, types.extra)
  server_round_fn = _server_round_computation(shape, types)
  initialize_fn = layout.initial_state_computation(
      info.model_fn, client_learning_rate, local_steps, aggregation.delta, info.init_stats)
  state_type = initialize_fn.type_signature.result
  next_fn = _next_computation(shape, types, state_type, client_round_fn, server_round_fn,
                              aggregation)
  if shape.stateful_clients:
    return finish_process(
        initialize_fn, next_fn, state_type, info, recipe,
        process_class=stateful.StatefulClientsProcess,
        **client_state_arguments(recipe, info))
  return finish_process(initialize_fn, next_fn, state_type, info, recipe)


class _RoundShape:
  """What every part of a per-client round depends on: the recipe, its options and types."""

  def __init__(self, recipe, options, info, metrics_aggregator):
    self.recipe, self.options, self.info = recipe, options, info
    self.metrics_aggregator = metrics_aggregator
    self.fused_mean = options.fused_mean and metrics_aggregator is None
    self.loop = client_lib.ClientLoop(recipe, options.weighting_for(recipe),
                                      options.measure_client_drift)
    self.iterate = (options.loop_implementation or tff.learning.LoopImplementation.DATASET_ITERATOR
                    ) == tff.learning.LoopImplementation.DATASET_ITERATOR
    self.stateful_clients = recipe.has_client_state
    self.data_type = tff.SequenceType(info.element_type)
    if self.stateful_clients:
      client_state_type = tff.tensorflow.computation(
          lambda: recipe.init_client_state(list(info.trainable_specs))).type_signature.result
      self.data_type = tff.StructWithPythonType(
          [('train', self.data_type), ('private', client_state_type)], collections.OrderedDict)


def _client_round_computation(shape: _RoundShape) -> tff.Computation:
  """One client's round: its sums (fused mean), or Δ, extra, weight, sums and metrics."""
  recipe, loop, fused_mean = shape.recipe, shape.loop, shape.fused_mean
  metrics_aggregator, stateful_clients = shape.metrics_aggregator, shape.stateful_clients

  def client_round(model, message, data):
    dataset, client_state = (data['train'], data['private']) if stateful_clients else (data, ())
    result, trainable = client_update(model, loop, message, dataset, shape.iterate, client_state)
    local_metrics = model.report_local_unfinalized_metrics()
    sums, delta = client_lib.client_sums(
        result, local_metrics if metrics_aggregator is None else (),
        fused_mean=fused_mean, delta_structure=trainable, summed_extra=recipe.sum_extra)
    if fused_mean:
      out = (sums,)
    else:
      out = (delta, result.extra, result.weight, sums,
             () if metrics_aggregator is None else local_metrics)
    # The new client state is a per-client output, never summed.
    return out + (result.client_state,) if stateful_clients else (out[0] if fused_mean else out)

  @tff.tensorflow.computation(shape.info.message_type, shape.data_type)
  def client_round_fn(message, data):
    model = shape.info.client_model()  # variables must be created outside the tf.function
    return tf.function(lambda *args: client_round(model, *args))(message, data)

  return client_round_fn


class _ResultTypes:
  """The TFF types of a client's round results (without a new client state)."""

  def __init__(self, shape: _RoundShape, client_result):
    if shape.stateful_clients:
      client_result = tff.StructType(list(tff.structure.iter_elements(client_result))[:-1])
      if shape.fused_mean:
        client_result = client_result[0]
    if shape.fused_mean:
      self.sums = client_result
      self.delta, self.extra = client_result.weighted_delta, client_result.weighted_extra
      self.local_metrics = None
    else:
      self.delta, self.extra, _, self.sums, self.local_metrics = client_result


def _server_round_computation(shape: _RoundShape, types: _ResultTypes) -> tff.Computation:
  info, options = shape.info, shape.options
  server_round = server_lib.ServerRound(
      shape.recipe, info.costs(shape.recipe, types.delta, types.extra,
                               options.fb_flops_per_example),
      info.finalizers if shape.metrics_aggregator is None else None,
      options.measure_client_drift)
  if shape.fused_mean:
    @tff.tensorflow.computation(info.weights_type, info.stats_type, layout.HPARAMS_TYPE,
                                types.sums)
    def fused_fn(model_weights, stats, hparams, sums):
      return server_round.from_weighted_sums(model_weights, stats, hparams, sums)
    return fused_fn

  @tff.tensorflow.computation(info.weights_type, info.stats_type, layout.HPARAMS_TYPE,
                              types.sums, types.delta, types.extra, tff.TensorType(np.float64))
  def server_round_fn(model_weights, stats, hparams, sums, mean_delta, mean_extra, bits):
    return server_round(model_weights, stats, hparams, sums, mean_delta, mean_extra, bits)
  return server_round_fn


def _next_computation(shape: _RoundShape, types: _ResultTypes, state_type, client_round_fn,
                      server_round_fn, aggregation) -> tff.Computation:
  """`process.next`: broadcast, the clients' rounds, aggregation, the server step."""
  info, fused_mean, stateful_clients = shape.info, shape.fused_mean, shape.stateful_clients
  if fused_mean:  # MeanFactory's (tensor-free) measurements, as every path reports them
    no_measurements = layout.tensor_free_value(
        aggregation.delta.next.type_signature.result.measurements)

  @tff.federated_computation(state_type, tff.FederatedType(shape.data_type, tff.CLIENTS))
  def next_fn(state, client_data):
    message = tff.federated_broadcast(tff.federated_map(
        info.server_message_fn, (state.global_model_weights, state.finalizer, state.client_work)))
    server_args = (state.global_model_weights, state.finalizer, state.client_work)
    train_metrics = None
    results = tff.federated_map(client_round_fn, (message, client_data))
    new_client_states = None
    if stateful_clients:  # (sums, state) or (Δ, extra, weight, sums, metrics, state)
      *results, new_client_states = results
      results = results[0] if fused_mean else tuple(results)
    if fused_mean:
      sums = tff.federated_sum(results)
      server = tff.federated_map(server_round_fn, (*server_args, sums))
      aggregator_state = state.aggregator
      measurements = tff.federated_value(no_measurements, tff.SERVER)
    else:
      delta, extra, weight, client_sums, local_metrics = results
      if shape.metrics_aggregator is not None:
        train_metrics = shape.metrics_aggregator(info.finalizers, types.local_metrics)(
            local_metrics)
      aggregator_state, measurements, mean_delta, mean_extra, bits = aggregation(
          state.aggregator, delta, extra, weight)
      server = tff.federated_map(server_round_fn, (
          *server_args, tff.federated_sum(client_sums), mean_delta, mean_extra, bits))
    learning_output = output(state, server, aggregator_state, measurements, train_metrics,
                             shape.options.measure_client_drift)
    if stateful_clients:
      return stateful.StatefulClientsOutput(learning_output.state, learning_output.metrics,
                                            new_client_states)
    return learning_output

  return next_fn


def check_client_state_options(recipe, options: options_lib.RoundOptions) -> None:
  if recipe.has_client_state and options.upload_compression is not None:
    raise ValueError(f'{recipe.name}: upload_compression is not available for an algorithm '
                     'whose clients keep state (its extra upload is summed, not compressed)')


def client_state_arguments(recipe, info) -> dict:
  """`stateful.StatefulClientsProcess`'s client-state arguments, for both executions."""
  structure = recipe.init_client_state(
      [tf.TensorSpec(s.shape, s.dtype) for s in info.trainable_specs])
  return dict(client_state_initial=stateful.flat_state(
      tf.nest.map_structure(np.asarray, structure)), client_state_structure=structure,
              name=recipe.name)


class _Aggregation:
  """Δ (and the extra upload) through `model_aggregator` or `upload_compression`."""

  def __init__(self, options: options_lib.RoundOptions, recipe, delta_type, extra_type):
    self.options = options
    self.has_extra = recipe.upload is not None
    factory = options.model_aggregator or tff.aggregators.MeanFactory()
    weight_type = tff.TensorType(np.float32)
    if options.upload_compression is not None:
      joint_type = tff.StructWithPythonType([('delta', delta_type), ('extra', extra_type)],
                                            collections.OrderedDict)
      self.delta = options.upload_compression.create(joint_type, weight_type)
    elif options.weighted:
      self.delta = factory.create(delta_type, weight_type)
    else:
      self.delta = factory.create(delta_type)
    self.sum_extra = recipe.sum_extra
    self.extra = tff.aggregators.MeanFactory().create(extra_type, weight_type)
    # The extra upload's mean keeps no state: a constant, not a part of the
    # process state (whose `aggregator` is `model_aggregator`'s).
    extra_state_type = self.extra.initialize.type_signature.result
    if any(True for _ in layout.leaves(extra_state_type)):
      raise AssertionError('the extra upload aggregator must be stateless')
    self.extra_state = layout.tensor_free_value(extra_state_type)

  def __call__(self, state, delta, extra, weight):
    """(state, measurements, mean Δ, mean extra, measured upload bits), all at SERVER."""
    if self.options.upload_compression is not None:
      agg = self.delta.next(
          state, tff.federated_zip(collections.OrderedDict(delta=delta, extra=extra)), weight)
      return (agg.state, agg.measurements, agg.result.delta, agg.result.extra,
              agg.measurements.upload_bits_per_client)
    agg = (self.delta.next(state, delta, weight) if self.options.weighted
           else self.delta.next(state, delta))
    if self.has_extra and self.sum_extra:
      mean_extra = tff.federated_sum(extra)  # `Recipe.sum_extra`: Σ extra_i
    elif self.has_extra:
      mean_extra = self.extra.next(
          tff.federated_value(self.extra_state, tff.SERVER), extra, weight).result
    else:  # nothing besides Δ goes up: no aggregation of an empty structure
      mean_extra = tff.federated_value((), tff.SERVER)
    return (agg.state, agg.measurements, agg.result, mean_extra,
            tff.federated_value(np.float64(-1.0), tff.SERVER))


def output(state, server, aggregator_state, measurements, train_metrics, measure_client_drift):
  """The round's `LearningProcessOutput` in TFF's layout (federated values)."""
  new_weights, new_stats, round_metrics = server
  new_state = tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
      global_model_weights=new_weights, distributor=state.distributor,
      client_work=state.client_work, aggregator=aggregator_state, finalizer=new_stats))
  if train_metrics is None:
    train_metrics = round_metrics.train
  metrics = collections.OrderedDict(
      distributor=tff.federated_value((), tff.SERVER),
      client_work=tff.federated_zip(collections.OrderedDict(
          train=train_metrics, first_minibatch_loss=round_metrics.first_minibatch_loss)),
      aggregator=measurements,
      finalizer=tff.federated_value((), tff.SERVER),
      cost=round_metrics.cost)
  if measure_client_drift:
    metrics['client_drift'] = round_metrics.client_drift
  return tff.learning.templates.LearningProcessOutput(new_state, tff.federated_zip(metrics))


def finish_process(initialize_fn, next_fn, state_type, info, recipe, process_class=None, **kwargs):
  """The `LearningProcess` around `next_fn` with TFF's weight and hparam accessors."""
  get_model_weights, set_model_weights = layout.model_weights_fns(state_type.member,
                                                                  info.weights_type)
  get_hparams_fn, set_hparams_fn = layout.hparams_fns(state_type.member, recipe)
  process_class = process_class or tff.learning.templates.LearningProcess
  return process_class(initialize_fn, next_fn, get_model_weights, set_model_weights,
                       get_hparams_fn=get_hparams_fn, set_hparams_fn=set_hparams_fn, **kwargs)
