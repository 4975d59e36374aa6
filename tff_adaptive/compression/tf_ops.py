"""TensorFlow twins of the CE-FedAvg encoders, usable in `tff.tf_computation`.

Implements the client-side compression of thesis chapter 3 (its
Algorithm 2 lines 28-34, Algorithms 3-4; docs/algorithms.md#ce-fedavg) in graph-mode TF so
a TFF client can upload exactly what the server would decode:
`tf_sparsify_quantize` returns the lossy (decoded) weight and state deltas
and the exact number of bits of the corresponding encoded message.

Every function here follows its NumPy reference (`sparsify`, `quantizers`,
`golomb`, `codec`) operation by operation (UniQ's bin arithmetic and ExpQ's
logarithms and powers in float64, written so that graph-mode rewrites such as
x / c -> x * (1 / c) or fused multiply-add cannot change a result). The tests
check, in graph mode, that indices, codes, side information, decoded values
and bit counts agree exactly with the NumPy encoder; all choices are
documented in those modules. The transcendental functions of TF and NumPy
(ln, pow in float64) could in principle differ by an ulp, which would only
matter for a value within ~1e-15 (relative) of an ExpQ rounding boundary.

Shapes must be fully known at trace time: k = ceil((1 - s) n) is a Python
integer, so every output has a static shape.
"""

from typing import NamedTuple, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_adaptive.compression import codec
from tff_adaptive.compression import golomb
from tff_adaptive.compression import quantizers
from tff_adaptive.compression import sparsify as sparsify_lib

_LEVELS = 127


def tf_sanitize(x: tf.Tensor) -> tf.Tensor:
  """float32 with non-finite entries replaced by 0."""
  x = tf.cast(x, tf.float32)
  return tf.where(tf.math.is_finite(x), x, tf.zeros_like(x))


def _static_num_elements(x: tf.Tensor) -> int:
  if not x.shape.is_fully_defined():
    raise ValueError(f'Compression needs a static shape, got {x.shape}.')
  return int(x.shape.num_elements())


def tf_top_k_indices(flat: tf.Tensor, k: int) -> tf.Tensor:
  """Sorted int64 indices of the k largest |flat| (ties: lower index)."""
  # tf.math.top_k is stable (equal values keep index order), which matches
  # the NumPy stable argsort.
  _, indices = tf.math.top_k(tf.abs(flat), k=k, sorted=True)
  return tf.sort(tf.cast(indices, tf.int64))


def _side_range(a, mask):
  inf = tf.constant(np.inf, tf.float32)
  lo = tf.reduce_min(tf.where(mask, a, inf))
  hi = tf.reduce_max(tf.where(mask, a, -inf))
  present = tf.reduce_any(mask)
  zero = tf.constant(0.0, tf.float32)
  return tf.where(present, lo, zero), tf.where(present, hi, zero)


def _uniform_bins(a, lo, hi):
  lo64, hi64 = tf.cast(lo, tf.float64), tf.cast(hi, tf.float64)
  span = hi64 - lo64
  # The division by a zero span is discarded by the where.
  scale = tf.where(span > 0, tf.constant(float(_LEVELS), tf.float64) / span,
                   tf.constant(0.0, tf.float64))
  scaled = (tf.cast(a, tf.float64) - lo64) * scale
  bins = tf.clip_by_value(tf.floor(scaled), 0.0, float(_LEVELS))
  bins = tf.where(a >= hi, tf.constant(float(_LEVELS), tf.float64), bins)
  return tf.cast(bins, tf.uint8)


def tf_uniq_encode(a: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """UniQ: flat uint8 codes and float32[4] (lz_min, lz_max, gz_min, gz_max)."""
  a = tf.reshape(tf_sanitize(a), [-1])
  negative = a < 0
  lz_min, lz_max = _side_range(a, negative)
  gz_min, gz_max = _side_range(a, tf.logical_not(negative))
  codes = tf.where(negative, _uniform_bins(a, lz_min, lz_max),
                   tf.constant(128, tf.uint8) + _uniform_bins(a, gz_min,
                                                              gz_max))
  return codes, tf.stack([lz_min, lz_max, gz_min, gz_max])


def _uniform_dequantize(k, lo, hi):
  # Not (hi - lo) / 127: constant folding would turn that into a multiply by
  # the reciprocal in graph mode only; this is the same in eager, graph and
  # NumPy.
  step = (hi - lo) * tf.constant(1.0 / _LEVELS, tf.float32)
  # Exact product in float64, so a fused multiply-add rounds the same way.
  values = tf.cast(
      tf.cast(k, tf.float64) * tf.cast(step, tf.float64) +
      tf.cast(lo, tf.float64), tf.float32)
  return tf.where(tf.equal(k, _LEVELS), tf.fill(tf.shape(values), hi), values)


def tf_uniq_decode(codes: tf.Tensor, side: tf.Tensor) -> tf.Tensor:
  """Inverse of `tf_uniq_encode`."""
  codes = tf.cast(codes, tf.int32)
  side = tf.cast(side, tf.float32)
  negative = codes < 128
  neg = _uniform_dequantize(codes, side[0], side[1])
  pos = _uniform_dequantize(codes - 128, side[2], side[3])
  return tf.where(negative, neg, pos)


def tf_expq_encode(a: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """ExpQ: flat uint8 codes and the float32 base b."""
  a = tf.reshape(tf_sanitize(a), [-1])
  magnitudes = tf.abs(a)
  nonzero = magnitudes > 0
  inf = tf.constant(np.inf, tf.float32)
  delta = tf.reduce_min(tf.where(nonzero, magnitudes, inf))
  delta = tf.minimum(delta, tf.constant(quantizers.EXPQ_MAX_DELTA, tf.float32))
  base = tf.cast(
      tf.pow(tf.cast(delta, tf.float64),
             tf.constant(-1.0 / _LEVELS, tf.float64)), tf.float32)
  log_base = tf.math.log(tf.cast(base, tf.float64))
  safe = tf.where(nonzero, tf.cast(magnitudes, tf.float64),
                  tf.ones_like(magnitudes, tf.float64))
  exponents = tf.round(tf.math.log(safe) / log_base)  # Half to even.
  levels = tf.cast(-tf.clip_by_value(exponents, -float(_LEVELS), -1.0),
                   tf.uint8)
  codes = tf.where(a < 0, levels, tf.constant(128, tf.uint8) + levels)
  codes = tf.where(nonzero, codes, tf.zeros_like(codes))
  return codes, base


def tf_expq_decode(codes: tf.Tensor, base: tf.Tensor) -> tf.Tensor:
  """Inverse of `tf_expq_encode` (code 128 decodes to 1, per Algorithm 4)."""
  codes = tf.cast(codes, tf.int32)
  exponents = -tf.range(_LEVELS + 1, dtype=tf.float64)
  table = tf.cast(
      tf.pow(tf.cast(tf.cast(base, tf.float32), tf.float64), exponents),
      tf.float32)
  negative = codes < 128
  levels = tf.where(negative, codes, codes - 128)
  magnitudes = tf.gather(table, levels)
  values = tf.where(negative, -magnitudes, magnitudes)
  return tf.where(tf.equal(codes, 0), tf.zeros_like(values), values)


def tf_golomb_num_bits(indices: tf.Tensor, b_star: int) -> tf.Tensor:
  """Exact Golomb bitstring length (int64) for sorted flat `indices`."""
  indices = tf.cast(indices, tf.int64)
  gaps = indices - tf.concat(
      [tf.constant([-1], tf.int64), indices[:-1]], axis=0)
  return tf.reduce_sum(
      tf.bitwise.right_shift(gaps - 1, tf.constant(b_star, tf.int64)) + 1 +
      b_star)


class TFEncodedTensor(NamedTuple):
  """Graph-mode counterpart of `codec.EncodedTensor` (for tests/inspection).

  `indices` is None for dense tensors; codes are uint8 when quantised, float32
  values otherwise; `weight_side` is float32[4] (UniQ) or None; each entry of
  `state_bases` is the float32 ExpQ base or None.
  """
  indices: Optional[tf.Tensor]
  weight_payload: tf.Tensor
  weight_side: Optional[tf.Tensor]
  state_payloads: tuple
  state_bases: tuple
  num_bits: tf.Tensor


def tf_encode_tensor(
    delta: tf.Tensor,
    sparsity: float,
    quantize_weights: bool,
    states: Sequence[tf.Tensor] = (),
    quantize_states: Optional[bool] = None,
    min_sparsify_rank: int = sparsify_lib.DEFAULT_MIN_SPARSIFY_RANK,
) -> TFEncodedTensor:
  """Encodes one weight tensor (and shared-index states) as `codec` does."""
  if quantize_states is None:
    quantize_states = quantize_weights
  n = _static_num_elements(delta)
  flat = tf.reshape(tf_sanitize(delta), [-1])
  flat_states = []
  for state in states:
    if state.shape != delta.shape:
      raise ValueError(f'State shape {state.shape} differs from the weight '
                       f'shape {delta.shape}.')
    flat_states.append(tf.reshape(tf_sanitize(state), [-1]))
  bits = tf.constant(0, tf.int64)
  indices = None
  if sparsify_lib.is_sparsified(delta.shape.as_list(), sparsity,
                                min_sparsify_rank):
    b_star = golomb.golomb_b_star(sparsity)
    indices = tf_top_k_indices(flat, sparsify_lib.num_kept(n, sparsity))
    flat = tf.gather(flat, indices)
    flat_states = [tf.gather(s, indices) for s in flat_states]
    bits += tf_golomb_num_bits(indices, b_star) + codec.B_STAR_BITS
  count = int(flat.shape[0])
  if quantize_weights:
    weight_payload, weight_side = tf_uniq_encode(flat)
    bits += (codec.CODE_BITS * count +
             codec.FLOAT_BITS * quantizers.UNIQ_SIDE_FLOATS)
  else:
    weight_payload, weight_side = flat, None
    bits += codec.FLOAT_BITS * count
  state_payloads, state_bases = [], []
  for s in flat_states:
    if quantize_states:
      codes, base = tf_expq_encode(s)
      state_payloads.append(codes)
      state_bases.append(base)
      bits += (codec.CODE_BITS * count +
               codec.FLOAT_BITS * quantizers.EXPQ_SIDE_FLOATS)
    else:
      state_payloads.append(s)
      state_bases.append(None)
      bits += codec.FLOAT_BITS * count
  return TFEncodedTensor(indices, weight_payload, weight_side,
                         tuple(state_payloads), tuple(state_bases), bits)


def tf_decode_tensor(encoded: TFEncodedTensor,
                     shape: Sequence[int]) -> tuple[tf.Tensor, list[tf.Tensor]]:
  """Decodes a `TFEncodedTensor` to the dense weight and state tensors."""
  shape = [int(d) for d in shape]
  n = int(np.prod(shape, dtype=np.int64))

  def densify(values):
    if encoded.indices is None:
      return tf.reshape(values, shape)
    return tf.reshape(
        tf.scatter_nd(encoded.indices[:, tf.newaxis], values,
                      tf.constant([n], tf.int64)), shape)

  if encoded.weight_side is not None:
    weights = tf_uniq_decode(encoded.weight_payload, encoded.weight_side)
  else:
    weights = encoded.weight_payload
  states = []
  for payload, base in zip(encoded.state_payloads, encoded.state_bases):
    states.append(densify(payload if base is None else
                          tf_expq_decode(payload, base)))
  return densify(weights), states


class TFCompressedUpload(NamedTuple):
  """Result of `tf_sparsify_quantize`.

  Attributes:
    weights: Decoded (lossy) weight deltas, same shapes as the input.
    states: Decoded state deltas, lists parallel to `weights` ([] if none).
    num_bits: int64 scalar, exact size of the encoded upload; equals
      `codec.encode_upload(...).num_bits` on the same inputs.
  """
  weights: list
  states: list
  num_bits: tf.Tensor


def tf_sparsify_quantize(
    delta_tensors: Sequence[tf.Tensor],
    sparsity: float,
    quantize: bool,
    shared_states: Optional[Sequence[Sequence[tf.Tensor]]] = None,
    min_sparsify_rank: int = sparsify_lib.DEFAULT_MIN_SPARSIFY_RANK,
) -> TFCompressedUpload:
  """Compresses and decompresses a client upload in graph mode.

  Args:
    delta_tensors: Weight deltas delta-omega (static shapes).
    sparsity: Fraction s dropped per sparsified tensor, in [0, 1) (Python).
    quantize: UniQ on weights and ExpQ on states if True, float32 otherwise.
    shared_states: Optional list of state lists (e.g. `[delta_m, delta_v]`),
      each parallel to `delta_tensors`, sparsified at delta-omega's indices.
    min_sparsify_rank: Tensors of lower rank are sent dense (default 2: rank-1 tensors go dense, docs/algorithms.md#ce-fedavg)
.

  Returns:
    A `TFCompressedUpload` with what the server decodes and the exact bits.
  """
  shared_states = [] if shared_states is None else list(shared_states)
  for state_list in shared_states:
    if len(state_list) != len(delta_tensors):
      raise ValueError(f'Each state list needs {len(delta_tensors)} tensors, '
                       f'got {len(state_list)}.')
  weights = []
  states = [[] for _ in shared_states]
  bits = tf.constant(0, tf.int64)
  for i, delta in enumerate(delta_tensors):
    delta = tf.convert_to_tensor(delta)
    encoded = tf_encode_tensor(
        delta, sparsity, quantize,
        [tf.convert_to_tensor(s[i]) for s in shared_states],
        min_sparsify_rank=min_sparsify_rank)
    weight, decoded_states = tf_decode_tensor(encoded, delta.shape.as_list())
    weights.append(weight)
    for j, s in enumerate(decoded_states):
      states[j].append(s)
    bits += encoded.num_bits
  return TFCompressedUpload(weights, states, bits)
