"""CE-FedAvg upload compression as a `tff.aggregators` factory (thesis ch. 3).

Each client encodes its upload — top-(1−s) sparsification of every weight
delta of rank ≥ 2 (Golomb-coded indices), optionally UniQ for weight values
and ExpQ for optimiser-state values — and the server averages what it
decodes. The bits of the real encoded message (Golomb bit length, 8 bits per
quantised value, side information) are measured on each client and reported
as `upload_bits_per_client` (mean over clients).

Why a custom factory rather than `tff.aggregators.EncodedSumFactory`:
CE-FedAvg sparsifies Δm and Δv at Δω's indices (independent indices make the
optimiser state diverge, docs/algorithms.md#ce-fedavg), so the three tensors of a parameter must be
encoded together; tensor_encoding encoders see one tensor at a time. The
single-tensor stages are still available for plain FedAvg compression in
`tff_adaptive.compression.encoding_stages`.

It is an upload compression (`base.UPLOAD`: `upload_compression=`): it
aggregates Δ and the extra upload together and measures their bits. In the
cohort program (`InProgram`) each client's encode-then-decode runs inside the
compiled round with the same `encoder`; under `tf.vectorized_map` its TopKV2
and ScatterNd have no vectorising converter, so pfor runs them in a while
loop, client by client (same results, tests/test_cohort_aggregation.py).

Value structure: either a list of weight deltas, or
`OrderedDict(delta=[...], extra=...)` where the list-valued entries of `extra`
that are parallel to `delta` (same length and shapes, e.g. Δm and Δv) share
the delta's indices, and any other entries (e.g. Adam's step counter) are sent
dense as float32.
"""

import collections
import collections.abc

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive import errors
from tff_adaptive.aggregators import base
from tff_adaptive.compression import tf_ops


def _shapes(type_list):
  return [tuple(t.shape) for t in type_list]


class SharedIndexCompressionFactory(base.Aggregator, tff.aggregators.WeightedAggregationFactory):
  """Weighted mean of what the server decodes from each client's encoding."""
  role = base.UPLOAD

  def __init__(self, sparsity: float, quantize: bool = True):
    if not 0.0 <= sparsity < 1.0:
      raise errors.ArgumentError('SharedIndexCompressionFactory', 'sparsity',
                                 f'must be in [0, 1); got {sparsity}')
    self._sparsity = float(sparsity)
    self._quantize = bool(quantize)
    self.tff_factory = self  # its `create` is the per-client process

  def in_program(self, sum_extra: bool) -> base.InProgram:
    return InProgram(self, sum_extra)

  def encoder(self, value_type):
    """One client's encode-then-decode as a TF function of a `value_type` value:
    value → (what the server decodes, float64 bits of the encoded message).

    `create` runs it per client through `federated_map`; the cohort program
    calls it per client inside its compiled round (`InProgram`), so both
    executions encode with the same code.
    """
    joint = isinstance(value_type, tff.StructType) and _names(value_type) == ['delta', 'extra']
    delta_type = value_type['delta'] if joint else value_type
    delta_shapes = _shapes(_members(delta_type))
    extra_type = value_type['extra'] if joint else None
    shared_keys = []
    if joint and isinstance(extra_type, tff.StructType):
      for name, member in tff.structure.iter_elements(extra_type):
        if (isinstance(member, tff.StructType) and len(_members(member)) == len(delta_shapes)
            and _shapes(_members(member)) == delta_shapes):
          shared_keys.append(name)
    sparsity, quantize = self._sparsity, self._quantize

    def encode_decode(value):
      delta = list(tf.nest.flatten(value['delta'] if joint else value))
      extra = value['extra'] if joint else None
      shared = [list(tf.nest.flatten(extra[k])) for k in shared_keys]
      upload = tf_ops.tf_sparsify_quantize(delta, sparsity, quantize, shared_states=shared)
      bits = tf.cast(upload.num_bits, tf.float64)
      if not joint:
        return tf.nest.pack_sequence_as(value, upload.weights), bits
      new_extra = collections.OrderedDict()
      for name in _names(extra_type) if isinstance(extra_type, tff.StructType) else []:
        if name in shared_keys:
          new_extra[name] = tf.nest.pack_sequence_as(
              extra[name], upload.states[shared_keys.index(name)])
        else:  # dense float32
          new_extra[name] = extra[name]
          bits += 32.0 * sum(float(np.prod(t.shape)) for t in tf.nest.flatten(extra[name]))
      decoded = collections.OrderedDict(
          delta=tf.nest.pack_sequence_as(value['delta'], upload.weights), extra=new_extra)
      return decoded, bits

    return encode_decode

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    encode_decode = tff.tensorflow.computation(self.encoder(value_type), value_type)

    mean = tff.aggregators.MeanFactory().create(value_type, weight_type)

    @tff.federated_computation
    def initialize():
      return mean.initialize()

    @tff.federated_computation(initialize.type_signature.result,
                               tff.FederatedType(value_type, tff.CLIENTS),
                               tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      decoded, bits = tff.federated_map(encode_decode, value)
      out = mean.next(state, decoded, weight)
      measurements = tff.federated_zip(collections.OrderedDict(
          mean=out.measurements, upload_bits_per_client=tff.federated_mean(bits)))
      return tff.templates.MeasuredProcessOutput(out.state, out.result, measurements)

    return tff.templates.AggregationProcess(initialize, next_fn)


class InProgram(base.InProgram):
  """Each client's (Δ, extra) encoded and decoded by the factory's own
  `encoder` inside the program, then the client-weighted mean of the decoded
  values (Δ and extra alike, as `create`'s MeanFactory does: a summed extra
  upload is averaged too), and the encoded bits averaged over clients
  (`upload_bits_per_client`)."""
  not_in_population = 'CE-FedAvg compression has no population form yet (the mean has)'

  def __init__(self, aggregator: SharedIndexCompressionFactory, sum_extra: bool):
    del sum_extra  # averaged, as `create` averages it
    super().__init__(aggregator, sum_extra=False)

  def client_part(self, delta, extra, params):
    del params
    value = collections.OrderedDict(delta=delta, extra=extra)
    value_type = tff.types.tensorflow_to_type(
        tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), value))
    decoded, bits = self.aggregator.encoder(value_type)(value)
    if isinstance(extra, collections.abc.Mapping):
      extra = type(extra)((name, decoded['extra'][name]) for name in extra)
    return decoded['delta'], extra, {'upload_bits': bits}

  def means(self, sums):
    mean = lambda t: tf.math.divide_no_nan(t, sums['weight'])
    bits = sums['upload_bits'] / tf.cast(sums['clients'], tf.float64)
    return (tf.nest.map_structure(mean, sums['weighted_delta']),
            tf.nest.map_structure(mean, sums['weighted_extra']), bits)

  def measurements(self, placement, process, round_metrics):
    no_mean_measurements = base.tensor_free_value(
        process.next.type_signature.result.measurements.member.mean)
    return placement.zip(collections.OrderedDict(
        mean=placement.value(no_mean_measurements),
        upload_bits_per_client=round_metrics['cost']['upload_bits_per_client']))


def _members(type_spec):
  if isinstance(type_spec, tff.TensorType):
    return [type_spec]
  out = []
  for _, member in tff.structure.iter_elements(type_spec):
    out.extend(_members(member))
  return out


def _names(struct_type):
  return [name for name, _ in tff.structure.iter_elements(struct_type)]
