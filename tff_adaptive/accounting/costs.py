"""Costs read from models and TFF types.

`count_fb_flops` gives the forward+backward FLOPs per example of a model, from
which the composer's processes (`rounds/model_info.py`) and FedMAX count
their clients' compute. `measure_upload` reads the client values a process's
`next` computation aggregates (every federated_sum / mean / aggregate call in
its building blocks) and counts the model-sized ones: the upload of a process
built by TFF's own builders, measured from its types.
"""

import dataclasses
import warnings
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


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
