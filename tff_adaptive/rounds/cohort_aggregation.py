"""How the cohort program aggregates Δ: the fused mean, fixed-clip DP, CE-FedAvg.

The per-client round hands Δ to a `tff.aggregators` process, which runs its
client part per client (`federated_map`) and its server part once. The cohort
program has no per-client TFF calls, so each supported aggregator is written
here as those two parts:

  client_sums(result, metrics)   per client, inside the compiled program
                                 (vectorised or in sequence, like the training)
  server(...)                    once per round, on Σ over clients of those sums

with the same arithmetic as the TFF process the per-client round uses, whose
`initialize` (and so the state layout) both executions share:

  Mean         Σ w·Δ / Σ w                       (tff.aggregators.MeanFactory)
  FixedDP      (Σ clip_C(Δ_i) + N(0, (σC)²)) / clients_per_round
               (DifferentiallyPrivateFactory.gaussian_fixed: tensorflow_privacy's
               GaussianSumQuery inside a NormalizedQuery)
  Compression  Σ w·decode(encode(Δ_i, extra_i)) / Σ w, bits: mean over clients
               (aggregators.compression.SharedIndexCompressionFactory)

Any other aggregator runs per client (`cohort.unsupported_reason`).

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

from tff_adaptive.accounting import privacy
from tff_adaptive.aggregators import compression
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
  if aggregator is not None and not isinstance(aggregator, privacy.GaussianFixedFactory):
    return f'the aggregator {type(aggregator).__name__} runs per client'
  return None


def for_options(options: options_lib.RoundOptions, recipe):
  if options.upload_compression is not None:
    return Compression(options.upload_compression)
  if options.model_aggregator is not None:
    return FixedDP(options.model_aggregator, recipe.sum_extra)
  return Mean(recipe.sum_extra)


class Mean:
  """The fused example-weighted (or uniform) mean: what the default per-client
  round's single `federated_sum` computes."""

  def __init__(self, sum_extra: bool):
    self.sum_extra = sum_extra

  def client_sums(self, result: client_lib.ClientResult, metrics, delta_structure):
    sums, _ = client_lib.client_sums(result, metrics, fused_mean=True,
                                     delta_structure=delta_structure, summed_extra=self.sum_extra)
    return sums

  def create(self, sums_type) -> tff.templates.AggregationProcess:
    """The TFF process whose `initialize` gives the state's `aggregator` member."""
    return tff.aggregators.MeanFactory().create(sums_type.weighted_delta,
                                                tff.TensorType(np.float32))

  def server(self, server_round, model_weights, stats, hparams, sums):
    return server_round.from_weighted_sums(model_weights, stats, hparams, sums)

  # The process keeps no state and measures nothing: both stay as they are.
  def next_state(self, aggregator_state):
    return aggregator_state

  def next_state_in_process(self, aggregator_state):
    return aggregator_state

  def measurements(self, process, server_metrics):
    del server_metrics
    return tff.federated_value(self.no_measurements(process), tff.SERVER)

  def measurements_in_process(self, process, server_metrics):
    del server_metrics
    return self.no_measurements(process)

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

  def client_sums(self, result, metrics, delta_structure):
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
  def next_state(self, aggregator_state):
    return tff.federated_zip(tff_dp.DPAggregatorState(
        aggregator_state.query_state, aggregator_state.agg_state, aggregator_state.dp_event,
        tff.federated_value(False, tff.SERVER)))

  def next_state_in_process(self, aggregator_state):
    return aggregator_state._replace(is_init_state=np.False_)


class Compression(Mean):
  """`SharedIndexCompressionFactory`: each client's (Δ, extra) encoded and
  decoded by the factory's own `encoder` inside the program, then the
  client-weighted mean of the decoded values (Δ and extra alike, as the
  factory's MeanFactory does: a summed extra upload is averaged too), and the
  encoded bits averaged over clients (`upload_bits_per_client`)."""

  def __init__(self, factory: compression.SharedIndexCompressionFactory):
    super().__init__(sum_extra=False)
    self.factory = factory

  def client_sums(self, result, metrics, delta_structure):
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

  def measurements(self, process, server_metrics):
    return tff.federated_zip(collections.OrderedDict(
        mean=tff.federated_value(self._no_mean_measurements(process), tff.SERVER),
        upload_bits_per_client=server_metrics.cost.upload_bits_per_client))

  def measurements_in_process(self, process, server_metrics):
    return collections.OrderedDict(
        mean=self._no_mean_measurements(process),
        upload_bits_per_client=server_metrics['cost']['upload_bits_per_client'])

  @staticmethod
  def _no_mean_measurements(process):
    return layout.tensor_free_value(process.next.type_signature.result.measurements.member.mean)
