"""Execution 1: every client its own call of a TFF computation (TFF's model).

The round is `skeleton.run_round`; this module gives it its steps:
  client phase: per client (tff.federated_map), y_k from the model's variables
    over its tf.data batches; `client.ClientLoop` does the algorithm's part
  aggregation: one federated_sum of the client sums (the mean fused in:
    `skeleton.Summed`), or Δ through `model_aggregator` / `upload_compression`
    (`_Aggregation`)
  server: `server.ServerRound`
A recipe whose clients keep state (`Recipe.state_keeper`) takes, per
client, OrderedDict(train=dataset, private=state) and returns the new states
per client: a `stateful.StatefulClientsProcess`.
"""

import collections
import collections.abc
import functools

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.aggregators import base as aggregator_base
from tff_adaptive.rounds import client as client_lib
from tff_adaptive.rounds import extension
from tff_adaptive.rounds import cohort_aggregation
from tff_adaptive.rounds import layout
from tff_adaptive.rounds import model_info as model_info_lib
from tff_adaptive.rounds import on_variables
from tff_adaptive.rounds import options as options_lib
from tff_adaptive.rounds import processes
from tff_adaptive.rounds import recipe as recipe_lib
from tff_adaptive.rounds import server as server_lib
from tff_adaptive.rounds import skeleton
from tff_adaptive.rounds import stateful


def _batches(dataset, steps, per_step: int = 1):
  """K > 0: exactly K steps, cycling the data; K <= 0: the dataset as given.

  With `per_step` > 1 (`Recipe.batches_per_step`, an extension's) each element is a tuple of
  consecutive batches, (b0, b1), (b2, b3), ...; a last incomplete tuple is
  left out.
  """
  steps64 = tf.cast(steps, tf.int64)
  cycle = steps64 > 0
  repeated = dataset.repeat(tf.where(cycle, tf.constant(-1, tf.int64), 1))
  if per_step > 1:
    repeated = tf.data.Dataset.zip(tuple(repeated.shard(per_step, j) for j in range(per_step)))
  return repeated.take(tf.where(cycle, steps64, -1))


def client_update(model, loop: client_lib.ClientLoop, message, dataset, iterate: bool,
                  client_state=(), inputs=None):
  """One client's round on the model's variables: its `ClientResult`, and Δ's structure."""
  variables = tff.learning.models.ModelWeights.from_model(model)
  trainable = list(tf.nest.flatten(variables.trainable))
  non_trainable = list(tf.nest.flatten(variables.non_trainable))
  x_t = list(tf.nest.flatten(message['model_weights'].trainable))
  n_t = list(tf.nest.flatten(message['model_weights'].non_trainable))
  start = loop.start_weights(x_t, n_t, client_state)
  # The extensions' passes and the training start from the client's start weights.
  for v, t in zip(trainable + non_trainable, start[0] + start[1]):
    v.assign(t)
  lr = message['hparams']['learning_rate']
  per_step = loop.recipe.batches_per_step
  passes = on_variables.ModelPasses(model, variables, start, lr, iterate,
                        inputs if inputs is not None else collections.OrderedDict(train=dataset),
                        _batches(dataset, message['hparams']['local_steps'], per_step))
  carry = loop.before_steps(loop.init(x_t, message['broadcast'], client_state, n_t), passes)
  # An iterator loop, not `for batch in dataset` (which autograph lowers to
  # `dataset.reduce`): in TFF's C++ executor the reduce form costs ~3x more per
  # client (bench/results, docs/performance.md).
  for batch in (iter(passes.batches) if iterate else passes.batches):
    group = batch if per_step > 1 else (batch,)
    for v, w in zip(trainable, loop.gradient_point(carry)):
      v.assign(w)
    output, grads = on_variables.loss_and_grads(model, trainable, group[0])
    num_examples = tf.cast(on_variables.num_examples(output), tf.int64)
    for other in group[1:]:
      num_examples += tf.shape(tf.nest.flatten(other)[0], out_type=tf.int64)[0]
    carry = loop.step(carry, grads, output.loss, num_examples, message['hparams'],
                      functools.partial(on_variables.grad_at, model, trainable, group))
  # The forward passes in training mode moved the non-trainable weights (batch-norm statistics).
  carry = loop.with_non_trainable(carry, [tf.identity(v) for v in non_trainable])
  return (loop.final(carry, x_t, n_t),
          client_lib.delta_structure(loop.recipe, variables.trainable, variables.non_trainable))


def build(model_fn, recipe: recipe_lib.Recipe, *, client_learning_rate: float,
          local_steps: int, options: options_lib.RoundOptions,
          info: model_info_lib.ModelInfo) -> tff.learning.templates.LearningProcess:
  """The per-client `LearningProcess` of `recipe` (see `composer.build_process`)."""
  del model_fn  # `info` holds the model
  metrics_aggregator = options.metrics_aggregator
  if metrics_aggregator is tff.learning.metrics.sum_then_finalize:
    metrics_aggregator = None  # what the fused sum computes
  processes.check_client_state_options(recipe, options)
  shape = _RoundShape(recipe, options, info, metrics_aggregator)
  client_round_fn = _client_round_computation(shape)
  types = _ResultTypes(shape, client_round_fn.type_signature.result)
  aggregation = _Aggregation(options, recipe, types.delta, types.extra,
                             _train_metrics_fn(shape, types))
  server_round_fn = _server_round_computation(shape, types)
  initialize_fn = layout.initial_state_computation(
      info.model_fn, client_learning_rate, local_steps, aggregation.delta, info.init_stats,
      info.client_hparams)
  state_type = initialize_fn.type_signature.result
  steps = skeleton.RoundSteps(
      message=info.server_message_fn, client_phase=client_round_fn, server=server_round_fn,
      aggregation=(skeleton.Summed(cohort_aggregation.mean(recipe.sum_extra), aggregation.delta)
                   if shape.fused_mean else aggregation),
      stateful_clients=shape.stateful_clients,
      measure_client_drift=options.measure_client_drift)
  next_fn = skeleton.federated_next(state_type, shape.data_type, steps)
  if recipe.evaluates_clients:
    return processes.finish_process(
        initialize_fn, next_fn, state_type, info, recipe,
        process_class=stateful.PersonalizedClientsProcess,
        evaluate_fn=on_variables.evaluate_computation(info, shape.loop, shape.data_type, state_type,
                                         shape.iterate),
        **processes.client_state_arguments(recipe, info))
  if shape.stateful_clients:
    return processes.finish_process(
        initialize_fn, next_fn, state_type, info, recipe,
        process_class=stateful.StatefulClientsProcess,
        **processes.client_state_arguments(recipe, info))
  return processes.finish_process(initialize_fn, next_fn, state_type, info, recipe)


class _RoundShape:
  """What every part of a per-client round depends on: the recipe, its options and types."""

  def __init__(self, recipe, options, info, metrics_aggregator):
    self.recipe, self.options, self.info = recipe, options, info
    self.metrics_aggregator = metrics_aggregator
    self.fused_mean = options.fused_mean and metrics_aggregator is None
    self.loop = client_lib.ClientLoop(recipe, options.weighting_for(recipe),
                                      options.measure_client_drift)
    self.iterate = processes.iterates(options)
    self.stateful_clients = recipe.has_client_output
    self.data_type = processes.client_data_type(recipe, info)

  def split_data(self, data):
    """One client's input → (training dataset, all its inputs, its state or ())."""
    if not self.stateful_clients:
      return data, collections.OrderedDict(train=data), ()
    return data['train'], data, data['private'] if self.recipe.has_client_state else ()


def _client_round_computation(shape: _RoundShape) -> tff.Computation:
  """One client's round: its sums (fused mean), or Δ, extra, weight, sums and metrics."""
  recipe, loop, fused_mean = shape.recipe, shape.loop, shape.fused_mean
  metrics_aggregator, stateful_clients = shape.metrics_aggregator, shape.stateful_clients

  def client_round(model, message, data):
    dataset, inputs, client_state = shape.split_data(data)
    result, structure = client_update(model, loop, message, dataset, shape.iterate,
                                      client_state, inputs)
    local_metrics = model.report_local_unfinalized_metrics()
    sums, delta = client_lib.client_sums(
        result, local_metrics if metrics_aggregator is None else (),
        fused_mean=fused_mean, delta_structure=structure, summed_extra=recipe.sum_extra)
    if fused_mean:
      out = (sums,)
    else:
      out = (delta, result.extra, result.weight, sums,
             () if metrics_aggregator is None else local_metrics)
    # The new client state (and UA) is a per-client output, never summed.
    if stateful_clients:
      return out + (loop.client_output(result),)
    return out[0] if fused_mean else out

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
    @tff.tensorflow.computation(info.weights_type, info.stats_type, info.hparams_type,
                                types.sums)
    def fused_fn(model_weights, stats, hparams, sums):
      return server_round.from_weighted_sums(model_weights, stats, hparams, sums)
    return fused_fn

  @tff.tensorflow.computation(info.weights_type, info.stats_type, info.hparams_type,
                              types.sums, types.delta, types.extra, tff.TensorType(np.float64))
  def server_round_fn(model_weights, stats, hparams, sums, mean_delta, mean_extra, bits):
    return server_round(model_weights, stats, hparams, sums, mean_delta, mean_extra, bits)
  return server_round_fn


def _train_metrics_fn(shape: _RoundShape, types: _ResultTypes):
  """The clients' metrics → train metrics through `metrics_aggregator` (None: the server
  step finalizes them from the sums)."""
  if shape.metrics_aggregator is None:
    return None
  return lambda local_metrics: shape.metrics_aggregator(
      shape.info.finalizers, types.local_metrics)(local_metrics)


class _Aggregation:
  """Δ (and the extra upload) through the options' aggregator's TFF process
  (`RoundOptions.aggregator`: `model_aggregator`, `upload_compression` or the mean)."""

  def __init__(self, options: options_lib.RoundOptions, recipe, delta_type, extra_type,
               train_metrics_fn=None):
    self.aggregator = options.aggregator
    self.train_metrics_fn = train_metrics_fn
    self.has_extra = recipe.upload is not None
    self.delta = self.aggregator.create_process(delta_type, extra_type)
    self.sum_extra = recipe.sum_extra
    self.extra = tff.aggregators.MeanFactory().create(extra_type, tff.TensorType(np.float32))
    # The extra upload's mean keeps no state: a constant, not a part of the
    # process state (whose `aggregator` is `model_aggregator`'s).
    extra_state_type = self.extra.initialize.type_signature.result
    if any(True for _ in layout.leaves(extra_state_type)):
      raise AssertionError('the extra upload aggregator must be stateless')
    self.extra_state = aggregator_base.tensor_free_value(extra_state_type)

  def aggregate(self, placement, aggregator_state, results) -> skeleton.Aggregated:
    """`skeleton.RoundSteps.aggregation`: Δ, the extra upload and the train metrics."""
    del placement  # per client is always federated
    delta, extra, weight, client_sums, local_metrics = results
    train_metrics = (None if self.train_metrics_fn is None
                     else self.train_metrics_fn(local_metrics))
    new_state, measurements, mean_delta, mean_extra, bits = self(
        aggregator_state, delta, extra, weight)
    sums = tff.federated_sum(client_sums)
    return skeleton.Aggregated((sums, mean_delta, mean_extra, bits), sums, train_metrics,
                               (new_state, measurements))

  def __call__(self, state, delta, extra, weight):
    """(state, measurements, mean Δ, mean extra, measured upload bits), all at SERVER."""
    if self.aggregator.joint:
      agg = self.delta.next(
          state, tff.federated_zip(collections.OrderedDict(delta=delta, extra=extra)), weight)
      return (agg.state, agg.measurements, agg.result.delta, agg.result.extra,
              agg.measurements.upload_bits_per_client)
    agg = (self.delta.next(state, delta, weight) if self.aggregator.weighted
           else self.delta.next(state, delta))
    if self.has_extra and self.sum_extra:
      mean_extra = tff.federated_sum(extra)  # `Recipe.sum_extra`: Σ extra_i
    elif self.has_extra:
      mean_extra = self.extra.next(
          tff.federated_value(self.extra_state, tff.SERVER), extra, weight).result
    else:  # nothing besides Δ goes up: no aggregation of an empty structure
      mean_extra = tff.federated_value((), tff.SERVER)
    return (agg.state, agg.measurements, agg.result, mean_extra,
            tff.federated_value(np.float64(aggregator_base.NO_BITS), tff.SERVER))


