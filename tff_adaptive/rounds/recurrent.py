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

The vectorised program runs the step loop outside and vectorises each step
over the clients (cohort_program.py), so pfor converts the unrolled gradient
once, outside any loop; converting it inside the client's step loop (pfor's
`WhileV2` converter) did not finish in 14 minutes for the Shakespeare GRU.

Measured on the Shakespeare GRU (2 × GRU 128, 80 positions, FedAvg, 10 clients
× 10 steps × B4, one bench run, load 2.7-7.5; bench/results/overhead_gru_vec.json,
docs/performance.md): the vectorised program builds in 86 s (tracing, pfor) plus
124 s for the first round (graph optimisation), and its round takes 0.80× the
raw loop, against 0.78× for the clients in sequence with XLA per step and 0.67×
with XLA over the program: not faster, so `auto` does not pick it
(`MAX_UNROLLED_CELLS`). Its updates equal the per-client ones within 1.9e-9.

Unrolling needs the sequence length at build time (a static time dimension)
and puts every position of every layer in the graph; with an unknown length
'vectorized' is refused and recurrent cohorts run in sequence as before.
"""

from typing import Optional

import tensorflow as tf

from tff_adaptive import errors

# Positions × recurrent layers that `auto` unrolls: none. The vectorised
# Shakespeare GRU (2 × 80 cells) builds in about 3.5 minutes (86 s tracing,
# 124 s first round, load 3-7) and its round is 0.80× the raw loop, no faster
# than in sequence with XLA per step (0.78×, the `auto` path) or over the
# program (0.67×), in the same bench run; no smaller model was measured faster
# as a round. So `auto` keeps recurrent cohorts in sequence and
# `mode='vectorized'` is opt-in.
MAX_UNROLLED_CELLS = 0
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
      raise errors.ArgumentError(
          'CohortExecution', 'mode', f'cannot vectorise the recurrent layers ({reason}); use ',
          errors.Given('sequential'), " or 'auto'", value='vectorized')
    return True
  return (reason is None and view.rnn_unrolled_cells <= MAX_UNROLLED_CELLS and
          not view.has_conv and jit_compile in (False, 'auto'))
