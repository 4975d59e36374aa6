"""Recurrent models with the lane axis on their weights.

A lane is one client of a cohort, or one (member, client) pair of a
population: its own weights and its own batch. `LaneModel` computes a Keras
`Sequential` of Embedding, GRU, LSTM and Dense layers for all lanes at once,
every weight carrying a leading lane axis [L, ...], so that each op of the
recurrence is one batched matmul or one element-wise op over every lane.
`tf.vectorized_map` cannot get there (pfor has no converter for the
`while_loop` of a Keras GRU; unrolled, the graph is 80 positions deep and
builds in minutes, recurrent.py). At B = 4 the step is bound by the number of
ops and by reading each lane's weights, not by arithmetic, so more lanes pay
for the same ops.

The arithmetic is Keras': GRU with `reset_after=True` (z, r, h̃ with separate
input and recurrent biases), LSTM (i, f, c̃, o), sigmoid/tanh, masked
positions (Embedding's `mask_zero`) carrying the previous state and output as
`backend.rnn` does. Each recurrent layer's gradient is written out
(`tf.custom_gradient`): the backward recurrence is one matmul and a dozen
element-wise ops per position, and the weight gradients are one batched
matmul over every position afterwards, where autodiff of the loop would push
and pop every intermediate of every position.

What is not this list (dropout, regularisers, other activations, go_backwards,
stateful or bidirectional layers, convolutions, mixed precision, a model that
is not a `Sequential`) gets `why_not`'s one-line reason; its cohort keeps the
other executions.
"""

import os
from typing import Optional

import tensorflow as tf

_RECURRENT = (tf.keras.layers.GRU, tf.keras.layers.LSTM)
MAX_GROUPS = 8
_REGULARISERS = ('kernel_regularizer', 'recurrent_regularizer', 'bias_regularizer',
                 'activity_regularizer', 'embeddings_regularizer')


def why_not(keras_model: tf.keras.Model) -> Optional[str]:
  """Why `LaneModel` cannot compute this model (None: it can)."""
  if not isinstance(keras_model, tf.keras.Sequential):
    return 'the model is not a Keras Sequential'
  layers = keras_model.layers
  if not any(isinstance(layer, _RECURRENT) for layer in layers):
    return 'the model has no GRU or LSTM layer'
  for layer in layers:
    reason = _why_not_layer(layer)
    if reason:
      return f'layer {layer.name!r}: {reason}'
  return None


def _why_not_layer(layer) -> Optional[str]:
  if not isinstance(layer, (tf.keras.layers.Embedding, tf.keras.layers.Dense) + _RECURRENT):
    return f'{type(layer).__name__} has no lane form (Embedding, GRU, LSTM, Dense have)'
  if layer.dtype_policy.compute_dtype != 'float32':
    return 'computes in another dtype than float32'
  if any(getattr(layer, name, None) is not None for name in _REGULARISERS):
    return 'has a regulariser'
  if isinstance(layer, _RECURRENT):
    cell = layer.cell
    if (layer.go_backwards or layer.stateful or layer.return_state or layer.time_major or
        cell.dropout or cell.recurrent_dropout or not cell.use_bias):
      return ('runs backwards, is stateful, returns its state, is time-major, has dropout '
              'or no bias')
    if (cell.activation is not tf.keras.activations.tanh or
        cell.recurrent_activation is not tf.keras.activations.sigmoid):
      return 'has other activations than tanh and sigmoid'
    if isinstance(layer, tf.keras.layers.GRU) and not cell.reset_after:
      return 'is a GRU without reset_after'
  return None


class LaneModel:
  """`model(weights, x)` for every lane: weights the model's trainable
  weights, each [L, ...]; x [L, B, T] tokens; the model's output [L, B, ...]."""

  def __init__(self, keras_model: tf.keras.Model, groups: Optional[int] = None):
    reason = why_not(keras_model)
    if reason:
      raise ValueError(reason)
    index = {id(v): i for i, v in enumerate(keras_model.trainable_variables)}
    self._stages = [(layer, [index[id(v)] for v in layer.trainable_weights])
                    for layer in keras_model.layers]
    self.groups = groups or min(os.cpu_count() or 1, MAX_GROUPS)

  def __call__(self, weights, x):
    weights = list(weights)
    h, mask, time_major = x, None, False
    for layer, at in self._stages:
      w = [weights[i] for i in at]
      if isinstance(layer, tf.keras.layers.Embedding):
        h = _embedding(layer, w[0], h)
        mask = tf.not_equal(x, 0) if layer.mask_zero else None
        continue
      if isinstance(layer, _RECURRENT):
        if not time_major:  # [L,B,T,·] → [T,L,B,·] for the recurrence
          h, time_major = tf.transpose(h, [2, 0, 1, 3]), True
        step_mask = None if mask is None else tf.transpose(mask, [2, 0, 1])[..., tf.newaxis]
        run = _gru if isinstance(layer, tf.keras.layers.GRU) else _lstm
        h = _in_groups(run, self.groups, h, *w, step_mask)
        if not layer.return_sequences:
          h, mask, time_major = h[-1], None, False
        continue
      if time_major:
        h, time_major = tf.transpose(h, [1, 2, 0, 3]), False
      h = _dense(layer, w, h)
    return h


def _in_groups(run, groups, h, *weights_and_mask):
  """`run` on the lanes split into `groups` independent recurrences, whose
  chains of small ops TensorFlow's inter-op threads run side by side."""
  if groups == 1:
    return run(h, *weights_and_mask)
  lanes = tf.shape(h)[1]
  sizes = tf.stack([lanes // groups] * (groups - 1) + [lanes - (groups - 1) * (lanes // groups)])
  split = lambda t, axis: [None] * groups if t is None else tf.split(t, sizes, axis=axis)
  parts = [split(h, 1)] + [split(t, 0) for t in weights_and_mask[:-1]]
  parts.append(split(weights_and_mask[-1], 1))
  return tf.concat([run(*args) for args in zip(*parts)], axis=1)


def _embedding(layer, table, tokens):
  if tokens.dtype not in (tf.int32, tf.int64):
    tokens = tf.cast(tokens, tf.int32)
  del layer
  return tf.gather(table, tokens, batch_dims=1)


def _dense(layer, w, h):
  # One batched matmul over [L, rows, I]: einsum's 'l...i' form ran 70x slower here.
  shape = tf.shape(h)
  out = tf.matmul(tf.reshape(h, [shape[0], -1, shape[-1]]), w[0])
  out = tf.reshape(out, tf.concat([shape[:-1], tf.shape(w[0])[-1:]], 0))
  if layer.use_bias:
    out += tf.reshape(w[1], [tf.shape(w[1])[0]] + [1] * (h.shape.rank - 2) + [-1])
  return layer.activation(out)


@tf.custom_gradient
def _project(h, kernel, bias):
  """Every position's input projection at once: [T,L,B,I] × [L,I,G] + [L,G]."""

  def grad(d):
    return (tf.einsum('tlbg,lig->tlbi', d, kernel), _over_positions(h, d),
            _sum_over_positions(d))

  return tf.einsum('tlbi,lig->tlbg', h, kernel) + bias[:, tf.newaxis], grad


# The weight gradients below contract the time-major [T,L,B,·] sequences over
# positions and rows. Written as einsum ('tlbi,tlbg->lig') or one
# reduce_sum(axis=[0, 2]), TensorFlow transposes them element by element:
# 22 and 12 ms at 14 lanes on the Shakespeare GRU, against 7.7 and 1.4 ms for
# the forms below (lane-major copies, one batched matmul; two reductions over
# contiguous axes), which made them a third of a train step.

def _over_positions(a, b):
  """Σ over positions t and rows b of a[t,l,b,:]ᵀ b[t,l,b,:]: [L, I, G]."""
  lane_major = lambda t: tf.reshape(tf.transpose(t, [1, 0, 2, 3]),
                                    tf.stack([tf.shape(t)[1], -1, tf.shape(t)[3]]))
  return tf.matmul(lane_major(a), lane_major(b), transpose_a=True)


def _sum_over_positions(d):
  """Σ over positions t and rows b of d[t,l,b,:]: [L, G]."""
  return tf.reduce_sum(tf.reduce_sum(d, axis=0), axis=1)


def _shifted(hs):
  """h_{t-1} for every t: the outputs shifted by one position, zeros first."""
  return tf.concat([tf.zeros_like(hs[:1]), hs[:-1]], axis=0)


def _gru(h, kernel, recurrent, bias, mask):
  """Keras' GRU (reset_after) over [T,L,B,I]: every position's state [T,L,B,H]."""
  return _gru_recurrence(_project(h, kernel, bias[:, 0]), recurrent, bias[:, 1], mask)


def _gru_recurrence(xp, recurrent, recurrent_bias, mask):
  units = recurrent.shape[1]
  rb = recurrent_bias[:, tf.newaxis]
  ones = tf.ones_like(xp[..., :1], tf.bool) if mask is None else mask

  @tf.custom_gradient
  def recurrence(xp, recurrent, rb):
    def cell(carry, elems):
      h = carry[0]
      x, m = elems
      inner = tf.matmul(h, recurrent) + rb
      x_z, x_r, x_h = tf.split(x, 3, axis=-1)
      r_z, r_r, r_h = tf.split(inner, 3, axis=-1)
      z = tf.sigmoid(x_z + r_z)
      r = tf.sigmoid(x_r + r_r)
      hh = tf.tanh(x_h + r * r_h)
      new = z * h + (1 - z) * hh
      return tf.where(m, new, h), z, r, hh, r_h

    h0 = tf.zeros_like(xp[0, ..., :units])
    hs, zs, rs, hhs, r_hs = tf.scan(cell, (xp, ones), initializer=(h0, h0, h0, h0, h0))

    def grad(dhs):
      def back(dh_next, elems):
        dh_out, z, r, hh, r_h, h_prev, m = elems
        dh = dh_next[0] + dh_out
        d_new = tf.where(m, dh, 0.)
        d_z = d_new * (h_prev - hh) * z * (1 - z)
        d_hh = d_new * (1 - z) * (1 - hh * hh)
        d_r = d_hh * r_h * r * (1 - r)
        d_inner = tf.concat([d_z, d_r, d_hh * r], axis=-1)
        d_prev = tf.where(m, 0., dh) + d_new * z + tf.matmul(d_inner, recurrent,
                                                             transpose_b=True)
        return d_prev, tf.concat([d_z, d_r, d_hh], axis=-1), d_inner

      prev = _shifted(hs)
      zero = tf.zeros_like(dhs[0])
      _, d_xp, d_inner = tf.scan(back, (dhs, zs, rs, hhs, r_hs, prev, ones),
                                 initializer=(zero, tf.concat([zero] * 3, -1),
                                              tf.concat([zero] * 3, -1)), reverse=True)
      return (d_xp, _over_positions(prev, d_inner),
              _sum_over_positions(d_inner)[:, tf.newaxis])

    return hs, grad

  return recurrence(xp, recurrent, rb)


def _lstm(h, kernel, recurrent, bias, mask):
  """Keras' LSTM over [T,L,B,I]: every position's output [T,L,B,H]."""
  xp = _project(h, kernel, bias)
  units = recurrent.shape[1]
  ones = tf.ones_like(xp[..., :1], tf.bool) if mask is None else mask

  @tf.custom_gradient
  def recurrence(xp, recurrent):
    def cell(carry, elems):
      h, c = carry[0], carry[1]
      x, m = elems
      z = x + tf.matmul(h, recurrent)
      z_i, z_f, z_c, z_o = tf.split(z, 4, axis=-1)
      i, f, o = tf.sigmoid(z_i), tf.sigmoid(z_f), tf.sigmoid(z_o)
      g = tf.tanh(z_c)
      c_new = f * c + i * g
      t = tf.tanh(c_new)
      return tf.where(m, o * t, h), tf.where(m, c_new, c), i, f, g, o, t

    h0 = tf.zeros_like(xp[0, ..., :units])
    hs, cs, i_s, fs, gs, os_, ts = tf.scan(cell, (xp, ones), initializer=(h0,) * 7)

    def grad(dhs):
      def back(carry, elems):
        dh_next, dc_next = carry[0], carry[1]
        dh_out, i, f, g, o, t, c_prev, h_prev, m = elems
        del h_prev
        dh = dh_next + dh_out
        d_h = tf.where(m, dh, 0.)
        d_c = tf.where(m, dc_next, 0.) + d_h * o * (1 - t * t)
        d_z = tf.concat([d_c * g * i * (1 - i), d_c * c_prev * f * (1 - f),
                         d_c * i * (1 - g * g), d_h * t * o * (1 - o)], axis=-1)
        d_prev = tf.where(m, 0., dh) + tf.matmul(d_z, recurrent, transpose_b=True)
        dc_prev = tf.where(m, 0., dc_next) + d_c * f
        return d_prev, dc_prev, d_z

      prev_h, prev_c = _shifted(hs), _shifted(cs)
      zero = tf.zeros_like(dhs[0])
      _, _, d_z = tf.scan(back, (dhs, i_s, fs, gs, os_, ts, prev_c, prev_h, ones),
                          initializer=(zero, zero, tf.concat([zero] * 4, -1)), reverse=True)
      return d_z, _over_positions(prev_h, d_z)

    return hs, grad

  return recurrence(xp, recurrent)
