"""Client FLOPs per round (docs/algorithms.md#costs).

Source: "Accelerating Federated Learning with a Global Biased Optimiser" (FedGBO,
the FedGBO paper), Appendix B.6, eq. 22 and Table 9, which produce its Tables 4 (K = 10)
and 10 (K = 50).  The paper counts a forward pass with the Thop library for
PyTorch and multiplies by 3 for forward + backward (OpenAI's "AI and Compute"
rule); this module reproduces Thop's counting rules for Keras layers so that
the paper's numbers come out exactly (e.g. 5,163,072 forward FLOPs for its
CIFAR100 CNN).

Forward FLOPs per example, per layer (Thop's rules; one multiply-add = 1):
  * Conv1D/2D/3D: output elements x (C_in/groups x prod(kernel) + 1), the +1
    only when the layer has a bias.  Transposed, depthwise and separable
    convolutions are not supported (NotImplementedError).
  * Dense: output elements x input features.  The bias add is not counted
    (Thop's `count_linear`).  A Dense applied to a sequence counts every step.
  * SimpleRNN / GRU / LSTM: Thop's cell formulas x timesteps (all timesteps are
    computed, whatever `return_sequences` says), with I inputs, H units and
    n_b bias vectors per gate (Keras: SimpleRNN and LSTM 1; GRU 2 with the
    default `reset_after=True`, which matches PyTorch, else 1; 0 without bias):
      SimpleRNN: H(I + H) + H + n_b H
      GRU:       3 (H(I + H) + H + n_b H) + H + 3H
      LSTM:      4 (H(I + H) + H + n_b H) + 3H + H
    The number of timesteps comes from the layer's input shape, or from
    `sequence_length` if that is unknown.  Bidirectional is not supported.
  * BatchNormalization / LayerNormalization / GroupNormalization: 2 per
    element, doubled when it has a scale or an offset (Thop's
    `count_normalization`).
  * Everything without weights -- activations (also a Conv/Dense `activation=`,
    and softmax, which the paper's PyTorch models leave to the loss), pooling,
    dropout, flatten/reshape, padding, merges, preprocessing -- counts 0, as in
    Thop (its ReLU and max-pool rules give 0).  Embedding lookups count 0.
  * Nested models are counted layer by layer.  Any other layer with weights
    raises NotImplementedError rather than being silently undercounted.

|x| is the number of trainable parameters (what the client optimiser updates;
BatchNorm moving statistics are not counted).

Per-client, per-round FLOPs (eq. 22; fb = 3 x forward FLOPs per example):
  SGD family (FedAvg, FedAvgM, AdaptiveFedOpt/FedAdam/...): K (B fb + 2|x|)
  FedGBO:    K (B fb + C_fixed |x|)
  MFL:       K (B fb + C_moving |x|)
  Mimelite:  N_FedGBO + n_i fb  (full-batch gradient over the client's n_i examples)
  MimeXlite: N_FedGBO + B fb    (our extension: its "full" gradient is one minibatch)
  FedProx:   K (B fb + 5|x|)
with C_fixed / C_moving operations per parameter per step from Table 9:
RMSProp 5/5, SGDm 5/8, Adam 8/11 (and plain SGD 2/2, for which FedGBO and MFL
reduce to FedAvg).  Server work is not counted (the paper's choice).
"""

import dataclasses
import math
from collections.abc import Sequence
from typing import Optional, Union

import numpy as np
import tensorflow as tf

FB_MULTIPLIER = 3
SGD_OPS = 2
FEDPROX_OPS = 5

# FedGBO paper Table 9: (C_fixed, C_moving) operations per parameter per local step.
OPTIMIZER_OPS = {
    'sgd': (2, 2),
    'rmsprop': (5, 5),
    'sgdm': (5, 8),
    'adam': (8, 11),
}

_SGD_ALGORITHMS = ('fedavg', 'fedavgm', 'fedsgd', 'adaptive_fedopt', 'fedadagrad',
                   'fedadam', 'fedyogi')
ALGORITHMS = _SGD_ALGORITHMS + ('fedgbo', 'mfl', 'mimelite', 'mimexlite', 'fedprox')


@dataclasses.dataclass(frozen=True)
class ModelCounts:
  """What the FLOP formulas need to know about a model.

  Attributes:
    num_params: |x|, trainable parameters.
    forward_flops: forward FLOPs for one example.
  """
  num_params: int
  forward_flops: int

  @property
  def fb_flops(self) -> int:
    """Forward + backward FLOPs per example: 3 x forward."""
    return FB_MULTIPLIER * self.forward_flops


def _per_example(shape: Sequence[Optional[int]], layer: tf.keras.layers.Layer) -> int:
  dims = list(shape)[1:]
  if any(d is None for d in dims):
    raise ValueError(f'layer {layer.name!r}: output shape {tuple(shape)} is not fully '
                     'known; build the model with a fixed input shape')
  return int(np.prod(dims, dtype=np.int64))


def _single_shape(shape, layer: tf.keras.layers.Layer, what: str):
  if isinstance(shape, list):
    if len(shape) != 1:
      raise ValueError(f'layer {layer.name!r} has several {what}s; not supported')
    shape = shape[0]
  return tuple(shape)


def _layer_io_shapes(layer: tf.keras.layers.Layer):
  try:
    return layer.input_shape, layer.output_shape
  except (AttributeError, RuntimeError) as e:
    raise ValueError(f'layer {layer.name!r}: cannot read its input/output shape (a '
                     f'layer used more than once, or an unbuilt model?): {e}') from e


def _rnn_cell_flops(cell_type: str, inputs: int, units: int, num_biases: int) -> int:
  """Thop's `_count_{rnn,gru,lstm}_cell` with n_b bias vectors per gate."""
  gate = units * (inputs + units) + units + num_biases * units
  if cell_type == 'rnn':
    return gate
  if cell_type == 'gru':
    # Reset and update gates, the candidate, r * (...), then (1 - z) n + z h.
    return 3 * gate + units + 3 * units
  # Input/forget/output gates and the cell input, c' = f c + i g, h' = o tanh(c').
  return 4 * gate + 3 * units + units


def _normalization_types() -> tuple[type, ...]:
  names = ('BatchNormalization', 'LayerNormalization', 'GroupNormalization')
  return tuple(getattr(tf.keras.layers, n) for n in names if hasattr(tf.keras.layers, n))


def _unsupported_conv_types() -> tuple[type, ...]:
  names = ('Conv1DTranspose', 'Conv2DTranspose', 'Conv3DTranspose', 'DepthwiseConv1D',
           'DepthwiseConv2D', 'SeparableConv1D', 'SeparableConv2D')
  return tuple(getattr(tf.keras.layers, n) for n in names if hasattr(tf.keras.layers, n))


def layer_forward_flops(layer: tf.keras.layers.Layer,
                        sequence_length: Optional[int] = None) -> int:
  """Forward FLOPs of one (non-model) layer for one example; see module doc."""
  layers = tf.keras.layers
  if isinstance(layer, _unsupported_conv_types()):
    raise NotImplementedError(f'no FLOP rule for {type(layer).__name__} ({layer.name!r})')
  if isinstance(layer, (layers.Conv1D, layers.Conv2D, layers.Conv3D)):
    _, out_shape = _layer_io_shapes(layer)
    out_shape = _single_shape(out_shape, layer, 'output')
    # The kernel is (k..., C_in/groups, C_out): one output needs prod(k) C_in/groups.
    per_output = int(np.prod(layer.kernel.shape[:-1])) + (1 if layer.use_bias else 0)
    return _per_example(out_shape, layer) * per_output
  if isinstance(layer, layers.Dense):
    _, out_shape = _layer_io_shapes(layer)
    out_shape = _single_shape(out_shape, layer, 'output')
    return _per_example(out_shape, layer) * int(layer.kernel.shape[0])
  if isinstance(layer, (layers.SimpleRNN, layers.GRU, layers.LSTM)):
    in_shape, _ = _layer_io_shapes(layer)
    in_shape = _single_shape(in_shape, layer, 'input')
    steps = in_shape[1] if len(in_shape) > 1 else None
    if steps is None:
      steps = sequence_length
    if steps is None:
      raise ValueError(f'layer {layer.name!r}: unknown number of timesteps; pass '
                       'sequence_length')
    cell = layer.cell
    inputs, units = int(cell.kernel.shape[0]), int(cell.units)
    if isinstance(layer, layers.SimpleRNN):
      kind, biases = 'rnn', 1
    elif isinstance(layer, layers.GRU):
      kind, biases = 'gru', 2 if cell.reset_after else 1
    else:
      kind, biases = 'lstm', 1
    if not cell.use_bias:
      biases = 0
    return int(steps) * _rnn_cell_flops(kind, inputs, units, biases)
  if isinstance(layer, _normalization_types()):
    _, out_shape = _layer_io_shapes(layer)
    elements = _per_example(_single_shape(out_shape, layer, 'output'), layer)
    affine = bool(getattr(layer, 'scale', False) or getattr(layer, 'center', False))
    return 2 * elements * (2 if affine else 1)
  if isinstance(layer, layers.Embedding):
    return 0
  if not layer.weights:
    return 0
  raise NotImplementedError(f'no FLOP rule for {type(layer).__name__} ({layer.name!r}), '
                            'which has weights')


def layer_flops_breakdown(model: tf.keras.Model,
                          sequence_length: Optional[int] = None
                          ) -> list[tuple[str, str, int]]:
  """(layer name, layer class, forward FLOPs per example) for every counted layer."""
  rows = []
  for layer in model.layers:
    if isinstance(layer, tf.keras.Model):
      rows.extend(layer_flops_breakdown(layer, sequence_length))
    else:
      rows.append((layer.name, type(layer).__name__,
                   layer_forward_flops(layer, sequence_length)))
  return rows


def forward_flops_per_example(model: tf.keras.Model,
                              sequence_length: Optional[int] = None) -> int:
  """Forward FLOPs of `model` for one example (Thop's rules; see module doc)."""
  return sum(f for _, _, f in layer_flops_breakdown(model, sequence_length))


def count_trainable_params(model: tf.keras.Model) -> int:
  """|x|: number of trainable parameters."""
  return int(sum(int(np.prod(w.shape)) for w in model.trainable_weights))


def model_counts(model: tf.keras.Model, sequence_length: Optional[int] = None) -> ModelCounts:
  """|x| and forward FLOPs per example of a built Keras model."""
  return ModelCounts(count_trainable_params(model),
                     forward_flops_per_example(model, sequence_length))


ModelLike = Union[tf.keras.Model, ModelCounts, tuple[int, int]]


def _as_counts(model_or_counts: ModelLike) -> ModelCounts:
  if isinstance(model_or_counts, ModelCounts):
    return model_or_counts
  if isinstance(model_or_counts, tf.keras.Model):
    return model_counts(model_or_counts)
  num_params, forward = model_or_counts
  return ModelCounts(int(num_params), int(forward))


def _positive_int(value, name: str) -> int:
  if isinstance(value, bool) or not float(value).is_integer() or value < 1:
    raise ValueError(f'{name} must be an integer >= 1; got {value!r}')
  return int(value)


def client_flops(algorithm: str, optimizer: Optional[str], model_or_counts: ModelLike,
                 K: int, B: int, n_i: Optional[int] = None) -> int:  # pylint: disable=invalid-name
  """FLOPs one client spends in one round (FedGBO paper eq. 22).

  Args:
    algorithm: one of `ALGORITHMS`.  fedavg, fedavgm, fedsgd, adaptive_fedopt,
      fedadagrad, fedadam and fedyogi adapt on the server only, so clients run
      SGD: N_SGD.
    optimizer: the client-side optimiser for fedgbo, mfl, mimelite, mimexlite:
      rmsprop | sgdm | adam | sgd.  For the others it must be None or 'sgd'.
    model_or_counts: a built Keras model, a `ModelCounts`, or
      (num_params, forward_flops_per_example).
    K: local steps.
    B: minibatch size.
    n_i: the client's number of examples (mimelite only, required there; the
      paper uses the mean examples per client).

  Returns:
    The FLOPs, an exact integer.

  Raises:
    ValueError: unknown algorithm/optimiser, or an argument that does not apply.
  """
  if algorithm not in ALGORITHMS:
    raise ValueError(f'algorithm must be one of {ALGORITHMS}; got {algorithm!r}')
  counts = _as_counts(model_or_counts)
  K = _positive_int(K, 'K')  # pylint: disable=invalid-name
  B = _positive_int(B, 'B')  # pylint: disable=invalid-name
  if algorithm != 'mimelite' and n_i is not None:
    raise ValueError(f'n_i applies to mimelite only, not {algorithm}')
  grads = B * counts.fb_flops
  x = counts.num_params
  if algorithm in _SGD_ALGORITHMS or algorithm == 'fedprox':
    if optimizer not in (None, 'sgd'):
      raise ValueError(f'{algorithm} clients run plain SGD (server-side work is not '
                       f'counted); got optimizer {optimizer!r}')
    ops = FEDPROX_OPS if algorithm == 'fedprox' else SGD_OPS
    return K * (grads + ops * x)
  if optimizer not in OPTIMIZER_OPS:
    raise ValueError(f'{algorithm} needs optimizer in {tuple(OPTIMIZER_OPS)}; '
                     f'got {optimizer!r}')
  c_fixed, c_moving = OPTIMIZER_OPS[optimizer]
  if algorithm == 'mfl':
    return K * (grads + c_moving * x)
  n_fedgbo = K * (grads + c_fixed * x)
  if algorithm == 'fedgbo':
    return n_fedgbo
  if algorithm == 'mimexlite':
    return n_fedgbo + B * counts.fb_flops
  if n_i is None:
    raise ValueError('mimelite needs n_i, the client\'s number of examples')
  return n_fedgbo + _positive_int(n_i, 'n_i') * counts.fb_flops


def round_to_significant(x: float, digits: int = 3) -> float:
  """x rounded to `digits` significant figures, as the paper's tables are."""
  if x == 0:
    return 0.0
  return round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))
