"""FedMAX: FedAvg with a maximum-entropy penalty on penultimate activations.

Chen et al., "FedMAX: Mitigating Activation Divergence for Accurate and
Communication-Efficient Federated Learning", ECML-PKDD 2020; a baseline of
seed 000 (SPEC §3).

  client:  local SGD on  CE(y, f(x)) + β · KL(softmax(a) ‖ U),  a = the
           penultimate layer's activations, U uniform over a's units;
           Δ_i = x_t − y_K.
  server:  FedAvg (or any server optimiser) on Δ̄.
  network per client: down |x|, up |x|.

The penalty is added as a Keras activity loss on a pass-through layer in front
of the output layer; TFF's Keras model wrapper adds `model.losses` to the
training loss, so the rest is the FedOpt recipe unchanged.
"""

from collections.abc import Callable

import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.algorithms import fedopt_process


class MaxEntropyPenalty(tf.keras.layers.Layer):
  """Identity on `a`; adds β·KL(softmax(a) ‖ uniform) averaged over the batch."""

  def __init__(self, beta: float, **kwargs):
    super().__init__(**kwargs)
    self.beta = beta

  def call(self, activations):
    log_p = tf.nn.log_softmax(activations, axis=-1)
    num_units = tf.cast(tf.shape(activations)[-1], activations.dtype)
    kl = tf.reduce_sum(tf.exp(log_p) * log_p, axis=-1) + tf.math.log(num_units)
    self.add_loss(self.beta * tf.reduce_mean(kl))
    return activations


def with_max_entropy_penalty(keras_model: tf.keras.Model, beta: float) -> tf.keras.Model:
  """The same model (same layer objects) with the penalty before its last layer."""
  if not isinstance(keras_model, tf.keras.Sequential) or len(keras_model.layers) < 2:
    raise ValueError('FedMAX needs a Keras Sequential model with a penultimate layer')
  inputs = tf.keras.Input(shape=keras_model.input_shape[1:])
  x = inputs
  for layer in keras_model.layers[:-1]:
    x = layer(x)
  x = MaxEntropyPenalty(beta)(x)
  return tf.keras.Model(inputs, keras_model.layers[-1](x))


def fedmax_model_fn(keras_model_fn: Callable[[], tf.keras.Model], beta: float,
                    input_spec) -> Callable[[], tff.learning.models.VariableModel]:
  if beta < 0:
    raise ValueError(f'--fedmax_beta must be ≥ 0; got {beta}')

  def model_fn():
    return tff.learning.models.from_keras_model(
        with_max_entropy_penalty(keras_model_fn(), beta),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=input_spec, metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])

  return model_fn


def build_fedmax(keras_model_fn: Callable[[], tf.keras.Model], input_spec, *, beta: float,
                 client_learning_rate: float, server_optimizer=None, local_steps: int = 0,
                 client_weighting=None, model_aggregator=None,
                 fb_flops_per_example: float = 0.0) -> tff.learning.templates.LearningProcess:
  """FedMAX for a Keras classifier returning logits."""
  return fedopt_process.build_fedopt_process(
      fedmax_model_fn(keras_model_fn, beta, input_spec),
      server_optimizer=server_optimizer or tff.learning.optimizers.build_sgdm(1.0),
      client_learning_rate=client_learning_rate, local_steps=local_steps,
      client_weighting=client_weighting, model_aggregator=model_aggregator,
      fb_flops_per_example=fb_flops_per_example)
