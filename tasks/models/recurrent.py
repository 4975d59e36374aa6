"""GRU next-character models of the FedGBO paper, the decaying-K paper and the thesis.

* `create_gru_char_model(vocab_size=79, units=128)` is FedGBO paper Table 7 and
  thesis ch. 5-6: Embedding 79 -> 8, two stacked GRUs of 128 units, softmax
  output over 79 characters, predicting the character that follows an
  80-character LEAF sequence (the output of the last step). 162,887
  parameters: Keras' GRU with `reset_after=True` keeps separate input and
  recurrent biases, exactly as PyTorch's `nn.GRU` that the paper used.
* `units=256` is the decaying-K paper's Table 3 GRU (its stated 77-character vocabulary
  belongs to its own preprocessing; here the vocabulary is the task's).
* `create_gru_sequence_model` is the same architecture in the form TFF's
  Shakespeare task needs (a prediction at every position, padding masked), for
  the `shakespeare_character` task's GRU variants.

All return logits: use `SparseCategoricalCrossentropy(from_logits=True)`.
"""

import tensorflow as tf


def _layers(vocab_size: int, units: int, seed: int, return_sequences: bool,
            mask_zero: bool) -> list[tf.keras.layers.Layer]:
  # Seeded initialisers: identical initial weights in every process of a run.
  layers = tf.keras.layers
  glorot = lambda i: tf.keras.initializers.GlorotUniform(seed=seed * 16 + i)
  orthogonal = lambda i: tf.keras.initializers.Orthogonal(seed=seed * 16 + i)
  return [
      layers.Embedding(vocab_size, 8, mask_zero=mask_zero,
                       embeddings_initializer=tf.keras.initializers.RandomUniform(
                           -0.05, 0.05, seed=seed * 16)),
      layers.GRU(units, return_sequences=True, kernel_initializer=glorot(1),
                 recurrent_initializer=orthogonal(2)),
      layers.GRU(units, return_sequences=return_sequences, kernel_initializer=glorot(3),
                 recurrent_initializer=orthogonal(4)),
      layers.Dense(vocab_size, kernel_initializer=glorot(5)),
  ]


def create_gru_char_model(vocab_size: int = 79, sequence_length: int = 80, units: int = 128,
                          seed: int = 0) -> tf.keras.Model:
  """Next character after a sequence (LEAF Shakespeare); logits [batch, vocab]."""
  return tf.keras.Sequential(
      [tf.keras.layers.InputLayer(input_shape=(sequence_length,), dtype=tf.int32)] +
      _layers(vocab_size, units, seed, return_sequences=False, mask_zero=False))


def create_gru_sequence_model(vocab_size: int, sequence_length: int, units: int = 128,
                              seed: int = 0) -> tf.keras.Model:
  """Next character at every position, token 0 (padding) masked, as TFF's LSTM."""
  return tf.keras.Sequential(
      [tf.keras.layers.InputLayer(input_shape=(sequence_length,), dtype=tf.int64)] +
      _layers(vocab_size, units, seed, return_sequences=True, mask_zero=True))
