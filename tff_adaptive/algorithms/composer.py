"""One federated round, assembled from an algorithm's math (a `Recipe`).

Every adaptive algorithm of the package has the same skeleton:

  server → clients:  x_t, broadcast(s_t), round hyperparameters (η_t, K_t)
  client i:          y_0 = x_t; local = init_local(broadcast(s_t), y_0)
                     for k < K_t:  g_k = ∇f(y_k; batch_k)
                                   local, y_{k+1} = local_step(local, y_k, g_k, η_t, k)
                     Δ_i = x_t − y_K;  extra_i = upload(local, g_0)
  clients → server:  Δ_i through `model_aggregator` (any `tff.aggregators`
                     factory: mean, DP, compression, robust), extra_i through a
                     mean with the same weights
  server:            x_{t+1}, s_{t+1} = server_update(x_t, s_t, Δ̄, extra, η_t, K_t)

A `Recipe` supplies those five TF functions; `build_process` wires them with
TFF intrinsics into a `tff.learning.templates.LearningProcess` and measures,
from the TFF types of what is actually broadcast and aggregated, the bits each
client downloads and uploads, plus client SGD steps and FLOPs (SPEC §8). It is
TFF's `compose_learning_process` with one difference that adaptive algorithms
need: the clients receive server-side optimiser state, not only the model.

State and metrics have TFF's layout, so TFF programs (`train_model`,
checkpointing through `process.get_model_weights`, hparams) treat these
processes like TFF's own. The state is a
`tff.learning.templates.LearningAlgorithmState`:
  global_model_weights  x_t (`ModelWeights`),
  distributor           () (x_t and s_t go down in one broadcast, below),
  client_work           OrderedDict(learning_rate=η, local_steps=K): what
                        clients are told to run this round, like TFF's client
                        work state (its client optimiser's hyperparameters);
                        schedules change it between rounds,
  aggregator            `model_aggregator`'s state,
  finalizer             the recipe's server statistics s_t (for a server
                        optimiser: its state, so `finalizer['learning_rate']`
                        is η_s as in TFF's builders).
`process.get_hparams(state)` is OrderedDict(client_work=OrderedDict(
learning_rate, local_steps), finalizer=the server optimiser's hparams or an
empty OrderedDict); `set_hparams` writes them back. Metrics:
OrderedDict(distributor=(), client_work=OrderedDict(train=the model's
finalized metrics, first_minibatch_loss=mean over the sampled clients of the
loss on their first local minibatch), aggregator=`model_aggregator`'s
measurements, finalizer=(), cost=the measurements above[, client_drift]).

Design: TFF's `compose_learning_process` would give each component its own
intrinsics (a broadcast for the distributor, another for client work's
state, ...); a round here is one broadcast and one `federated_sum` (plus the
aggregator's own intrinsics when one is plugged in), measured to matter in
TFF's C++ executor (docs/performance.md). Only the containers are TFF's.
Like TFF's, the state keeps no round counter (the training loop counts). The
layout before TFF's (an OrderedDict of global_model_weights, stats,
aggregator, hparams, round_num) has one leaf more than this one, so a
checkpoint written with it is refused by `workflow.program` in one line
(`IncompatibleCheckpoint`), never loaded leaf by leaf into the wrong places.

Optionally (`measure_client_drift`), each round also reports client drift,
seed 000's Fig. 6.1 diagnostic (see `accounting/drift.py`).
"""

import collections
import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Optional, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.accounting import costs
from tff_adaptive.accounting import drift
from tff_adaptive.algorithms import validation

Structure = Any
# Ops per parameter per local step of the optimiser, SPEC §8 (SGD: 2).
DEFAULT_OPTIMIZER_OPS = 2.0
# For the algorithms built by TFF's own templates (Mime, FedProx): the same
# client loop as TFF's default (DATASET_REDUCE), ~3x cheaper per client in
# TFF's C++ executor (docs/performance.md).
TFF_CLIENT_LOOP = tff.learning.LoopImplementation.DATASET_ITERATOR


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
    optimizer_ops_per_param: C in the FLOP model (SPEC §8).
    The client optimiser memory reported is the float size of `init_local`'s
    output (what a client holds besides the model).
    equal_local_steps: the server step assumes every client ran exactly K
      steps (FedGBO's inverse step); a round violating it fails loudly.
    weighting: default client weighting.
    uses_first_gradient: `upload` reads g_0 (MimeXlite); otherwise the client
      loop does not keep it.
    get_server_hparams: s → the server's hyperparameters (e.g. a server
      optimiser's `get_hparams`), the `finalizer` part of `process.get_hparams`;
      None: no server hyperparameters.
    set_server_hparams: (s, hparams) → s.
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
  get_server_hparams: Optional[Callable[[Structure], Structure]] = None
  set_server_hparams: Optional[Callable[[Structure, Structure], Structure]] = None


def _num_bits(type_spec: tff.Type) -> int:
  """Exact payload bits of a TFF type: Σ elements × dtype width."""
  return sum(int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize * 8
             for leaf in _leaves(type_spec))


def _leaves(type_spec: tff.Type):
  if isinstance(type_spec, tff.TensorType):
    yield type_spec
  elif isinstance(type_spec, tff.StructType):
    for _, member in tff.structure.iter_elements(type_spec):
      yield from _leaves(member)
  elif isinstance(type_spec, tff.FederatedType):
    yield from _leaves(type_spec.member)
  else:
    raise TypeError(f'cannot count bits of {type_spec}')


def _zeros_like_specs(specs):
  return tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), specs)


def _as_float32(structure):
  return tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), structure)


ModelFn = Union[Callable[[], tff.learning.models.VariableModel],
                tff.learning.models.FunctionalModel]


def build_process(
    model_fn: ModelFn,
    recipe: Recipe,
    *,
    client_learning_rate: float,
    local_steps: int,
    model_aggregator: Optional[tff.aggregators.AggregationFactory] = None,
    client_weighting: Optional[tff.learning.ClientWeighting] = None,
    fb_flops_per_example: Optional[float] = None,
    upload_compression: Optional[tff.aggregators.WeightedAggregationFactory] = None,
    measure_client_drift: Optional[bool] = None,
    model_distributor: Optional[tff.learning.templates.DistributionProcess] = None,
    metrics_aggregator: Optional[Callable[..., tff.Computation]] = None,
    loop_implementation: Optional[tff.learning.LoopImplementation] = None,
) -> tff.learning.templates.LearningProcess:
  """Builds the `LearningProcess` of `recipe`.

  Args:
    model_fn: no-arg callable returning a `tff.learning.models.VariableModel`,
      or a `tff.learning.models.FunctionalModel` (see `variable_model_fn`).
    recipe: the algorithm.
    client_learning_rate: initial η (`state.client_work['learning_rate']`;
      `process.set_hparams` or schedules change it).
    local_steps: initial K: clients run exactly K minibatch steps, cycling
      through their data (reshuffled by the dataset pipeline each pass); 0
      means one pass over the client dataset as preprocessed (E epochs).
    model_aggregator: aggregation factory for Δ. Weighted factories get the
      client weights; unweighted ones (e.g. TFF's DP factories) imply uniform
      weighting. Default: `tff.aggregators.MeanFactory()`.
    client_weighting: overrides the recipe's default weighting.
    fb_flops_per_example: forward+backward FLOPs per example (SPEC §8), for
      the client FLOP measurement. None: counted from the model's Keras model
      (`tff.learning.models.from_keras_model`); when that is impossible the
      `cost/client_flops*` metrics are left out, with a warning.
    upload_compression: a factory that aggregates Δ and the extra upload
      together, `OrderedDict(delta=Δ, extra=extra)` (e.g.
      `aggregators.compression.SharedIndexCompressionFactory`, which encodes
      Δm, Δv at Δω's indices) and measures `upload_bits_per_client`; it
      replaces `model_aggregator`.
    measure_client_drift: report `client_drift/{delta,model}_cosine_distance`
      (mean pairwise cosine distance between the sampled clients' Δ_i, resp.
      final trainable weights y_K^i) and `client_drift/num_clients` each
      round. Each client sums in two float64 unit vectors of the model's
      size (`tff.federated_sum`): a simulation-only diagnostic, not counted
      in `cost/` bits. None: the default set by `measuring_client_drift`
      (off).
    model_distributor: not supported (ValueError): the round broadcasts x_t,
      the clients' share of s_t and (η, K) as one message.
    metrics_aggregator: as in TFF's builders, `(metric_finalizers,
      local_unfinalized_metrics_type) -> federated computation`; None (or
      `tff.learning.metrics.sum_then_finalize`): summed within the round's
      single `federated_sum`, then finalized.
    loop_implementation: the client loop over batches; None:
      `DATASET_ITERATOR` (~3x cheaper per client than `DATASET_REDUCE` in
      TFF's C++ executor, docs/performance.md).
  """
  if measure_client_drift is None:
    measure_client_drift = _MEASURE_CLIENT_DRIFT.get()
  if model_distributor is not None:
    raise ValueError(f'{recipe.name}: model_distributor is not supported: the round sends the '
                     'model, the server optimiser state and (η, K) to the clients as one '
                     'broadcast')
  if metrics_aggregator is tff.learning.metrics.sum_then_finalize:
    metrics_aggregator = None  # what the fused sum computes
  loop_implementation = loop_implementation or tff.learning.LoopImplementation.DATASET_ITERATOR
  if not isinstance(loop_implementation, tff.learning.LoopImplementation):
    raise TypeError(f'{recipe.name}: loop_implementation must be a '
                    f'tff.learning.LoopImplementation; got {loop_implementation!r}')
  model_fn = variable_model_fn(model_fn, recipe.name)
  validation.check_weighting(client_weighting, model_aggregator, upload_compression, recipe.name)
  if upload_compression is not None and model_aggregator is not None:
    raise ValueError('--upload_compression cannot be combined with another model aggregator '
                     '(e.g. --dp)')
  if local_steps < 0 or (recipe.equal_local_steps and local_steps < 1):
    raise ValueError(f'--local_steps must be at least 1 for {recipe.name}; got {local_steps}')
  weighting = client_weighting or recipe.weighting
  weighted = model_aggregator is None or isinstance(
      model_aggregator, tff.aggregators.WeightedAggregationFactory)
  if not weighted:
    # Δ is averaged uniformly: the extra uploads (MFL's optimiser states,
    # MimeXlite's gradients, FedGBO's ḡ) must be averaged the same way.
    if client_weighting not in (None, tff.learning.ClientWeighting.UNIFORM):
      raise ValueError(f'--client_weighting={client_weighting.name.lower()} contradicts an '
                       'unweighted model_aggregator (it averages uniformly)')
    weighting = tff.learning.ClientWeighting.UNIFORM

  with tf.Graph().as_default():
    model = model_fn()
    finalizers = model.metric_finalizers()  # applied to the clients' summed metrics, as
    # tff.learning.metrics.sum_then_finalize does
    if fb_flops_per_example is None:
      fb_flops_per_example = costs.count_fb_flops(model, recipe.name)
  element_type = tff.types.tensorflow_to_type(model.input_spec)
  data_type = tff.SequenceType(element_type)
  weights_type = tff.learning.models.weights_type_from_model(model)
  trainable_type = weights_type.trainable
  trainable_specs = tff.types.type_to_tf_tensor_specs(trainable_type)
  num_params = sum(int(np.prod(s.shape)) for s in tf.nest.flatten(trainable_specs))

  hparams_type = tff.StructWithPythonType(
      [('learning_rate', np.float32), ('local_steps', np.int32)], collections.OrderedDict)

  @tff.tensorflow.computation
  def init_stats():
    return recipe.init_stats(list(tf.nest.flatten(trainable_specs)))

  stats_type = init_stats.type_signature.result

  @tff.tensorflow.computation(stats_type)
  def broadcast_fn(stats):
    return recipe.broadcast(stats)

  broadcast_type = broadcast_fn.type_signature.result

  # ---- client ----
  def client_update(model, model_weights, broadcast_value, hparams, dataset):
    variables = tff.learning.models.ModelWeights.from_model(model)
    tf.nest.map_structure(lambda v, t: v.assign(t), variables, model_weights)
    trainable = list(tf.nest.flatten(variables.trainable))
    x_t = [tf.identity(v) for v in trainable]
    lr = hparams['learning_rate']
    steps = hparams['local_steps']
    local = _tuples(recipe.init_local(broadcast_value, x_t))
    g0 = tuple(tf.zeros_like(v) for v in trainable) if recipe.uses_first_gradient else ()
    first_loss = tf.constant(0.0)
    num_examples = tf.constant(0, tf.int64)
    step = tf.constant(0, tf.int32)
    # K > 0: exactly K batches, cycling the data; K <= 0: the dataset as given
    # (the task's E epochs). An iterator loop, not `for batch in dataset`
    # (which autograph lowers to `dataset.reduce`): in TFF's C++ executor the
    # reduce form costs ~3x more per client (bench/results, docs/performance.md).
    steps64 = tf.cast(steps, tf.int64)
    cycle = steps64 > 0
    batches = dataset.repeat(tf.where(cycle, tf.constant(-1, tf.int64), 1)).take(
        tf.where(cycle, steps64, -1))
    if loop_implementation == tff.learning.LoopImplementation.DATASET_ITERATOR:
      batches = iter(batches)
    for batch in batches:
      with tf.GradientTape() as tape:
        output = model.forward_pass(batch, training=True)
      grads = tape.gradient(output.loss, trainable)
      grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
               for g, v in zip(grads, trainable)]
      is_first = tf.equal(step, 0)
      if recipe.uses_first_gradient:
        # A cond, not tf.where: no copy of the model-sized gradient per step.
        g0 = tf.cond(is_first, lambda grads=grads: tuple(grads), lambda g0=g0: g0)
      first_loss = tf.where(is_first, tf.cast(output.loss, tf.float32), first_loss)
      # Tuples throughout: the loop state is tupled (see _tuples) and TFF
      # optimisers insist that weights and state have the same structure.
      local, new_weights = recipe.local_step(local, tuple(tf.identity(v) for v in trainable),
                                             tuple(grads), lr, step)
      local = _tuples(local)
      for v, w in zip(trainable, new_weights):
        v.assign(w)
      num_examples += tf.cast(output.num_examples, tf.int64)
      step += 1
    delta = [a - b for a, b in zip(x_t, trainable)]
    delta, non_finite = _zero_if_non_finite(delta)
    if weighting == tff.learning.ClientWeighting.NUM_EXAMPLES:
      weight = tf.cast(num_examples, tf.float32)
    else:
      weight = tf.constant(1.0)
    weight = tf.where(non_finite, 0.0, weight)
    extra = _as_float32(recipe.upload(local, g0)) if recipe.upload is not None else ()
    delta = tf.nest.pack_sequence_as(variables.trainable, delta)
    client_stats = collections.OrderedDict(
        first_minibatch_loss=first_loss, local_steps=step, num_examples=num_examples)
    if measure_client_drift:
      # Unit vectors only: their sum over clients gives the mean pairwise
      # cosine (accounting/drift.py), so no per-client upload is collected.
      client_stats['drift_delta_sum'], client_stats['drift_delta_n'] = drift.unit_vector(
          tf.nest.flatten(delta))
      client_stats['drift_model_sum'], client_stats['drift_model_n'] = drift.unit_vector(
          [tf.identity(v) for v in trainable])
    return delta, extra, weight, model.report_local_unfinalized_metrics(), client_stats

  # The default aggregation (example-weighted mean) is fused into the round's
  # single federated_sum; any other aggregator or compression is composed.
  fused_mean = (model_aggregator is None and upload_compression is None and
                metrics_aggregator is None)

  server_message_type = tff.StructWithPythonType(
      [('model_weights', weights_type), ('broadcast', broadcast_type),
       ('hparams', hparams_type)], collections.OrderedDict)

  # ---- one client's round: everything summed over clients in one intrinsic ----
  # Each per-client intrinsic is a call in TFF's executor, so the counters
  # (steps, examples, first loss, clients; Σ steps² for FedGBO's equal-K
  # check), the Keras metrics and, on the fused path, w·Δ, w·extra and w
  # travel in one structure through one `federated_sum`. Traced once: the
  # types of Δ and of the extra upload come from it.
  def client_round(model, message, dataset):
    delta, extra, weight, local_metrics, stats = client_update(
        model, message['model_weights'], message['broadcast'], message['hparams'], dataset)
    steps = tf.cast(stats['local_steps'], tf.int64)
    sums = collections.OrderedDict(
        metrics=local_metrics if metrics_aggregator is None else (),
        first_minibatch_loss=stats['first_minibatch_loss'],
        num_examples=stats['num_examples'], local_steps=steps,
        local_steps_squared=steps * steps, clients=tf.constant(1, tf.int64))
    for key in _DRIFT_KEYS if measure_client_drift else ():
      sums[key] = stats[key]
    if not fused_mean:
      return delta, extra, weight, sums, (() if metrics_aggregator is None else local_metrics)
    sums['weighted_delta'] = tf.nest.map_structure(lambda t: t * weight, delta)
    sums['weighted_extra'] = tf.nest.map_structure(lambda t: t * weight, extra)
    sums['weight'] = weight
    return sums

  @tff.tensorflow.computation(server_message_type, data_type)
  def client_round_fn(message, dataset):
    model = client_model(model_fn)  # variables must be created outside the tf.function
    return tf.function(lambda *args: client_round(model, *args))(message, dataset)

  client_result = client_round_fn.type_signature.result
  if fused_mean:
    sums_type = client_result
    delta_type, extra_type = client_result.weighted_delta, client_result.weighted_extra
  else:
    delta_type, extra_type, _, sums_type, local_metrics_type = client_result

  joint_type = tff.StructWithPythonType([('delta', delta_type), ('extra', extra_type)],
                                        collections.OrderedDict)
  if model_aggregator is None:
    model_aggregator = tff.aggregators.MeanFactory()
  if upload_compression is not None:
    weighted = True
    delta_aggregator = upload_compression.create(joint_type, tff.TensorType(np.float32))
  elif weighted:
    delta_aggregator = model_aggregator.create(delta_type, tff.TensorType(np.float32))
  else:
    delta_aggregator = model_aggregator.create(delta_type)
  extra_aggregator = tff.aggregators.MeanFactory().create(extra_type, tff.TensorType(np.float32))
  has_extra = recipe.upload is not None

  # The whole ModelWeights is broadcast (non-trainable weights, e.g. BatchNorm
  # statistics, included); only trainable deltas come back.
  down_bits = _num_bits(weights_type) + _num_bits(broadcast_type) + _num_bits(hparams_type)
  up_payload_bits = _num_bits(delta_type) + (_num_bits(extra_type) if has_extra else 0)
  local_state_type = tff.tensorflow.computation(
      lambda: recipe.init_local(
          _zeros_like_specs(tff.types.type_to_tf_tensor_specs(broadcast_type)),
          _zeros_like_specs(list(tf.nest.flatten(trainable_specs))))
  ).type_signature.result
  # Tensors only: scalar leaves are hyperparameters (η, β) or counters.
  client_state_floats = sum(int(np.prod(t.shape)) for t in _leaves(local_state_type)
                            if t.dtype in (np.float32, np.float64) and len(t.shape) >= 1)
  optimizer_flops_per_step = recipe.optimizer_ops_per_param * num_params

  # ---- server ----
  def server_round(model_weights, stats, hparams, sums, mean_delta, mean_extra,
                   measured_upload_bits):
    checks = []
    if recipe.equal_local_steps:
      # All K_i equal ⇔ n·ΣK_i² = (ΣK_i)² (Cauchy–Schwarz), exact in int64.
      checks.append(tf.debugging.assert_equal(
          sums['clients'] * sums['local_steps_squared'], sums['local_steps'] ** 2,
          message=f'{recipe.name} needs every client to run the same number of local steps K '
                  '(its server step inverts K identical steps); a client ran fewer: '
                  'check for clients with no data'))
    with tf.control_dependencies(checks):
      x = [tf.identity(t) for t in tf.nest.flatten(model_weights.trainable)]
    new_x, new_stats = recipe.server_update(
        x, stats, list(tf.nest.flatten(mean_delta)), mean_extra,
        hparams['learning_rate'], hparams['local_steps'])
    # The containers of s_0 (lists vs tuples): a checkpoint is restored into
    # the structure `initialize` returns and must match it exactly.
    new_stats = tf.nest.pack_sequence_as(stats, tf.nest.flatten(new_stats))
    new_weights = tff.learning.models.ModelWeights(
        trainable=tf.nest.pack_sequence_as(model_weights.trainable, list(new_x)),
        non_trainable=model_weights.non_trainable)

    clients = tf.maximum(tf.cast(sums['clients'], tf.float64), 1.0)
    # A compressing aggregator measures the real encoded size (< 0: none).
    upload_bits = tf.where(measured_upload_bits >= 0, measured_upload_bits,
                           tf.constant(float(up_payload_bits), tf.float64))
    steps = tf.cast(sums['local_steps'], tf.float64)
    cost = collections.OrderedDict(
        download_bits_per_client=tf.constant(float(down_bits), tf.float64),
        upload_bits_per_client=upload_bits,
        download_bits=tf.constant(float(down_bits), tf.float64) * clients,
        upload_bits=upload_bits * clients,
        client_steps=steps)
    if fb_flops_per_example is not None:
      flops = (tf.cast(sums['num_examples'], tf.float64) * fb_flops_per_example +
               steps * optimizer_flops_per_step)
      cost['client_flops'] = flops
      cost['client_flops_per_client'] = flops / clients
    cost['client_optimizer_state_floats'] = tf.constant(float(client_state_floats), tf.float64)
    metrics = collections.OrderedDict(
        first_minibatch_loss=sums['first_minibatch_loss'] / tf.cast(clients, tf.float32),
        cost=cost)
    if metrics_aggregator is None:
      metrics['train'] = collections.OrderedDict(
          (name, finalizer(sums['metrics'][name])) for name, finalizer in finalizers.items())
    if measure_client_drift:
      metrics['client_drift'] = collections.OrderedDict(
          delta_cosine_distance=drift.mean_cosine_distance_from_sum(
              sums['drift_delta_sum'], sums['drift_delta_n']),
          model_cosine_distance=drift.mean_cosine_distance_from_sum(
              sums['drift_model_sum'], sums['drift_model_n']),
          num_clients=sums['drift_delta_n'])
    return new_weights, new_stats, metrics

  if fused_mean:
    @tff.tensorflow.computation(weights_type, stats_type, hparams_type, sums_type)
    def server_round_fn(model_weights, stats, hparams, sums):
      weight_sum = sums['weight']
      mean = lambda t: tf.math.divide_no_nan(t, weight_sum)  # as tff.aggregators.MeanFactory
      return server_round(model_weights, stats, hparams, sums,
                          tf.nest.map_structure(mean, sums['weighted_delta']),
                          tf.nest.map_structure(mean, sums['weighted_extra']),
                          tf.constant(-1.0, tf.float64))
  else:
    @tff.tensorflow.computation(weights_type, stats_type, hparams_type, sums_type, delta_type,
                                extra_type, tff.TensorType(np.float64))
    def server_round_fn(model_weights, stats, hparams, sums, mean_delta, mean_extra,
                        measured_upload_bits):
      return server_round(model_weights, stats, hparams, sums, mean_delta, mean_extra,
                          measured_upload_bits)

  @tff.tensorflow.computation(weights_type, stats_type, hparams_type)
  def server_message_fn(model_weights, stats, hparams):
    return collections.OrderedDict(model_weights=model_weights, broadcast=recipe.broadcast(stats),
                                   hparams=hparams)

  # The extra upload's mean (MeanFactory) keeps no state: a constant, not a
  # part of the process state (whose `aggregator` is `model_aggregator`'s).
  extra_state_type = extra_aggregator.initialize.type_signature.result
  if any(True for _ in _leaves(extra_state_type)):
    raise AssertionError('the extra upload aggregator must be stateless')
  extra_state = _tensor_free_value(extra_state_type)

  initialize_fn = initial_state_computation(model_fn, client_learning_rate, local_steps,
                                            delta_aggregator, init_stats)

  state_type = initialize_fn.type_signature.result
  if fused_mean:
    # MeanFactory's (tensor-free) measurements, so every path reports the same structure.
    no_measurements = _tensor_free_value(delta_aggregator.next.type_signature.result.measurements)

  @tff.federated_computation(state_type, tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(state, client_data):
    stats, hparams = state.finalizer, state.client_work
    message = tff.federated_broadcast(tff.federated_map(
        server_message_fn, (state.global_model_weights, stats, hparams)))
    server_args = (state.global_model_weights, stats, hparams)
    aggregator_state = state.aggregator
    train_metrics = None
    if fused_mean:
      sums = tff.federated_sum(tff.federated_map(client_round_fn, (message, client_data)))
      server = tff.federated_map(server_round_fn, (*server_args, sums))
      measurements = tff.federated_value(no_measurements, tff.SERVER)
    else:
      delta, extra, weight, client_sums, local_metrics = tff.federated_map(
          client_round_fn, (message, client_data))
      if metrics_aggregator is not None:
        train_metrics = metrics_aggregator(finalizers, local_metrics_type)(local_metrics)
      if upload_compression is not None:
        agg = delta_aggregator.next(
            state.aggregator,
            tff.federated_zip(collections.OrderedDict(delta=delta, extra=extra)), weight)
        mean_delta, mean_extra = agg.result.delta, agg.result.extra
        measured_bits = agg.measurements.upload_bits_per_client
      else:
        agg = (delta_aggregator.next(state.aggregator, delta, weight) if weighted
               else delta_aggregator.next(state.aggregator, delta))
        mean_delta = agg.result
        if has_extra:
          mean_extra = extra_aggregator.next(
              tff.federated_value(extra_state, tff.SERVER), extra, weight).result
        else:  # nothing besides Δ goes up: no aggregation of an empty structure
          mean_extra = tff.federated_value((), tff.SERVER)
        measured_bits = tff.federated_value(np.float64(-1.0), tff.SERVER)
      aggregator_state, measurements = agg.state, agg.measurements
      server = tff.federated_map(server_round_fn, (
          *server_args, tff.federated_sum(client_sums), mean_delta, mean_extra, measured_bits))
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

  get_model_weights, set_model_weights = model_weights_fns(state_type.member, weights_type)

  @tff.tensorflow.computation(state_type.member)
  def get_hparams_fn(state):
    server = (recipe.get_server_hparams(state.finalizer) if recipe.get_server_hparams
              else collections.OrderedDict())
    return collections.OrderedDict(client_work=state.client_work, finalizer=server)

  @tff.tensorflow.computation(state_type.member, get_hparams_fn.type_signature.result)
  def set_hparams_fn(state, hparams):
    finalizer = state.finalizer
    if recipe.set_server_hparams:
      finalizer = recipe.set_server_hparams(finalizer, hparams['finalizer'])
      finalizer = tf.nest.pack_sequence_as(state.finalizer, tf.nest.flatten(finalizer))
    return state._replace(client_work=hparams['client_work'], finalizer=finalizer)

  return tff.learning.templates.LearningProcess(
      initialize_fn, next_fn, get_model_weights, set_model_weights,
      get_hparams_fn=get_hparams_fn, set_hparams_fn=set_hparams_fn)


def model_weights_fns(state_type, weights_type):
  """TFF's `get_model_weights` / `set_model_weights` of a LearningAlgorithmState."""

  @tff.tensorflow.computation(state_type)
  def get_model_weights(state):
    return state.global_model_weights

  @tff.tensorflow.computation(state_type, weights_type)
  def set_model_weights(state, weights):
    return state._replace(global_model_weights=weights)

  return get_model_weights, set_model_weights


_MEASURE_CLIENT_DRIFT = contextvars.ContextVar('measure_client_drift', default=False)


@contextlib.contextmanager
def measuring_client_drift(enabled: bool = True):
  """Within the block, `build_process` measures client drift by default.

  Lets a caller (the algorithm registry, for `--measure_client_drift`) switch
  the diagnostic on for every composer-built algorithm without threading an
  argument through each algorithm's builder.
  """
  token = _MEASURE_CLIENT_DRIFT.set(bool(enabled))
  try:
    yield
  finally:
    _MEASURE_CLIENT_DRIFT.reset(token)


def _tuples(structure):
  """Lists → tuples: tf.data loop state would stack a list into one tensor."""
  if isinstance(structure, (list, tuple)):
    return tuple(_tuples(x) for x in structure)
  if isinstance(structure, dict):
    return type(structure)((k, _tuples(v)) for k, v in structure.items())
  return structure


def _zero_if_non_finite(tensors):
  non_finite = tf.logical_not(tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors]))
  return [tf.where(non_finite, tf.zeros_like(t), t) for t in tensors], non_finite


_DRIFT_KEYS = ('drift_delta_sum', 'drift_delta_n', 'drift_model_sum', 'drift_model_n')


def _tensor_free_value(type_spec: tff.Type):
  """The value of a type without tensors (nested empty structures)."""
  if isinstance(type_spec, tff.FederatedType):
    type_spec = type_spec.member
  elements = list(tff.structure.iter_elements(type_spec))
  if all(name for name, _ in elements) and elements:
    return collections.OrderedDict((name, _tensor_free_value(t)) for name, t in elements)
  return tuple(_tensor_free_value(t) for _, t in elements)


def client_model(model_fn: Callable[[], tff.learning.models.VariableModel]):
  """`model_fn()` for a client computation: trainable variables start at zero.

  A client overwrites its trainable variables with the broadcast weights
  before using them, but TFF runs every variable initialiser at each call of
  the client computation: random initialisers (Glorot etc.) cost ~8 ms per
  client per round on the EMNIST CNN (Philox in `perf`, docs/performance.md)
  for values nobody reads. Non-trainable variables (metrics, BatchNorm
  statistics, RNG states) keep their initialisers.
  """
  def zero_trainable(next_creator, **kwargs):
    shape, dtype = kwargs.get('shape'), kwargs.get('dtype')
    if (kwargs.get('trainable') is not False and shape is not None and dtype is not None
        and tf.TensorShape(shape).is_fully_defined()):
      kwargs['initial_value'] = tf.zeros(shape, tf.as_dtype(dtype).base_dtype)
    return next_creator(**kwargs)

  with tf.variable_creator_scope(zero_trainable):
    return model_fn()


def _initial_weights(model_fn):
  model = model_fn()
  return tff.learning.models.ModelWeights.from_model(model)


def initial_state_computation(model_fn, client_learning_rate: float, local_steps: int,
                              aggregator, init_stats) -> tff.Computation:
  """`initialize` of every composer-built (and personalised) process: the state layout above.

  `aggregator` is the Δ aggregation process, `init_stats` the TF computation
  of the recipe's s_0.
  """
  @tff.federated_computation
  def initialize_fn():
    weights = tff.federated_eval(
        tff.tensorflow.computation(lambda: _initial_weights(model_fn)), tff.SERVER)
    return tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        global_model_weights=weights,
        distributor=tff.federated_value((), tff.SERVER),
        client_work=tff.federated_value(collections.OrderedDict(
            learning_rate=np.float32(client_learning_rate),
            local_steps=np.int32(local_steps)), tff.SERVER),
        aggregator=aggregator.initialize(),
        finalizer=tff.federated_eval(init_stats, tff.SERVER)))

  return initialize_fn


def set_round_hparams(state, *, client_learning_rate: Optional[float] = None,
                      local_steps: Optional[int] = None):
  """Returns `state` with this round's η and/or K in `state.client_work`.

  The Python-side twin of `process.set_hparams` for the two client
  hyperparameters (no TFF invocation, so no copy of the whole state through
  the executor): what the round schedules use between rounds.
  """
  work = collections.OrderedDict(state.client_work)
  if client_learning_rate is not None:
    work['learning_rate'] = np.float32(client_learning_rate)
  if local_steps is not None:
    work['local_steps'] = np.int32(local_steps)
  return state._replace(client_work=work)


def runs_local_steps(state_or_type) -> bool:
  """Whether a process with this state (or state type) runs its K steps itself.

  True for the composer's and the personalised processes (K is
  `client_work['local_steps']`, set per round); False for TFF-built ones
  (Mimelite, FedProx), which train on whatever data they are given.
  """
  member = getattr(state_or_type, 'member', state_or_type)
  work = getattr(member, 'client_work', None)
  if isinstance(member, tff.StructType):
    names = [name for name, _ in tff.structure.iter_elements(member)]
    if 'client_work' not in names:
      return False
    work = member.client_work
    return isinstance(work, tff.StructType) and 'local_steps' in [
        name for name, _ in tff.structure.iter_elements(work)]
  return isinstance(work, Mapping) and 'local_steps' in work


def variable_model_fn(model_fn: ModelFn, algorithm: str) -> Callable[[], tff.learning.models.VariableModel]:
  """`model_fn` as a no-arg callable returning a `VariableModel`.

  A `tff.learning.models.FunctionalModel` is wrapped with TFF's
  `model_from_functional`: the composer's client loop runs on variables (it
  assigns the broadcast weights and reads gradients of `forward_pass`), and the
  wrapper computes the same predictions and loss from the same initial
  weights. Its training metrics are TFF's wrapper's (`loss`, `num_examples`);
  the FunctionalModel's own metric functions are not carried over.
  """
  if isinstance(model_fn, tff.learning.models.FunctionalModel):
    functional_model = model_fn
    return lambda: tff.learning.models.model_from_functional(functional_model)
  if not callable(model_fn):
    raise TypeError(f'{algorithm}: model_fn must be a no-arg callable returning a '
                    'tff.learning.models.VariableModel, or a tff.learning.models.FunctionalModel; '
                    f'got {type(model_fn).__name__}')
  return validation.returning_a_model(model_fn, algorithm)
