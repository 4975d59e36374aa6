"""Per-round cost measurements for learning processes built by TFF's builders.

Processes built by our composer measure their own costs. TFF's Mimelite and
FedProx are wrapped instead: `with_cost_metrics` adds the same `cost/...`
measurements, from the `num_examples` / `num_batches` that TFF's training
metrics report, so curves of every algorithm can be drawn against bits and
FLOPs alike. Their bits are measured from TFF types, as the composer measures
its own: the download from the types of what is broadcast, the upload from
`measure_upload`, which reads the client values that the process's `next`
computation actually aggregates (every federated_sum / mean / aggregate call
in its building blocks) and counts the model-sized ones.
"""

import collections
import dataclasses
import warnings
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


def num_trainable_params(process: tff.learning.templates.LearningProcess) -> int:
  weights_type = process.get_model_weights.type_signature.result
  return sum(int(np.prod(t.shape)) for t in _leaves(weights_type.trainable))


def model_weights_bits(process: tff.learning.templates.LearningProcess) -> int:
  """Bits of the whole `ModelWeights` a TFF builder broadcasts (non-trainable too)."""
  weights_type = process.get_model_weights.type_signature.result
  return sum(int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize * 8 for t in _leaves(weights_type))


def trainable_specs(process: tff.learning.templates.LearningProcess) -> list:
  weights_type = process.get_model_weights.type_signature.result
  return [tf.TensorSpec(t.shape, t.dtype) for t in _leaves(weights_type.trainable)]


def count_fb_flops(model: Any, algorithm: str) -> Optional[float]:
  """Forward+backward FLOPs per example of a model, or None (with a warning).

  `model`: a Keras model, a `VariableModel`, a no-arg callable returning one,
  or a `FunctionalModel`. `tff.learning.models.from_keras_model` keeps the Keras
  model it wraps (a private attribute of TFF's wrapper, read defensively),
  which `flops.model_counts` counts. Other models, and Keras layers the
  counter does not know, cannot be counted: the caller then leaves the FLOP
  metrics out rather than report optimiser arithmetic alone as if it were the
  clients' compute.
  """
  from tff_adaptive.accounting import flops  # pylint: disable=g-import-not-at-top
  reason = 'the model does not come from tff.learning.models.from_keras_model'
  if isinstance(model, tf.keras.Model):
    keras_model = model
  else:
    if callable(model) and not isinstance(model, tff.learning.models.VariableModel):
      with tf.Graph().as_default():
        model = model()
    keras_model = getattr(model, '_keras_model', None)
  if isinstance(keras_model, tf.keras.Model):
    try:
      return float(flops.model_counts(keras_model).fb_flops)
    except (NotImplementedError, ValueError, TypeError) as e:
      reason = str(e)
  warnings.warn(f'{algorithm}: client FLOPs are not measured ({reason}); pass '
                'fb_flops_per_example to count them. The cost/client_flops metrics are left out.',
                stacklevel=3)
  return None


def _leaves(type_spec):
  if isinstance(type_spec, tff.TensorType):
    yield type_spec
  else:
    for _, member in tff.structure.iter_elements(type_spec):
      yield from _leaves(member)


# Intrinsics through which client values reach the server; the value each
# client contributes is the argument (or its first element, for the ones that
# take a structure: weighted mean's (value, weight), aggregate's (value, zero,
# accumulate, merge, report), secure sums' (value, bitwidth / modulus)).
_AGGREGATIONS = {
    'federated_sum': False, 'federated_mean': False, 'federated_min': False,
    'federated_max': False, 'federated_secure_sum': True, 'federated_weighted_mean': True,
    'federated_aggregate': True, 'federated_secure_sum_bitwidth': True,
    'federated_secure_modular_sum': True,
}


@dataclasses.dataclass(frozen=True)
class Aggregation:
  """One aggregation of client values found in a computation."""
  intrinsic: str
  value_type: tff.Type  # What one client contributes (unplaced).
  weight_type: Optional[tff.Type] = None  # federated_weighted_mean's weight.

  @property
  def bits(self) -> int:
    return type_bits(self.value_type)


@dataclasses.dataclass(frozen=True)
class UploadMeasurement:
  """What each client sends to be aggregated, read from the computation's types.

  `model_sized` are the aggregated values typed like the trainable weights
  (Δ, a full gradient, a moment, ...): the upload the papers' tables count.
  `other_bits` is everything else that is aggregated: aggregation weights
  (TFF's MeanFactory sums each weight once per weighted mean) and the training
  metrics' sums; like the composer, the upload does not count them.
  """
  model_sized: tuple[Aggregation, ...]
  others: tuple[Aggregation, ...]
  num_params: int

  @property
  def bits(self) -> int:
    return sum(a.bits for a in self.model_sized)

  @property
  def other_bits(self) -> int:
    return sum(a.bits for a in self.others)

  @property
  def multiplier(self) -> int:
    """Number of model-sized values each client uploads (|x| floats each)."""
    return len(self.model_sized)


def type_bits(type_spec: tff.Type) -> int:
  """Exact bits of a value of this TFF type: Σ elements × dtype width."""
  return sum(int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize * 8 for t in _leaves(type_spec))


def client_aggregations(computation) -> list[Aggregation]:
  """Every aggregation of CLIENTS-placed values in `computation`, with its value type."""
  found = []

  def visit(block):
    if (isinstance(block, tff.framework.Call) and isinstance(block.function, tff.framework.Intrinsic)
        and block.function.uri in _AGGREGATIONS):
      arg_type = block.argument.type_signature
      weight = None
      if _AGGREGATIONS[block.function.uri]:
        value = arg_type[0]
        if block.function.uri == 'federated_weighted_mean':
          weight = arg_type[1].member
      else:
        value = arg_type
      if isinstance(value, tff.FederatedType) and value.placement == tff.CLIENTS:
        found.append(Aggregation(block.function.uri, value.member, weight))
    return block, False

  tff.framework.transform_postorder(computation.to_building_block(), visit)
  return found


def _shapes(type_spec) -> list[tuple]:
  return [(np.dtype(t.dtype), tuple(t.shape)) for t in _leaves(type_spec)]


def measure_upload(process: tff.learning.templates.LearningProcess) -> UploadMeasurement:
  """The model-sized client values `process.next` aggregates, from its TFF types.

  A value is model-sized when its tensors have the trainable weights' dtypes
  and shapes, in order (what `process.get_model_weights` returns as
  `trainable`). Raises ValueError if there is none: the upload of such a
  process (e.g. through an encoding aggregator) cannot be read this way.
  """
  trainable = process.get_model_weights.type_signature.result.trainable
  model_shapes = _shapes(trainable)
  aggregations = client_aggregations(process.next)
  is_sized = [_shapes(a.value_type) == model_shapes for a in aggregations]
  sized = tuple(a for a, s in zip(aggregations, is_sized) if s)
  if not sized:
    raise ValueError('no client value typed like the trainable weights is aggregated by '
                     f'this process ({[str(a.value_type) for a in aggregations]})')
  others = tuple(a for a, s in zip(aggregations, is_sized) if not s)
  return UploadMeasurement(sized, others, sum(int(np.prod(s)) for _, s in model_shapes))


def with_cost_metrics(process: tff.learning.templates.LearningProcess, *,
                      download_floats: float, upload_floats: Optional[float] = None,
                      client_state_floats: float, optimizer_flops_per_step: float,
                      fb_flops_per_example: Optional[float],
                      extra_passes: float = 0.0) -> tff.learning.templates.LearningProcess:
  """Returns `process` whose metrics also carry `cost/...` (see composer).

  Args:
    process: a TFF learning process whose metrics have
      `client_work/train/{num_examples,num_batches}`.
    download_floats: floats (32-bit) sent to each client.
    upload_floats: floats (32-bit) each client sends; None (the default):
      `measure_upload(process).bits / 32`, measured from the process's types.
    client_state_floats: client optimiser memory in floats.
    optimizer_flops_per_step: C·|x|.
    fb_flops_per_example: forward+backward FLOPs per example; None: FLOPs
      unknown, the `client_flops*` metrics are left out.
    extra_passes: extra forward+backward passes over the trained examples
      (Mimelite's full-gradient pass: 1).
  """
  if upload_floats is None:
    upload_floats = measure_upload(process).bits / 32
  data_type = process.next.type_signature.parameter[1]

  @tff.tensorflow.computation(data_type.member)
  def one(dataset):
    del dataset
    return np.int32(1)

  @tff.tensorflow.computation(np.int64, np.int64, np.int32)
  def cost_fn(examples, batches, clients):
    clients = tf.maximum(tf.cast(clients, tf.float64), 1.0)
    down, up = 32.0 * download_floats, 32.0 * upload_floats
    cost = collections.OrderedDict(
        download_bits_per_client=tf.constant(down, tf.float64),
        upload_bits_per_client=tf.constant(up, tf.float64),
        download_bits=down * clients, upload_bits=up * clients,
        client_steps=tf.cast(batches, tf.float64))
    if fb_flops_per_example is not None:
      flops = (tf.cast(examples, tf.float64) * fb_flops_per_example * (1.0 + extra_passes) +
               tf.cast(batches, tf.float64) * optimizer_flops_per_step)
      cost['client_flops'] = flops
      cost['client_flops_per_client'] = flops / clients
    cost['client_optimizer_state_floats'] = tf.constant(float(client_state_floats), tf.float64)
    return cost

  @tff.federated_computation(process.next.type_signature.parameter)
  def next_fn(state, client_data):
    output = process.next(state, client_data)
    train = output.metrics.client_work.train
    cost = tff.federated_map(cost_fn, (
        tff.federated_map(_to_int64, train.num_examples),
        tff.federated_map(_to_int64, train.num_batches),
        tff.federated_sum(tff.federated_map(one, client_data))))
    metrics = collections.OrderedDict(
        (name, output.metrics[name]) for name in _names(process.next.type_signature.result[1]))
    metrics['cost'] = cost
    return tff.learning.templates.LearningProcessOutput(output.state, tff.federated_zip(metrics))

  return tff.learning.templates.LearningProcess(
      process.initialize, next_fn, process.get_model_weights, process.set_model_weights,
      get_hparams_fn=getattr(process, 'get_hparams', None),
      set_hparams_fn=getattr(process, 'set_hparams', None))


@tff.tensorflow.computation
def _to_int64(x):
  return tf.cast(x, tf.int64)


def _names(federated_struct_type):
  return [name for name, _ in tff.structure.iter_elements(federated_struct_type.member)]
