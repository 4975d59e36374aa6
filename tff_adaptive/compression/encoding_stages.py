"""CE-FedAvg encoders as tensor_encoding stages for TFF's EncodedSumFactory.

Implements the per-tensor part of the upload compression of thesis chapter 3
(thesis section 3.2; docs/algorithms.md#ce-fedavg) on top of
tensorflow_model_optimization's tensor_encoding framework, which
`tff.aggregators.EncodedSumFactory` consumes:

  * `TopKSparsificationEncodingStage`: keep the ceil((1 - s) n) largest |x|
    (static k, so shapes are known at trace time); encoded as sorted int64
    flat 'indices' and their 'values'.
  * `UniQEncodingStage`: uint8 'codes' + float32[4] 'side'.
  * `ExpQEncodingStage`: uint8 'codes' + float32 'base'.

`ce_weight_encoder(shape, s)` composes them the way CE-FedAvg treats a weight
delta (rank >= 2: top-k then UniQ on the kept values; otherwise UniQ dense),
and `compressed_sum_factory(s)` wraps that in an `EncodedSumFactory`, i.e. the
"FedAvg + compression" upload of eq. 3.1. The stages reuse `tf_ops`, so they
produce the same codes as the NumPy codec.

What does not fit the framework: CE-FedAvg's shared indices. A stage encodes
one tensor in isolation, so delta-m and delta-v cannot be sparsified at
delta-omega's indices through it; for the full CE-FedAvg upload use
`tf_ops.tf_sparsify_quantize(..., shared_states=[dm, dv])` inside the client
computation. Bits are counted by `codec` / `tf_ops` (the framework's encoded
tensors are neither bit-packed nor Golomb-coded; they carry the same
information).
"""

import collections
import math
from typing import Sequence

import tensorflow as tf
from tensorflow_model_optimization.python.core.internal import tensor_encoding as te

from tff_adaptive.compression import sparsify as sparsify_lib
from tff_adaptive.compression import tf_ops

encoding_stage = te.core.encoding_stage


@encoding_stage.tf_style_encoding_stage
class TopKSparsificationEncodingStage(encoding_stage.EncodingStageInterface):
  """Keeps the ceil((1 - s) n) entries of largest magnitude (no feedback)."""

  VALUES_KEY = 'values'
  INDICES_KEY = 'indices'

  def __init__(self, sparsity: float):
    sparsify_lib.num_kept(1, sparsity)  # Validates s in [0, 1).
    self._sparsity = float(sparsity)

  @property
  def name(self):
    return 'top_k_sparsification'

  @property
  def compressible_tensors_keys(self):
    return [self.VALUES_KEY]

  @property
  def commutes_with_sum(self):
    return False  # Clients keep different indices.

  @property
  def decode_needs_input_shape(self):
    return True

  def get_params(self):
    return collections.OrderedDict(), collections.OrderedDict()

  def encode(self, x, encode_params):
    del encode_params  # Unused.
    if not x.shape.is_fully_defined():
      raise ValueError(f'Top-k sparsification needs a static shape, got '
                       f'{x.shape}.')
    flat = tf.reshape(tf_ops.tf_sanitize(x), [-1])
    k = sparsify_lib.num_kept(int(x.shape.num_elements()), self._sparsity)
    indices = tf_ops.tf_top_k_indices(flat, k)
    return collections.OrderedDict([
        (self.VALUES_KEY, tf.gather(flat, indices)),
        (self.INDICES_KEY, indices),
    ])

  def decode(self, encoded_tensors, decode_params, num_summands=None,
             shape=None):
    del decode_params, num_summands  # Unused.
    values = encoded_tensors[self.VALUES_KEY]
    indices = encoded_tensors[self.INDICES_KEY]
    size = tf.cast(tf.reduce_prod(shape), tf.int64)
    dense = tf.scatter_nd(indices[:, tf.newaxis], values,
                          tf.reshape(size, [1]))
    return tf.reshape(dense, shape)


class _PerClientQuantizerStage(encoding_stage.EncodingStageInterface):
  """A quantiser whose side information (ranges, base) is each client's own.

  Subclasses name the stage and give the TF encode (x -> codes, side) and
  decode (codes, side -> values) of `tf_ops`.
  """

  CODES_KEY = 'codes'
  SIDE_KEY = 'side'
  NAME = ''

  @property
  def name(self):
    return self.NAME

  @property
  def compressible_tensors_keys(self):
    return []

  @property
  def commutes_with_sum(self):
    return False  # Each client has its own side information.

  @property
  def decode_needs_input_shape(self):
    return True

  def get_params(self):
    return collections.OrderedDict(), collections.OrderedDict()

  @staticmethod
  def _encode(x):
    raise NotImplementedError

  @staticmethod
  def _decode(codes, side):
    raise NotImplementedError

  def encode(self, x, encode_params):
    del encode_params  # Unused.
    codes, side = self._encode(x)
    return collections.OrderedDict([(self.CODES_KEY, codes), (self.SIDE_KEY, side)])

  def decode(self, encoded_tensors, decode_params, num_summands=None,
             shape=None):
    del decode_params, num_summands  # Unused.
    decoded = self._decode(encoded_tensors[self.CODES_KEY], encoded_tensors[self.SIDE_KEY])
    return tf.reshape(decoded, shape)


@encoding_stage.tf_style_encoding_stage
class UniQEncodingStage(_PerClientQuantizerStage):
  """UniQ (thesis Algorithm 3): 7 bits per sign, decode to the lower edge; side: the ranges."""

  NAME = 'uniq'
  _encode = staticmethod(tf_ops.tf_uniq_encode)
  _decode = staticmethod(tf_ops.tf_uniq_decode)


@encoding_stage.tf_style_encoding_stage
class ExpQEncodingStage(_PerClientQuantizerStage):
  """ExpQ (thesis Algorithm 4): sign + 7-bit exponent of base delta^(-1/127); side: the base."""

  NAME = 'expq'
  SIDE_KEY = 'base'
  _encode = staticmethod(tf_ops.tf_expq_encode)
  _decode = staticmethod(tf_ops.tf_expq_decode)


def ce_weight_encoder(
    shape: Sequence[int],
    sparsity: float,
    quantize: bool = True,
    min_sparsify_rank: int = sparsify_lib.DEFAULT_MIN_SPARSIFY_RANK,
) -> te.core.Encoder:
  """`Encoder` for one weight delta: top-k (rank >= 2) then UniQ."""
  shape = [int(d) for d in shape]
  if sparsify_lib.is_sparsified(shape, sparsity, min_sparsify_rank):
    composer = te.core.EncoderComposer(
        TopKSparsificationEncodingStage(sparsity))
    if quantize:
      composer.add_child(UniQEncodingStage(),
                         TopKSparsificationEncodingStage.VALUES_KEY)
    return composer.make()
  if quantize:
    return te.core.EncoderComposer(UniQEncodingStage()).make()
  return te.encoders.identity()


def ce_gather_encoder(
    value_spec: tf.TensorSpec,
    sparsity: float,
    quantize: bool = True,
    min_sparsify_rank: int = sparsify_lib.DEFAULT_MIN_SPARSIFY_RANK,
) -> te.core.GatherEncoder:
  """`GatherEncoder` for `value_spec` (float tensors only are compressed)."""
  if not value_spec.dtype.is_floating or math.prod(
      value_spec.shape.as_list()) == 0:
    return te.encoders.as_gather_encoder(te.encoders.identity(), value_spec)
  encoder = ce_weight_encoder(value_spec.shape.as_list(), sparsity, quantize,
                              min_sparsify_rank)
  return te.encoders.as_gather_encoder(encoder, value_spec)


def compressed_sum_factory(
    sparsity: float,
    quantize: bool = True,
    min_sparsify_rank: int = sparsify_lib.DEFAULT_MIN_SPARSIFY_RANK,
):
  """`tff.aggregators.EncodedSumFactory` applying CE-FedAvg's weight encoder.

  This is the "FedAvg + compression" upload (eq. 3.1) as a TFF unweighted sum
  aggregator; wrap it in `tff.aggregators.MeanFactory` for weighted means.
  """
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  def encoder_fn(value_spec):
    return ce_gather_encoder(value_spec, sparsity, quantize,
                             min_sparsify_rank)

  return tff.aggregators.EncodedSumFactory(encoder_fn)
