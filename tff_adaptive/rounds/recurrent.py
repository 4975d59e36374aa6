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

Models that `lanes.LaneModel` computes (Embedding, GRU, LSTM, Dense) run
their lanes with the lane axis on the weights instead, without unrolling
(lanes.py); the unrolled form is for the other recurrent models.

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


def vectorise(mode: str, view, jit_compile=False, extensions=()) -> bool:
  """Whether the cohort program vectorises its clients, for `CohortExecution.mode`.

  A recurrent model vectorises with the lane axis on its weights where
  `lanes.LaneModel` computes it (`view.lane_model`), else unrolled
  (`view.unroll_rnn`, pfor over the unrolled cells). 'vectorized' asks for
  it and is refused in one line when neither is possible; 'auto' picks the
  lanes when the model has them, no extension needs the clients one by one
  (`steps_outside_unsupported`) and XLA was not asked for (`jit_compile`
  False or 'auto': XLA over the lanes' recurrence ran 1.6-2x slower than
  without, docs/performance.md). The unrolled form is never picked by
  'auto': it builds in minutes and its round was no faster than in sequence.
  """
  if not view.has_rnn:
    return mode == 'vectorized' or (mode == 'auto' and not view.has_conv_or_rnn)
  if mode == 'sequential':
    return False
  reason = view.rnn_vectorise_reason
  if mode == 'vectorized':
    if view.lane_model is None and reason is not None:
      raise errors.ArgumentError(
          'CohortExecution', 'mode', f'cannot vectorise the recurrent layers ({reason}); use ',
          errors.Given('sequential'), " or 'auto'", value='vectorized')
    return True
  return (view.lane_model is not None and not view.has_conv and
          jit_compile in (False, 'auto') and
          not any(ext.steps_outside_unsupported for ext in extensions))
