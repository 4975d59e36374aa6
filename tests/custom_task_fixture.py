"""A user-defined task outside `tasks/`: `bin/train.py --task=tests.custom_task_fixture:make_task`.

The protocol (docs/tasks.md, "Your own task"): a function whose parameters name
what it reads (bin/train's task flags such as `num_clients` or `data_dir`, and
the run's `batch_size`, `num_epochs`, `seed`, `run_dir`; none at all is fine)
and returns a `tasks.base.FederatedTask`. This one is
what a user would write from scratch with TFF alone: four clients holding two
Gaussian blobs each (3 classes in 2-D), a softmax-regression Keras model.
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import base

NUM_CLASSES = 3


def _clients(seed: int, num_clients: int, per_client: int):
  rng = np.random.default_rng(seed)
  centers = np.array([[2.0, 0.0], [-1.0, 1.7], [-1.0, -1.7]], np.float32)
  data = collections.OrderedDict()
  for c in range(num_clients):
    y = rng.integers(NUM_CLASSES, size=per_client).astype(np.int32)
    x = (centers[y] + rng.normal(scale=0.5, size=(per_client, 2))).astype(np.float32)
    data[f'user_{c}'] = collections.OrderedDict(x=x, y=y)
  return tff.simulation.datasets.TestClientData(data)


def _keras_model() -> tf.keras.Model:
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(2,)),
      tf.keras.layers.Dense(NUM_CLASSES,
                            kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1)),
  ])


def make_task(batch_size: int, seed: int) -> base.FederatedTask:
  """Called by bin/train with the two arguments it names: --client_batch_size and --seed."""
  train, test = _clients(seed, 4, 30), _clients(seed + 1, 4, 10)

  def preprocess(dataset):
    return dataset.shuffle(64, seed=seed).batch(batch_size)

  datasets = tff.simulation.baselines.BaselineTaskDatasets(
      train_data=train, test_data=test, validation_data=None,
      train_preprocess_fn=preprocess, eval_preprocess_fn=lambda ds: ds.batch(64))
  input_spec = collections.OrderedDict(x=tf.TensorSpec([None, 2], tf.float32),
                                       y=tf.TensorSpec([None], tf.int32))

  def model_fn():
    return tff.learning.models.from_keras_model(
        _keras_model(), loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=input_spec, metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])

  return base.FederatedTask(
      name='blobs', baseline=tff.simulation.baselines.BaselineTask(datasets, model_fn),
      keras_model_fn=_keras_model, num_classes=NUM_CLASSES)
