"""Per-round cost measurements for learning processes built by TFF's builders.

Processes built by our composer measure their own costs. TFF's Mimelite and
FedProx are wrapped instead: `with_cost_metrics` adds the same `cost/...`
measurements, computed from the algorithm's known traffic (in floats of the
model size) and from the `num_examples` / `num_batches` that TFF's training
metrics report, so curves of every algorithm can be drawn against bits and
FLOPs alike.
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


def num_trainable_params(process: tff.learning.templates.LearningProcess) -> int:
  weights_type = process.get_model_weights.type_signature.result
  return sum(int(np.prod(t.shape)) for t in _leaves(weights_type.trainable))


def model_weights_bits(process: tff.learning.templates.LearningProcess) -> int:
  """Bits of the whole `ModelWeights` a TFF builder broadcasts (non-trainable too)."""
  weights_type = process.get_model_weights.type_signature.result
  return sum(int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize * 8 for t in _leaves(weights_type))


def _leaves(type_spec):
  if isinstance(type_spec, tff.TensorType):
    yield type_spec
  else:
    for _, member in tff.structure.iter_elements(type_spec):
      yield from _leaves(member)


def with_cost_metrics(process: tff.learning.templates.LearningProcess, *,
                      download_floats: float, upload_floats: float,
                      client_state_floats: float, optimizer_flops_per_step: float,
                      fb_flops_per_example: float,
                      extra_passes: float = 0.0) -> tff.learning.templates.LearningProcess:
  """Returns `process` whose metrics also carry `cost/...` (see composer).

  Args:
    process: a TFF learning process whose metrics have
      `client_work/train/{num_examples,num_batches}`.
    download_floats, upload_floats: floats (32-bit) sent per client.
    client_state_floats: client optimiser memory in floats.
    optimizer_flops_per_step: C·|x|.
    fb_flops_per_example: forward+backward FLOPs per example.
    extra_passes: extra forward+backward passes over the trained examples
      (Mimelite's full-gradient pass: 1).
  """
  data_type = process.next.type_signature.parameter[1]

  @tff.tensorflow.computation(data_type.member)
  def one(dataset):
    del dataset
    return np.int32(1)

  @tff.tensorflow.computation(np.int64, np.int64, np.int32)
  def cost_fn(examples, batches, clients):
    clients = tf.maximum(tf.cast(clients, tf.float64), 1.0)
    flops = (tf.cast(examples, tf.float64) * fb_flops_per_example * (1.0 + extra_passes) +
             tf.cast(batches, tf.float64) * optimizer_flops_per_step)
    down, up = 32.0 * download_floats, 32.0 * upload_floats
    return collections.OrderedDict(
        download_bits_per_client=tf.constant(down, tf.float64),
        upload_bits_per_client=tf.constant(up, tf.float64),
        download_bits=down * clients, upload_bits=up * clients,
        client_steps=tf.cast(batches, tf.float64),
        client_flops=flops, client_flops_per_client=flops / clients,
        client_optimizer_state_floats=tf.constant(float(client_state_floats), tf.float64))

  @tff.federated_computation(process.next.type_signature.parameter)
  def next_fn(state, client_data):
    output = process.next(state, client_data)
    train = output.metrics.client_work.train
    cost = tff.federated_map(cost_fn, (
        tff.federated_map(_to_int64, train.num_examples),
        tff.federated_map(_to_int64, train.num_batches),
        tff.federated_sum(tff.federated_map(one, client_data))))
    metrics = collections.OrderedDict(
        (name, output.metrics[name]) for name in _names(process.next.type_signature.result[1]))
    metrics['cost'] = cost
    return tff.learning.templates.LearningProcessOutput(output.state, tff.federated_zip(metrics))

  return tff.learning.templates.LearningProcess(
      process.initialize, next_fn, process.get_model_weights, process.set_model_weights,
      get_hparams_fn=getattr(process, 'get_hparams', None),
      set_hparams_fn=getattr(process, 'set_hparams', None))


@tff.tensorflow.computation
def _to_int64(x):
  return tf.cast(x, tf.int64)


def _names(federated_struct_type):
  return [name for name, _ in tff.structure.iter_elements(federated_struct_type.member)]
