"""`FederatedTask`: a TFF `BaselineTask` plus what our tooling needs beside it."""

import dataclasses
from collections.abc import Callable
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff


@dataclasses.dataclass
class FederatedTask:
  """A task as TFF defines it, with the Keras model exposed.

  Attributes:
    name: registry name (`--task`).
    baseline: the `tff.simulation.baselines.BaselineTask` (datasets with their
      preprocessing, and the TFF `model_fn`); it plugs in exactly where TFF's
      own tasks do.
    keras_model_fn: builds the (uncompiled) Keras model behind `model_fn`, for
      FLOP counting and fast centralized evaluation.
    num_classes: output classes (for metrics).
    test_client_data: per-client test split matched to the training split
      (same labels/shards), for per-client (user) accuracy; None if the task
      has no such split.
  """
  name: str
  baseline: tff.simulation.baselines.BaselineTask
  keras_model_fn: Callable[[], tf.keras.Model]
  num_classes: int
  test_client_data: Optional[tff.simulation.datasets.ClientData] = None

  @property
  def model_fn(self):
    return self.baseline.model_fn

  @property
  def train_data(self) -> tff.simulation.datasets.ClientData:
    return self.baseline.datasets.train_data

  def preprocess_train(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
    return self.baseline.datasets.train_preprocess_fn(dataset)

  def centralized_test_data(self) -> tf.data.Dataset:
    """Batched, preprocessed test data of all clients."""
    return self.baseline.datasets.get_centralized_test_data()
