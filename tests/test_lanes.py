"""The lane-axis recurrent model (tff_adaptive/rounds/lanes.py) equals Keras per lane.

Three lanes, each with its own weights (the model's, perturbed) and its own
batch, tokens 0 (masked by Embedding(mask_zero=True)) anywhere in the
sequences: each lane's output and the gradient of its loss equal Keras' layer
run on that lane alone, within 1e-5 relative, for the GRU (every position, and
the last state only), the LSTM, and lanes split into several groups. Models
outside the lane form get one line saying why.
"""

import numpy as np
import pytest
import tensorflow as tf

from tff_adaptive.rounds import lanes

L, B, T, V = 3, 4, 7, 11
LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _model(layer, return_sequences=True, mask_zero=True, **kwargs):
  model = tf.keras.Sequential([
      tf.keras.layers.Embedding(V, 5, mask_zero=mask_zero, input_length=T),
      layer(6, return_sequences=True, **kwargs),
      layer(6, return_sequences=return_sequences, **kwargs),
      tf.keras.layers.Dense(V, activation='tanh')])
  model.build((None, T))
  return model


def _lane_weights(model, rng):
  return [np.stack([v.numpy() + 0.2 * rng.standard_normal(v.shape).astype(np.float32)
                    for _ in range(L)]) for v in model.trainable_variables]


def _per_lane_keras(model, weights, x, y):
  """(outputs, gradients) of Keras' model on each lane alone."""
  outputs, grads = [], []
  for lane in range(L):
    for variable, w in zip(model.trainable_variables, weights):
      variable.assign(w[lane])
    with tf.GradientTape() as tape:
      # tf.identity: the loss without the Keras mask, as TFF's forward pass sees it.
      out = tf.identity(model(x[lane], training=True))
      loss = LOSS(y[lane], out)
    outputs.append(out.numpy())
    grads.append([tf.convert_to_tensor(g).numpy()
                  for g in tape.gradient(loss, model.trainable_variables)])
  return outputs, grads


@pytest.mark.parametrize('layer, return_sequences, groups', [
    (tf.keras.layers.GRU, True, 1),
    (tf.keras.layers.GRU, False, 2),
    (tf.keras.layers.LSTM, True, 2),
    (tf.keras.layers.LSTM, False, 3),
])
def test_each_lane_equals_keras_on_that_lane_alone(layer, return_sequences, groups):
  rng = np.random.default_rng(0)
  model = _model(layer, return_sequences)
  weights = _lane_weights(model, rng)
  x = rng.integers(0, 4, (L, B, T))  # many zeros: masked positions inside the sequences
  y = rng.integers(0, V, (L, B, T) if return_sequences else (L, B))
  lane_model = lanes.LaneModel(model, groups=groups)
  tensors = [tf.constant(w) for w in weights]
  with tf.GradientTape() as tape:
    tape.watch(tensors)
    out = lane_model(tensors, tf.constant(x))
    total = tf.add_n([LOSS(y[lane], out[lane]) for lane in range(L)])
  grads = tape.gradient(total, tensors)
  want_out, want_grads = _per_lane_keras(model, weights, x, y)
  for lane in range(L):
    np.testing.assert_allclose(out[lane], want_out[lane], rtol=1e-5, atol=1e-6)
    for g, want in zip(grads, want_grads[lane]):
      np.testing.assert_allclose(tf.convert_to_tensor(g)[lane], want, rtol=1e-5,
                                 atol=1e-5 * np.max(np.abs(want)))


@pytest.mark.parametrize('model, reason', [
    (lambda: _model(tf.keras.layers.GRU, reset_after=False), 'a GRU without reset_after'),
    (lambda: _model(tf.keras.layers.LSTM, dropout=0.1), 'has dropout'),
    (lambda: _model(tf.keras.layers.GRU, kernel_regularizer='l2'), 'has a regulariser'),
    (lambda: _model(tf.keras.layers.GRU, activation='relu'), 'other activations'),
    (lambda: tf.keras.Sequential([tf.keras.layers.Dense(3)]), 'no GRU or LSTM'),
    (lambda: tf.keras.Sequential([tf.keras.layers.Embedding(V, 2), tf.keras.layers.GRU(2),
                                  tf.keras.layers.Dropout(0.5)]), 'Dropout has no lane form'),
])
def test_models_outside_the_lane_form_say_why(model, reason):
  assert reason in lanes.why_not(model())
  with pytest.raises(ValueError, match=reason):
    lanes.LaneModel(model())
