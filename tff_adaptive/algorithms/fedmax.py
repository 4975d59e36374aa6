"""FedMAX: FedAvg with a maximum-entropy penalty on penultimate activations.

Chen et al., "FedMAX: Mitigating Activation Divergence for Accurate and
Communication-Efficient Federated Learning", ECML-PKDD 2020; a baseline of
the FedGBO paper (docs/algorithms.md#fedmax).

  client:  local SGD on  CE(y, f(x)) + β · KL(softmax(a) ‖ U),  a = the
           penultimate layer's activations, U uniform over a's units;
           Δ_i = x_t − y_K.
  server:  FedAvg (or any server optimiser) on Δ̄.
  network per client: down |x|, up |x|.

The model returns [logits, a] and the loss splits them (see
`with_penultimate_output`); the rest is the FedOpt recipe unchanged. Its
trainable weights are the original model's, in the same order.
"""

from collections.abc import Callable
from typing import Any, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive import errors
from tff_adaptive.accounting import costs
from tff_adaptive.algorithms import fedopt


def max_entropy_kl(activations: tf.Tensor) -> tf.Tensor:
  """KL(softmax(a) ‖ uniform) per example."""
  log_p = tf.nn.log_softmax(activations, axis=-1)
  num_units = tf.cast(tf.shape(activations)[-1], activations.dtype)
  return tf.reduce_sum(tf.exp(log_p) * log_p, axis=-1) + tf.math.log(num_units)


class FedMaxLoss(tf.keras.losses.Loss):
  """CE on the logits part of y_pred + β·KL on the activations part."""

  def __init__(self, num_classes: int, beta: float, name: str = 'fedmax_loss'):
    super().__init__(name=name)
    self.num_classes, self.beta = num_classes, beta

  def call(self, y_true, y_pred):
    logits, activations = y_pred[:, :self.num_classes], y_pred[:, self.num_classes:]
    ce = tf.keras.losses.sparse_categorical_crossentropy(y_true, logits, from_logits=True)
    return ce + self.beta * max_entropy_kl(activations)


class LogitsAccuracy(tf.keras.metrics.SparseCategoricalAccuracy):
  """Accuracy of the logits part of y_pred."""

  def __init__(self, num_classes: int, name: str = 'sparse_categorical_accuracy', **kwargs):
    super().__init__(name=name, **kwargs)
    self.num_classes = num_classes

  def update_state(self, y_true, y_pred, sample_weight=None):
    return super().update_state(y_true, y_pred[:, :self.num_classes], sample_weight)

  def get_config(self):
    return {**super().get_config(), 'num_classes': self.num_classes}


def with_penultimate_output(keras_model: tf.keras.Model) -> tf.keras.Model:
  """The same layers, returning concat([logits, penultimate activations]).

  The penalty needs the activations inside the loss; TFF's Keras wrapper only
  passes (y, y_pred) to the loss, and Keras activity losses on reused layers
  leak graph tensors under TFF, so the activations travel in y_pred.
  """
  if not isinstance(keras_model, tf.keras.Sequential) or len(keras_model.layers) < 2:
    raise ValueError('FedMAX needs a Keras Sequential model with a penultimate layer')
  inputs = tf.keras.Input(shape=keras_model.input_shape[1:])
  x = inputs
  for layer in keras_model.layers[:-1]:
    x = layer(x)
  logits = keras_model.layers[-1](x)
  return tf.keras.Model(inputs, tf.concat([logits, tf.reshape(x, [-1, x.shape[-1]])], axis=-1))


def fedmax_model_fn(keras_model_fn: Callable[[], tf.keras.Model], beta: float,
                    input_spec) -> Callable[[], tff.learning.models.VariableModel]:
  if beta < 0:
    raise errors.ArgumentError('fedmax', 'beta', f'must be ≥ 0; got {beta}')

  def model_fn():
    keras_model = keras_model_fn()
    num_classes = keras_model.output_shape[-1]
    return tff.learning.models.from_keras_model(
        with_penultimate_output(keras_model), loss=FedMaxLoss(num_classes, beta),
        input_spec=input_spec, metrics=[LogitsAccuracy(num_classes)])

  return model_fn


def build_fedmax(keras_model_fn: Callable[[], tf.keras.Model], input_spec,
                 client_optimizer_fn: tff.learning.optimizers.Optimizer,
                 server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None, *,
                 beta: float, local_steps: int = 0, client_weighting=None,
                 model_distributor=None, model_aggregator=None, metrics_aggregator=None,
                 loop_implementation=None, upload_compression=None,
                 fb_flops_per_example: Optional[float] = None,
                 **options: Any) -> tff.learning.templates.LearningProcess:
  """FedMAX for a Keras classifier returning logits.

  Unlike the other builders, FedMAX takes a Keras model function and the
  input spec instead of `model_fn`: the penalty needs the penultimate
  activations, so it rebuilds the model (`with_penultimate_output`) and wraps
  it itself. The rest is `fedopt.build_fedopt` (client optimiser, server
  optimiser — default `build_sgdm(1.0)` — and keywords; `**options` are
  the other `composer.RoundOptions` fields, e.g. `measure_client_drift`,
  `execution`).
  """
  if fb_flops_per_example is None:
    # The model FedOpt sees returns [logits, a]; count the classifier itself.
    fb_flops_per_example = costs.count_fb_flops(keras_model_fn(), 'fedmax')
  return fedopt.build_fedopt(
      fedmax_model_fn(keras_model_fn, beta, input_spec), client_optimizer_fn, server_optimizer_fn,
      local_steps=local_steps, client_weighting=client_weighting,
      model_distributor=model_distributor, model_aggregator=model_aggregator,
      metrics_aggregator=metrics_aggregator, loop_implementation=loop_implementation,
      upload_compression=upload_compression, fb_flops_per_example=fb_flops_per_example,
      algorithm='fedmax', **options)
