"""A client's passes on the model's variables (TFF's `VariableModel`).

What the per-client round runs its steps with (`per_client.client_update`),
and the evaluation of clients without training that both executions use
(`evaluate_computation`: an evaluation takes every client, which no shard
program needs): the gradient at given weights (`loss_and_grads`, `grad_at`)
and the `extension.ClientPasses` of the variables (`ModelPasses`).
"""

import collections
import collections.abc
import functools

import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.rounds import client as client_lib
from tff_adaptive.rounds import extension


class ModelPasses(extension.ClientPasses):
  """`extension.ClientPasses` on the model's variables, which hold the start weights."""

  def __init__(self, model, variables, start, learning_rate, iterate: bool, inputs, batches):
    self.model, self.start, self.learning_rate, self.iterate = model, start, learning_rate, iterate
    self.trainable = list(tf.nest.flatten(variables.trainable))
    self.every = self.trainable + list(tf.nest.flatten(variables.non_trainable))
    self.inputs = inputs  # the client's datasets by name: 'train'[, 'test']
    self.batches = batches  # what the steps read

  def over_batches(self, fn, carry):
    # Cached: a dataset that reshuffles at each iteration would otherwise give
    # the training loop other batches than the pass (TFF's Mime Lite iterates
    # its data twice). The pass's metrics are not the round's training
    # metrics: reset after it, as TFF's Mime Lite does.
    self.batches = self.batches.cache()
    for batch in (iter(self.batches) if self.iterate else self.batches):
      output, grads = loss_and_grads(self.model, self.trainable, batch)
      carry = fn(carry, grads, num_examples(output))
    self.model.reset_metrics()
    return carry

  def evaluate(self, personalize=None):
    """Every variable is restored after it (personalisation runs in training
    mode and may move batch-norm statistics, which the test then uses), and
    the model's metrics are reset: these passes are not training."""
    saved = [tf.identity(v) for v in self.every]
    if personalize is not None:
      # The iterator form, as in `client_update`: the dataset form (a reduce) cost
      # ~60 ms per client per round in TFF's executor on the bench's digits MLP.
      first = self.inputs['train'].take(1)
      for batch in (iter(first) if self.iterate else first):
        weights = personalize(functools.partial(grad_at, self.model, self.trainable, (batch,)))
        for v, w in zip(self.trainable, weights):
          v.assign(w)
    ua = client_lib.zero_user_accuracy()
    test = self.inputs['test']
    for batch in (iter(test) if self.iterate else test):
      output = self.model.forward_pass(batch, training=False)
      labels = batch['y'] if isinstance(batch, collections.abc.Mapping) else batch[1]
      ua = client_lib.add_user_accuracy(ua, labels, output.predictions, output.loss,
                                        tf.ones([tf.size(labels)]))
    for v, t in zip(self.every, saved):
      v.assign(t)
    self.model.reset_metrics()
    return ua


def grad_at(model, trainable, group, weights, j):
  """`grad_at` of the extensions' step context, on the model's variables (the next step
  assigns y again): its forward pass counts in the model's metrics."""
  for v, w in zip(trainable, weights):
    v.assign(w)
  output, grads = loss_and_grads(model, trainable, group[j])
  return grads, output.loss


def loss_and_grads(model, trainable, batch):
  with tf.GradientTape() as tape:
    output = model.forward_pass(batch, training=True)
  grads = tape.gradient(output.loss, trainable)
  return output, [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                  for g, v in zip(grads, trainable)]


def num_examples(output):
  if output.num_examples is None:  # as TFF's client loops count them
    return tf.shape(output.predictions, out_type=tf.int64)[0]
  return output.num_examples


def evaluate_computation(info, loop: client_lib.ClientLoop, data_type, state_type,
                         iterate: bool) -> tff.Computation:
  """(state, per-client inputs) → each client's OrderedDict(ua=...), no training:
  `PersonalizedClientsProcess.evaluate_clients` of both executions (an
  evaluation's clients are all the clients, which no shard program needs)."""

  @tff.tensorflow.computation(info.message_type, data_type)
  def client_eval_fn(message, data):
    model = info.client_model()

    @tf.function
    def evaluate(message, data):
      variables = tff.learning.models.ModelWeights.from_model(model)
      tf.nest.map_structure(lambda v, t: v.assign(t), variables, message['model_weights'])
      start = tuple([tf.identity(v) for v in tf.nest.flatten(weights)]
                    for weights in (variables.trainable, variables.non_trainable))
      return loop.measure(ModelPasses(model, variables, start,
                                       message['hparams']['learning_rate'], iterate, data,
                                       batches=None))

    return evaluate(message, data)

  @tff.federated_computation(state_type, tff.FederatedType(data_type, tff.CLIENTS))
  def evaluate_fn(state, client_data):
    message = tff.federated_broadcast(tff.federated_map(
        info.server_message_fn,
        (state.global_model_weights, state.finalizer, state.client_work)))
    return tff.federated_map(client_eval_fn, (message, client_data))

  return evaluate_fn
