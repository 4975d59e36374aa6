"""How the cohort program aggregates Δ: the mean, fixed-clip DP, CE-FedAvg, robust.

The per-client round hands Δ to a `tff.aggregators` process, which runs its
client part per client (`federated_map`) and its server part once. The cohort
program has no per-client TFF calls, so each supported aggregator is written
here as those two parts:

  client_params(state)           once per round, before the clients: what the
                                 clients need of the aggregator's state (robust:
                                 the norms), sent with the model
  client_sums(result, metrics)   per client, inside the compiled program
                                 (vectorised or in sequence, like the training)
  server(...)                    once per round, on Σ over clients of those sums
  after_round(...)               once per round: the aggregator's new state and
                                 its measurements (robust: from Σ of the sums)

with the same arithmetic as the TFF process the per-client round uses, whose
`initialize` (and so the state layout) both executions share:

  Mean         Σ w·Δ / Σ w                       (tff.aggregators.MeanFactory)
  FixedDP      (Σ clip_C(Δ_i) + N(0, (σC)²)) / clients_per_round
               (DifferentiallyPrivateFactory.gaussian_fixed: tensorflow_privacy's
               GaussianSumQuery inside a NormalizedQuery)
  Compression  Σ w·decode(encode(Δ_i, extra_i)) / Σ w, bits: mean over clients
               (aggregators.compression.SharedIndexCompressionFactory)
  Robust       TFF's adaptive zeroing (‖Δ_i‖_∞ > Z: Δ_i := 0, its weight kept) and
               clipping (‖Δ_i‖_2 > C: Δ_i scaled to C), then the (un)weighted mean;
               Z and C move by tensorflow_privacy's no-noise quantile queries
               (aggregators.robust.robust_aggregator: tff.learning.robust_aggregator)

Any other aggregator (TFF's secure aggregator, a factory from
`tff.learning.robust_aggregator` itself, ...) runs per client
(`cohort.unsupported_reason`).

Under `tf.vectorized_map` the compression encoder's TopKV2 and ScatterNd have
no vectorising converter: pfor runs them in a while loop, client by client,
inside the vectorised program (same results, tests/test_cohort_aggregation.py).
"""

import collections
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
# The DP process's state container: the cohort round must return the same one.
from tensorflow_federated.python.aggregators import differential_privacy as tff_dp
# TFF's clipping arithmetic and count dtype: the cohort's zeroing and clipping are theirs.
from tensorflow_federated.python.aggregators import robust as tff_robust
import tensorflow_privacy as tfp

from tff_adaptive.accounting import privacy
from tff_adaptive.aggregators import compression
from tff_adaptive.aggregators import robust
from tff_adaptive.rounds import client as client_lib
from tff_adaptive.rounds import layout
from tff_adaptive.rounds import options as options_lib

_NO_BITS = -1.0  # `RoundCosts.metrics`: no measured upload, count the dense payload


def supported(options: options_lib.RoundOptions) -> Optional[str]:
  """None if the cohort program aggregates as `options` asks, else why not."""
  if options.upload_compression is not None and not isinstance(
      options.upload_compression, compression.SharedIndexCompressionFactory):
    return (f'the upload compression {type(options.upload_compression).__name__} runs per '
            'client')
  aggregator = options.model_aggregator
  if aggregator is not None and not isinstance(
      aggregator, (privacy.GaussianFixedFactory, robust.RobustFactory)):
    return f'the aggregator {type(aggregator).__name__} runs per client'
  return None


def for_options(options: options_lib.RoundOptions, recipe):
  if options.upload_compression is not None:
    return Compression(options.upload_compression)
  if isinstance(options.model_aggregator, robust.RobustFactory):
    return Robust(options.model_aggregator, recipe.sum_extra)
  if options.model_aggregator is not None:
    return FixedDP(options.model_aggregator, recipe.sum_extra)
  return Mean(recipe.sum_extra)


class Mean:
  """The fused example-weighted (or uniform) mean: what the default per-client
  round's single `federated_sum` computes."""

  def __init__(self, sum_extra: bool):
    self.sum_extra = sum_extra

  def client_params_type(self):
    """The TFF type of `client_params` (None: the clients need nothing of the state)."""
    return None

  def client_sums(self, result: client_lib.ClientResult, metrics, delta_structure, params=None):
    del params
    sums, _ = client_lib.client_sums(result, metrics, fused_mean=True,
                                     delta_structure=delta_structure, summed_extra=self.sum_extra)
    return sums

  def create(self, sums_type) -> tff.templates.AggregationProcess:
    """The TFF process whose `initialize` gives the state's `aggregator` member."""
    return tff.aggregators.MeanFactory().create(sums_type.weighted_delta,
                                                tff.TensorType(np.float32))

  def server(self, server_round, model_weights, stats, hparams, sums):
    return server_round.from_weighted_sums(model_weights, stats, hparams, sums)

  def after_round(self, placement, process, aggregator_state, sums, round_metrics):
    """(the aggregator's new state, its measurements), placed as the round's
    steps are (`skeleton.Placement`: at SERVER, or in this process in TFF's
    Python containers)."""
    del sums
    return (self.next_state(placement, aggregator_state),
            self.measurements(placement, process, round_metrics))

  # The process keeps no state and measures nothing: both stay as they are.
  def next_state(self, placement, aggregator_state):
    del placement
    return aggregator_state

  def measurements(self, placement, process, round_metrics):
    del round_metrics
    return placement.value(self.no_measurements(process))

  @staticmethod
  def no_measurements(process):
    return layout.tensor_free_value(process.next.type_signature.result.measurements)


class FixedDP(Mean):
  """`DifferentiallyPrivateFactory.gaussian_fixed` (`privacy.dp_aggregator`).

  Per client, GaussianSumQuery.preprocess_record: Δ_i clipped to global L2
  norm C over all trainable tensors (`tf.clip_by_global_norm`). Summed
  unweighted (the round's weighting is uniform, `RoundOptions.weighting_for`;
  a dropped client's Δ is already zero). At the server, once per round:
  GaussianSumQuery.get_noised_result adds N(0, (σC)²) to every coordinate of
  the sum, NormalizedQuery divides by clients_per_round (a constant, not the
  cohort's size). The extra upload is averaged as in the per-client round.
  """

  def __init__(self, factory: privacy.GaussianFixedFactory, sum_extra: bool):
    super().__init__(sum_extra)
    self.factory = factory
    # The float32 values of the query's global state (GaussianSumQuery and
    # NormalizedQuery cast the Python numbers the same way).
    self.clip = np.float32(factory.clip_norm)
    self.stddev = np.float32(factory.clip_norm * factory.noise_multiplier)
    self.denominator = np.float32(factory.clients_per_round)

  def client_sums(self, result, metrics, delta_structure, params=None):
    clipped, _ = tf.clip_by_global_norm(list(result.delta), self.clip)
    sums = super().client_sums(result._replace(delta=clipped), metrics, delta_structure)
    sums['weighted_delta'] = tf.nest.pack_sequence_as(delta_structure, clipped)  # unweighted
    return sums

  def create(self, sums_type):
    return self.factory.create(sums_type.weighted_delta)

  def server(self, server_round, model_weights, stats, hparams, sums):
    # TFF's expressions (tensorflow_privacy 0.9 gaussian_query / normalized_query).
    random_normal = tf.random_normal_initializer(stddev=self.stddev)
    noised = tf.nest.map_structure(
        lambda v: v + tf.cast(random_normal(tf.shape(v)), v.dtype), sums['weighted_delta'])
    mean_delta = tf.nest.map_structure(
        lambda v: tf.truediv(v, tf.cast(self.denominator, v.dtype)), noised)
    return server_round(model_weights, stats, hparams, sums, mean_delta,
                        server_round.mean_extra(sums), tf.constant(_NO_BITS, tf.float64))

  # The query's state does not change (fixed clip, constant DP event): as the
  # TFF process, the round only marks the state as no longer the initial one.
  def next_state(self, placement, aggregator_state):
    # np.False_ in process: the value TFF's own round returns there.
    not_initial = placement.value(np.False_ if placement.in_process else False)
    return placement.zip(tff_dp.DPAggregatorState(
        aggregator_state.query_state, aggregator_state.agg_state, aggregator_state.dp_event,
        not_initial))


class Compression(Mean):
  """`SharedIndexCompressionFactory`: each client's (Δ, extra) encoded and
  decoded by the factory's own `encoder` inside the program, then the
  client-weighted mean of the decoded values (Δ and extra alike, as the
  factory's MeanFactory does: a summed extra upload is averaged too), and the
  encoded bits averaged over clients (`upload_bits_per_client`)."""

  def __init__(self, factory: compression.SharedIndexCompressionFactory):
    super().__init__(sum_extra=False)
    self.factory = factory

  def client_sums(self, result, metrics, delta_structure, params=None):
    value = collections.OrderedDict(
        delta=tf.nest.pack_sequence_as(delta_structure, list(result.delta)), extra=result.extra)
    value_type = tff.types.tensorflow_to_type(
        tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), value))
    decoded, bits = self.factory.encoder(value_type)(value)
    extra = result.extra
    if isinstance(extra, collections.abc.Mapping):
      extra = type(extra)((name, decoded['extra'][name]) for name in extra)
    sums = super().client_sums(
        result._replace(delta=tf.nest.flatten(decoded['delta']), extra=extra), metrics,
        delta_structure)
    sums['upload_bits'] = bits
    return sums

  def create(self, sums_type):
    joint_type = tff.StructWithPythonType(
        [('delta', sums_type.weighted_delta), ('extra', sums_type.weighted_extra)],
        collections.OrderedDict)
    return self.factory.create(joint_type, tff.TensorType(np.float32))

  def server(self, server_round, model_weights, stats, hparams, sums):
    mean = lambda t: tf.math.divide_no_nan(t, sums['weight'])
    bits = sums['upload_bits'] / tf.cast(sums['clients'], tf.float64)
    return server_round(model_weights, stats, hparams, sums,
                        tf.nest.map_structure(mean, sums['weighted_delta']),
                        tf.nest.map_structure(mean, sums['weighted_extra']), bits)

  def measurements(self, placement, process, round_metrics):
    return placement.zip(collections.OrderedDict(
        mean=placement.value(self._no_mean_measurements(process)),
        upload_bits_per_client=round_metrics['cost']['upload_bits_per_client']))

  @staticmethod
  def _no_mean_measurements(process):
    return layout.tensor_free_value(process.next.type_signature.result.measurements.member.mean)


class Robust(Mean):
  """`aggregators.robust.robust_aggregator`: TFF's zeroing and clipping factories
  (`tff.aggregators.zeroing_factory` around `clipping_factory` around the mean),
  each with a no-noise `PrivateQuantileEstimationProcess` as its norm.

  Before the clients, per norm (outermost first), as the process's `report`
  and its query's `derive_sample_params`: the norm N = multiplier·estimate +
  increment and the query's sample params, broadcast with the model.
  Per client, inside the program, as TFF's `zero_fn` / `clip_fn` (their
  tf.cond as a select, `_select`):
    zeroing   n = ‖v‖_∞; n > N: v := 0 (the weight stays)   zeroed_count += [n > N]
    clipping  n = ‖v‖_2 (of the zeroed v); v := v·N/n if n > N  clipped_count += [n > N]
    each norm: the query's preprocess_record(params, n), a sum over clients
  then summed as the mean sums them: Σ w·v, Σ w (uniform weights are 1, so
  Σ v and the client count of `UnweightedMeanFactory`).
  Once per round at the server: Σ w·v / Σ w (`tf.math.divide`, MeanFactory's
  and UnweightedMeanFactory's), each query's get_noised_result(Σ records,
  state) gives the next estimate; the measurements are the norms used and
  the counts, nested as TFF's (zeroing/clipping/mean).
  """

  def __init__(self, factory: robust.RobustFactory, sum_extra: bool):
    super().__init__(sum_extra)
    self.factory = factory
    self.norms = factory.norms
    # The very query `PrivateQuantileEstimationProcess.no_noise` builds.
    self.queries = [tfp.NoPrivacyQuantileEstimatorQuery(
        n.initial_estimate, n.target_quantile, n.learning_rate, geometric_update=True)
                    for n in self.norms]
    self._mean_measurements = None  # set by `create`
    self._update_in_process = tf.function(self.update)

  def create(self, sums_type):
    if self.factory.weighted:
      process = self.factory.create(sums_type.weighted_delta, tff.TensorType(np.float32))
    else:
      process = self.factory.create(sums_type.weighted_delta)
    # The mean's measurements (tensor-free) inside the norms' ones.
    inner = process.next.type_signature.result.measurements.member
    for norm in self.norms:
      inner = inner[norm.prefix + 'ing']
    self._mean_measurements = layout.tensor_free_value(inner)
    return process

  def query_states(self, aggregator_state):
    """The norms' query states, outermost first, from the nested process state."""
    states = []
    for norm in self.norms:
      states.append(aggregator_state[norm.prefix + 'ing_norm'][0])
      aggregator_state = aggregator_state['inner_agg']
    return states

  def client_params(self, aggregator_state):
    return self._params(self.query_states(aggregator_state))

  def client_params_type(self):
    if not self.norms:  # zeroing=False, clipping=False: TFF's plain mean
      return None
    return tff.tensorflow.computation(
        lambda: self._params([q.initial_global_state() for q in self.queries])
    ).type_signature.result

  def _params(self, query_states):
    return collections.OrderedDict(
        (norm.prefix, collections.OrderedDict(
            norm=_report(norm, state), sample=query.derive_sample_params(state)))
        for norm, query, state in zip(self.norms, self.queries, query_states))

  def client_sums(self, result, metrics, delta_structure, params=None):
    value = tf.nest.pack_sequence_as(delta_structure, list(result.delta))
    records = collections.OrderedDict()
    for norm, query in zip(self.norms, self.queries):
      bound = params[norm.prefix]
      apply = _zero if norm.prefix == robust.ZEROING.prefix else _clip
      value, global_norm, count = apply(value, bound['norm'])
      records[norm.prefix] = collections.OrderedDict(
          record=query.preprocess_record(bound['sample'], global_norm), count=count)
    sums = super().client_sums(result._replace(delta=tf.nest.flatten(value)), metrics,
                               delta_structure)
    sums['robust'] = records
    return sums

  def server(self, server_round, model_weights, stats, hparams, sums):
    total = sums['weight'] if self.factory.weighted else sums['clients']
    mean_delta = tf.nest.map_structure(lambda v: tf.math.divide(v, tf.cast(total, v.dtype)),
                                       sums['weighted_delta'])
    return server_round(model_weights, stats, hparams, sums, mean_delta,
                        server_round.mean_extra(sums), tf.constant(_NO_BITS, tf.float64))

  def update(self, aggregator_state, sums):
    """(the new state, the measurements) from the state and the round's sums."""
    new_states, measured = [], []
    for norm, query, state in zip(self.norms, self.queries, self.query_states(aggregator_state)):
      summed = sums['robust'][norm.prefix]
      _, new_state, _ = query.get_noised_result(summed['record'], state)
      new_states.append(new_state)
      measured.append((_report(norm, state), summed['count']))
    return (_with_query_states(aggregator_state, self.norms, new_states),
            self._measurements(measured))

  def after_round(self, placement, process, aggregator_state, sums, round_metrics):
    del process, round_metrics
    if placement.in_process:
      new_state, measurements = self._update_in_process(
          tf.nest.map_structure(tf.convert_to_tensor, aggregator_state), sums)
      as_numpy = lambda like, tensors: tf.nest.pack_sequence_as(
          like, [t.numpy() for t in tf.nest.flatten(tensors)])
      return (as_numpy(aggregator_state, new_state),
              tf.nest.map_structure(np.asarray, measurements))
    update = tff.tensorflow.computation(self.update, aggregator_state.type_signature.member,
                                        sums.type_signature.member)
    new_state, measurements = tff.federated_map(update, (aggregator_state, sums))
    return new_state, measurements

  def _measurements(self, measured):
    """TFF's nesting: OrderedDict(zeroing=OrderedDict(clipping=<the mean's>,
    clipping_norm, clipped_count), zeroing_norm, zeroed_count)."""
    measurements = self._mean_measurements
    for norm, (reported, count) in reversed(list(zip(self.norms, measured))):
      measurements = collections.OrderedDict([
          (norm.prefix + 'ing', measurements), (norm.prefix + 'ing_norm', reported),
          (norm.prefix + 'ed_count', count)])
    return measurements


def _report(norm: robust.NormEstimate, query_state):
  """The norm process's `report`: `no_noise` maps it affinely only when not 1·C + 0."""
  if norm.multiplier == 1.0 and norm.increment == 0.0:
    return query_state.current_estimate
  return norm.multiplier * query_state.current_estimate + norm.increment


def _zero(value, zeroing_norm):
  """TFF's `zeroing_factory` zero_fn (norm_order inf, robust_aggregator's)."""
  global_norm = tf.reduce_max(tf.stack(
      [tf.cast(_norm(a, np.inf), tf.float32) for a in tf.nest.flatten(value)]))
  should_zero = global_norm > zeroing_norm
  zeroed = _select(should_zero, tf.nest.map_structure(tf.zeros_like, value), value)
  return zeroed, global_norm, tf.cast(should_zero, tff_robust.COUNT_TF_TYPE)


def _clip(value, clipping_norm):
  """TFF's `clipping_factory` clip_fn (`_clip_by_global_l2_norm`)."""
  global_norm = tf.math.sqrt(tf.reduce_sum(tf.stack(
      [tf.cast(_norm(a, 2) ** 2, tf.float32) for a in tf.nest.flatten(value)])))
  clipped = _select(
      tf.math.greater(global_norm, clipping_norm),
      tff_robust._do_clip_by_global_l2_norm(  # pylint: disable=protected-access
          value, clipping_norm, global_norm), value)
  return clipped, global_norm, tf.cast(global_norm > clipping_norm, tff_robust.COUNT_TF_TYPE)


def _select(condition, if_true, if_false):
  """TFF's `tf.cond(condition, ...)` as a select of both (cheap) branches: under
  tf.vectorized_map a cond on a per-client condition becomes a dynamic
  partition of the clients, which XLA cannot compile."""
  return tf.nest.map_structure(lambda a, b: tf.where(condition, a, b), if_true, if_false)


def _norm(tensor, order):
  """`tf.norm(tensor, ord=order)` as TFF's global norms call it, over the flattened
  tensor (the same reduction) and squeezing only that axis: tf.norm's
  squeeze(axis=None) also removes the client axis of a shard of one client
  under tf.vectorized_map."""
  return tf.norm(tf.reshape(tensor, [-1]), ord=order, axis=0)


def _with_query_states(aggregator_state, norms, new_states):
  """`aggregator_state` with the norms' query states replaced, containers kept."""
  if not norms:
    return aggregator_state
  key = norms[0].prefix + 'ing_norm'
  state = collections.OrderedDict(aggregator_state)
  state[key] = (new_states[0],) + tuple(aggregator_state[key][1:])
  state['inner_agg'] = _with_query_states(aggregator_state['inner_agg'], norms[1:],
                                          new_states[1:])
  return state

