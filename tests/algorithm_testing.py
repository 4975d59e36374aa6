"""Shared fixtures of the algorithm tests: a tiny linear-softmax model, its NumPy twin.

The model is one Keras Dense layer (D inputs → C logits) trained with mean
sparse softmax cross-entropy, so every gradient the learning processes compute
can be recomputed independently in NumPy (float64). Client datasets are
unshuffled `from_tensor_slices(...).batch(B)`, so the batches a client sees are
known: with K local steps the composer cycles the dataset (`np_batches`).
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

D, C = 5, 3  # features, classes
B = 4  # client batch size

_SPEC = collections.OrderedDict(x=tf.TensorSpec([None, D], tf.float32),
                                y=tf.TensorSpec([None], tf.int32))


def keras_model() -> tf.keras.Model:
  init = lambda seed: tf.keras.initializers.RandomNormal(stddev=0.5, seed=seed)
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(D,)),
      tf.keras.layers.Dense(C, kernel_initializer=init(1), bias_initializer=init(2))])


def model_fn() -> tff.learning.models.VariableModel:
  return tff.learning.models.from_keras_model(
      keras_model(), loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=_SPEC, metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])


def make_clients(sizes, seed=0):
  """Client arrays {x, y}; sizes that are not multiples of B give partial batches."""
  rng = np.random.default_rng(seed)
  clients = []
  for i, n in enumerate(sizes):
    x = rng.normal(loc=0.3 * i, size=(n, D)).astype(np.float32)  # heterogeneous inputs
    y = rng.integers(0, C, n).astype(np.int32)
    clients.append(collections.OrderedDict(x=x, y=y))
  return clients


def datasets(clients, batch_size=B, steps=None):
  """Unshuffled batched datasets; `steps` → TFF-builder form `.repeat().take(K)`."""
  out = []
  for c in clients:
    ds = tf.data.Dataset.from_tensor_slices(c).batch(batch_size)
    if steps:
      ds = ds.repeat().take(steps)
    out.append(ds)
  return out


def np_batches(client, steps, batch_size=B):
  """The batches a client trains on: K > 0 cycles through the data; 0 is one pass."""
  n = len(client['y'])
  one_pass = [(client['x'][i:i + batch_size].astype(np.float64), client['y'][i:i + batch_size])
              for i in range(0, n, batch_size)]
  if not steps:
    return one_pass
  return [one_pass[k % len(one_pass)] for k in range(steps)]


def np_grad(w, x, y):
  """Gradient of mean softmax cross-entropy of logits x W + b; w = [W, b]."""
  kernel, bias = w
  logits = x @ kernel + bias
  logits = logits - logits.max(axis=1, keepdims=True)
  p = np.exp(logits)
  p /= p.sum(axis=1, keepdims=True)
  p[np.arange(len(y)), y] -= 1.0
  return [x.T @ p / len(y), p.mean(axis=0)]


def np_loss(w, x, y):
  kernel, bias = w
  logits = x @ kernel + bias
  logits = logits - logits.max(axis=1, keepdims=True)
  logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
  return float(-logp[np.arange(len(y)), y].mean())


def np_sgd_client(x0, client, steps, lr):
  """K (or one epoch of) plain SGD steps; returns (y_K, examples seen, gradients)."""
  w = [a.copy() for a in x0]
  examples, grads = 0, []
  for xb, yb in np_batches(client, steps):
    g = np_grad(w, xb, yb)
    grads.append(g)
    w = [a - lr * b for a, b in zip(w, g)]
    examples += len(yb)
  return w, examples, grads


def weighted_mean(values, weights):
  """Σ w_i v_i / Σ w_i over lists of arrays."""
  weights = np.asarray(weights, np.float64) / np.sum(weights)
  return [sum(wi * v[j] for wi, v in zip(weights, values)) for j in range(len(values[0]))]


def trainable(process, state):
  return [np.asarray(t, np.float64) for t in process.get_model_weights(state).trainable]


def flat(structure):
  return [np.asarray(t, np.float64) for t in tf.nest.flatten(structure)]


def assert_close(actual, expected, rtol=1e-5, atol=1e-6, what=''):
  actual, expected = list(actual), list(expected)
  assert len(actual) == len(expected), what
  for a, e in zip(actual, expected):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(e, np.float64),
                               rtol=rtol, atol=atol, err_msg=what)


def max_abs_diff(a, b):
  return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
             for x, y in zip(a, b))


def optimizer_computations(optimizer, specs):
  """(initialize, next) of a `tff.learning.optimizers.Optimizer` as TFF computations."""
  weights_type = tff.to_type(tf.nest.map_structure(
      lambda s: tff.TensorType(s.dtype.as_numpy_dtype, s.shape), specs))

  @tff.tensorflow.computation
  def initialize():
    return optimizer.initialize(specs)

  @tff.tensorflow.computation(initialize.type_signature.result, weights_type, weights_type)
  def next_fn(state, weights, gradients):
    return optimizer.next(state, weights, gradients)

  return initialize, next_fn


def np_second_moment(kind: str, v, d, beta_2: float):
  """FedOpt Algorithm 2's v_t from v_{t−1} and the update d (adagrad, adam or yogi)."""
  if kind == 'adagrad':
    return v + d**2
  if kind == 'adam':
    return beta_2 * v + (1 - beta_2) * d**2
  return v - (1 - beta_2) * d**2 * np.sign(v - d**2)  # yogi
