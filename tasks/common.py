"""Shared plumbing for tasks built from in-memory NumPy client data."""

import collections
from collections.abc import Callable, Mapping

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

ClientArrays = Mapping[str, Mapping[str, np.ndarray]]


def client_data_from_arrays(clients: ClientArrays) -> tff.simulation.datasets.ClientData:
  """A `ClientData` over `{client_id: {'x': ..., 'y': ...}}` held in host memory.

  TFF's in-memory `TestClientData` is the right container for small offline
  tasks: datasets are built per client on demand, and it has a serializable
  dataset function, so it also works with worker-side dataset computations.
  """
  return tff.simulation.datasets.TestClientData({
      cid: collections.OrderedDict(x=arrays['x'].astype(np.float32),
                                   y=arrays['y'].astype(np.int32))
      for cid, arrays in sorted(clients.items())})


def make_preprocess_fn(batch_size: int, num_epochs: int, shuffle_seed: int,
                       shuffle_buffer: int = 1000) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
  """Shuffle (seeded, reshuffled each pass) -> repeat(epochs) -> batch.

  The seed makes client datasets deterministic, which is what lets a resumed
  run reproduce an uninterrupted one exactly.
  """

  def preprocess(ds: tf.data.Dataset) -> tf.data.Dataset:
    ds = ds.shuffle(shuffle_buffer, seed=shuffle_seed, reshuffle_each_iteration=True)
    return ds.repeat(num_epochs).batch(batch_size)

  return preprocess


def centralized(clients: ClientArrays) -> dict[str, np.ndarray]:
  ids = sorted(clients)
  return {k: np.concatenate([clients[c][k] for c in ids]) for k in ('x', 'y')}


def label_histograms(clients: ClientArrays, num_classes: int) -> np.ndarray:
  return np.stack([np.bincount(clients[c]['y'], minlength=num_classes)
                   for c in sorted(clients)])


def baseline_datasets(train, test, train_preprocess_fn, eval_preprocess_fn):
  """TFF's `BaselineTaskDatasets` without validation data (no task here has any)."""
  return tff.simulation.baselines.BaselineTaskDatasets(
      train_data=train, test_data=test, validation_data=None,
      train_preprocess_fn=train_preprocess_fn, eval_preprocess_fn=eval_preprocess_fn)


def classifier_model_fn(build_keras_model: Callable[[], tf.keras.Model], input_spec,
                        from_logits: bool = True) -> Callable[[], tff.learning.models.VariableModel]:
  """A TFF `model_fn` for a Keras classifier: sparse cross-entropy and accuracy."""

  def model_fn():
    return tff.learning.models.from_keras_model(
        build_keras_model(),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits),
        input_spec=input_spec,
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])

  return model_fn


def keras_model_fn(build_keras_model: Callable[[], tf.keras.Model],
                   element_spec) -> Callable[[], tff.learning.models.VariableModel]:
  """A TFF `model_fn` for a classifier taking batches of (x, y)."""
  batched_spec = collections.OrderedDict(
      x=tf.TensorSpec([None] + list(element_spec['x'].shape), tf.float32),
      y=tf.TensorSpec([None], tf.int32))
  return classifier_model_fn(build_keras_model, batched_spec)
