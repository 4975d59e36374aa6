"""Recurrent models in the cohort program, vectorised across clients.

`tf.vectorized_map` (pfor) cannot convert the `while_loop` a Keras GRU or LSTM
runs over the sequence: its TensorList ops have no vectorising converter
("Required handle data not set for ... TensorListGetItem"), so recurrent
cohorts used to run their clients in sequence. Unrolled (`unroll=True`, the
positions a Python loop), a recurrent layer is plain matmuls and element-wise
ops, which pfor converts with the client axis on the weights: each client's
`x @ W` becomes one batched matmul over the cohort. The arithmetic per client
is the layer's own cell (Keras' `GRUCell` / `LSTMCell`, the generic loop the
layer also runs without cuDNN), so the rounds equal the per-client ones up to
float32 summation order.

Measured on the Shakespeare GRU (2 × GRU 128, 80 positions, 10 clients × B4;
docs/performance.md): one gradient of the whole cohort took 0.30× the ten
clients' gradients in sequence; tracing the unrolled, vectorised program is
slow (minutes for 2 × 80 cells under load), paid once per process.

Unrolling needs the sequence length at build time (a static time dimension)
and puts every position of every layer in the graph, so `MAX_UNROLLED_CELLS`
bounds what `auto` unrolls; beyond it, or with an unknown length, recurrent
cohorts run in sequence as before.
"""

from typing import Optional

import tensorflow as tf

# Positions × recurrent layers that `auto` unrolls. 2 × 80 (Shakespeare) is
# measured faster vectorised; beyond a few hundred cells the graph (and its
# tracing and pfor conversion, minutes already at 160) grows without a
# measurement that it still pays.
MAX_UNROLLED_CELLS = 400
# `CohortExecution(jit_compile='auto')` for vectorised recurrent cohorts.
AUTO_JIT_COMPILE = False


def rnn_layers(keras_model: tf.keras.Model) -> list:
  """The Keras recurrent layers of the model (also those inside wrappers such as Bidirectional)."""
  return [layer for layer in keras_model.submodules if isinstance(layer, tf.keras.layers.RNN)]


def unrolled_cells(keras_model: tf.keras.Model) -> int:
  """Positions × recurrent layers once unrolled; 0 if some layer's length is not static."""
  cells = 0
  for layer in rnn_layers(keras_model):
    if getattr(layer, 'stateful', False):
      return 0  # state kept across calls: not a function of the weights alone
    try:
      shape = layer.input_shape
    except AttributeError:  # a layer never called on a known input
      return 0
    shape = shape[0] if isinstance(shape, list) else shape
    time_axis = 0 if getattr(layer, 'time_major', False) else 1
    if len(shape) < 3 or shape[time_axis] is None:
      return 0
    cells += int(shape[time_axis])
  return cells


def why_not_vectorised(keras_model: tf.keras.Model) -> Optional[str]:
  """Why the recurrent layers cannot be unrolled and vectorised (None: they can)."""
  if not rnn_layers(keras_model):
    return None
  if not unrolled_cells(keras_model):
    return ('a recurrent layer has no static sequence length (or is stateful): it cannot be '
            'unrolled')
  return None


def unroll(model: tf.keras.Model) -> None:
  """Run the model's recurrent layers unrolled, through their cell (a clone's
  layers: the view's `_clone_with`), so that pfor can vectorise them."""
  for layer in rnn_layers(model):
    if hasattr(layer, '_could_use_gpu_kernel'):  # GRU, LSTM: not their fused function
      layer._could_use_gpu_kernel = False  # pylint: disable=protected-access
    layer.unroll = True


def vectorise(mode: str, view, jit_compile=False) -> bool:
  """Whether the cohort program vectorises its clients, for `CohortExecution.mode`.

  Recurrent models vectorise unrolled (`view.unroll_rnn`): 'vectorized'
  asks for it and is refused in one line when the layers cannot be unrolled;
  'auto' picks it when they can, within `MAX_UNROLLED_CELLS`, when the model
  has no convolutions (pfor runs those as while loops: slower than in
  sequence) and when XLA was not asked for (`jit_compile` False or 'auto'):
  XLA did not finish compiling the vectorised, unrolled Shakespeare GRU in
  10 minutes, while it compiles the sequential step in seconds.
  """
  if not view.has_rnn:
    return mode == 'vectorized' or (mode == 'auto' and not view.has_conv_or_rnn)
  if mode == 'sequential':
    return False
  reason = view.rnn_vectorise_reason
  if mode == 'vectorized':
    if reason is not None:
      raise ValueError(f"CohortExecution: mode='vectorized' cannot vectorise the recurrent "
                       f"layers ({reason}); use mode='sequential' or 'auto'")
    return True
  return (reason is None and view.rnn_unrolled_cells <= MAX_UNROLLED_CELLS and
          not view.has_conv and jit_compile in (False, 'auto'))
