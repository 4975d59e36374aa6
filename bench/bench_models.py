"""The benchmark's models and their synthetic client data (bench/run.py).

Each model is the shape of a task the papers run for many rounds:

  linear  synthetic multinomial logistic regression (tasks/synthetic.py)
  mlp     the digits MLP (tasks/digits.py)
  mlp_bn  the digits MLP with batch norm after its hidden layer: MTFL's rows
          (its private patches are batch-norm values; on dense inputs Keras'
          batch norm is not fused, so the cohort program computes it)
  cnn     the EMNIST-shaped CNN (TFF's emnist_character model)
  so_lr   Stack-Overflow-LR shaped: one Dense 10,000 → 500 with sigmoid outputs,
          multi-hot tags, binary cross-entropy (TFF's stackoverflow_tag model)
  gru     the Shakespeare GRU: Embedding 90 → 8, 2 × GRU 128, a prediction at
          each of 80 positions (tasks/models/recurrent.py's sequence model)

Every initialiser is seeded: all processes and the raw loops of one run start
from the same weights. The GRU has no `mask_zero`: its synthetic tokens are
never 0 (padding), and TFF's forward pass drops the Keras mask anyway
(tff_adaptive/rounds/functional.py), so without it the raw loop does exactly
the rounds' arithmetic.

Client c's examples are `tf.random.stateless_*` draws seeded by c, so the
executor can rebuild them from the seed alone (bench/run.py's `ids` mode).
"""

import collections

import tensorflow as tf

from tasks import digits
from tasks import synthetic

SO_LR_WORDS, SO_LR_TAGS = 10_000, 500
# Words per Stack Overflow example and tags per example, roughly TFF's data.
SO_LR_WORD_RATE, SO_LR_TAG_RATE = 0.01, 0.006
GRU_VOCAB, GRU_SEQUENCE, GRU_UNITS = 90, 80, 128

_glorot = lambda i: tf.keras.initializers.GlorotUniform(seed=i)


def emnist_cnn() -> tf.keras.Model:
  """EMNIST-shaped CNN: conv32-conv64-pool-FC128-FC62 (TFF's emnist_character)."""
  layers = tf.keras.layers
  return tf.keras.Sequential([
      layers.InputLayer(input_shape=(28, 28, 1)),
      layers.Conv2D(32, 3, activation='relu', kernel_initializer=_glorot(1)),
      layers.Conv2D(64, 3, activation='relu', kernel_initializer=_glorot(2)),
      layers.MaxPool2D(2), layers.Flatten(),
      layers.Dense(128, activation='relu', kernel_initializer=_glorot(3)),
      layers.Dense(62, kernel_initializer=_glorot(4))])


def digits_mlp_bn() -> tf.keras.Model:
  layers = tf.keras.layers
  return tf.keras.Sequential([
      layers.InputLayer(input_shape=(8, 8, 1)), layers.Reshape((-1,)),
      layers.Dense(64, kernel_initializer=_glorot(1)), layers.BatchNormalization(),
      layers.ReLU(), layers.Dense(digits.NUM_CLASSES, kernel_initializer=_glorot(9))])


def so_lr() -> tf.keras.Model:
  """TFF's Stack Overflow tag-prediction logistic regression."""
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(SO_LR_WORDS,)),
      tf.keras.layers.Dense(SO_LR_TAGS, activation='sigmoid', kernel_initializer=_glorot(1))])


def shakespeare_gru() -> tf.keras.Model:
  layers = tf.keras.layers
  orthogonal = lambda i: tf.keras.initializers.Orthogonal(seed=i)
  return tf.keras.Sequential([
      layers.InputLayer(input_shape=(GRU_SEQUENCE,), dtype=tf.int32),
      layers.Embedding(GRU_VOCAB, 8,
                       embeddings_initializer=tf.keras.initializers.RandomUniform(
                           -0.05, 0.05, seed=0)),
      layers.GRU(GRU_UNITS, return_sequences=True, kernel_initializer=_glorot(1),
                 recurrent_initializer=orthogonal(2)),
      layers.GRU(GRU_UNITS, return_sequences=True, kernel_initializer=_glorot(3),
                 recurrent_initializer=orthogonal(4)),
      layers.Dense(GRU_VOCAB, kernel_initializer=_glorot(5))])


ModelSpec = collections.namedtuple(
    'ModelSpec', 'keras_fn x_shape x_dtype y_shape y_dtype classes multi_hot')

MODELS = {
    'linear': ModelSpec(synthetic.build_keras_model, (synthetic.DIM,), tf.float32, (), tf.int32,
                        synthetic.NUM_CLASSES, False),
    'mlp': ModelSpec(lambda: digits.build_keras_model('mlp'), (8, 8, 1), tf.float32, (),
                     tf.int32, digits.NUM_CLASSES, False),
    'mlp_bn': ModelSpec(digits_mlp_bn, (8, 8, 1), tf.float32, (), tf.int32, digits.NUM_CLASSES,
                        False),
    'cnn': ModelSpec(emnist_cnn, (28, 28, 1), tf.float32, (), tf.int32, 62, False),
    'so_lr': ModelSpec(so_lr, (SO_LR_WORDS,), tf.float32, (SO_LR_TAGS,), tf.float32,
                       SO_LR_TAGS, True),
    'gru': ModelSpec(shakespeare_gru, (GRU_SEQUENCE,), tf.int32, (GRU_SEQUENCE,), tf.int32,
                     GRU_VOCAB, False),
}


def loss_fn(spec: ModelSpec) -> tf.keras.losses.Loss:
  if spec.multi_hot:
    return tf.keras.losses.BinaryCrossentropy()
  return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def metrics(spec: ModelSpec) -> list:
  if spec.multi_hot:  # TFF's stackoverflow_tag metrics
    return [tf.keras.metrics.Precision(name='precision'),
            tf.keras.metrics.Recall(top_k=5, name='recall_at_5')]
  return [tf.keras.metrics.SparseCategoricalAccuracy()]


def examples(spec: ModelSpec, seed, n: int):
  """n synthetic examples of client `seed` (traceable: the executor rebuilds them)."""
  seed = tf.stack([tf.cast(seed, tf.int32), tf.constant(17, tf.int32)])
  if spec.multi_hot:  # a normalised bag of words, a multi-hot tag vector
    words = tf.cast(tf.random.stateless_uniform((n,) + spec.x_shape, seed=seed)
                    < SO_LR_WORD_RATE, tf.float32)
    x = words / tf.maximum(tf.reduce_sum(words, axis=1, keepdims=True), 1.0)
    y = tf.cast(tf.random.stateless_uniform((n,) + spec.y_shape, seed=seed + 1)
                < SO_LR_TAG_RATE, tf.float32)
    return x, y
  if spec.x_dtype.is_integer:  # tokens 1..V-1: 0 is padding
    x = tf.random.stateless_uniform((n,) + spec.x_shape, seed=seed, minval=1,
                                    maxval=spec.classes, dtype=spec.x_dtype)
  else:
    x = tf.random.stateless_uniform((n,) + spec.x_shape, seed=seed)
  y = tf.random.stateless_uniform((n,) + spec.y_shape, seed=seed + 1, maxval=spec.classes,
                                  dtype=spec.y_dtype)
  return x, y
