"""What bench/run.py times: the algorithms, the settings, raw compute and the rounds.

A setting is a model and a round shape (C clients × K steps × batch B, the
models and their synthetic data in bench_models.py); raw compute is one
`tf.function` doing the round's minibatch steps; a Runner drives one
algorithm's process, its client data passed from Python or built on the
executor from client seeds. Importing this module puts the checkout on
sys.path (the bench scripts run as files).
"""

import collections
import os
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Its siblings, also when imported as `bench.bench_rounds`.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# pylint: disable=g-import-not-at-top
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

import bench_cohort
import bench_models
from workflow.training import algorithm_builders as registry

LEARNING_RATE = 0.02

# Registry name and config per benchmarked algorithm (equal local work: K steps).
ALGORITHMS = collections.OrderedDict([
    ('fedavg', ('fedavg', {})),
    ('fedadam', ('fedadam', {'server_learning_rate': 0.01})),
    ('fedgbo-adam', ('fedgbo', {'client_optimizer': 'adam'})),
    ('mfl-adam', ('mfl', {'client_optimizer': 'adam'})),
    ('fedada2-sm3', ('fedada2', {'client_optimizer': 'sm3_adam'})),
    ('mimelite', ('mimelite', {'client_optimizer': 'adam'})),
    ('fedprox', ('fedprox', {})),
    ('perfedavg', ('perfedavg', {})),
    ('pfedme', ('pfedme', {})),
    ('mtfl', ('mtfl', {})),  # private batch-norm patches: the mlp_bn settings
])
TFF_REFERENCE = 'tff_fedavg'
# Clients that also measure user accuracy: asked for by --algorithms only (their
# rounds read a test split: here each client's training batches, the timing's
# only concern), in the `python` data mode (their input is not a dataset alone).
PERSONALISED = ('perfedavg', 'pfedme', 'mtfl')


# ---------------------------------------------------------------------------
# Models and data (bench_models.py).

# name → ModelSpec (keras builder, example and label shapes and dtypes, classes)
MODELS = bench_models.MODELS

# The benchmark settings: --setting=NAME → (model, clients, local steps, batch).
SETTINGS = collections.OrderedDict([
    ('mlp_50x10', ('mlp', 50, 10, 20)),
    ('mlp_bn_50x10', ('mlp_bn', 50, 10, 20)),  # MTFL's (batch-norm patches)
    ('mlp_5x100', ('mlp', 5, 100, 20)),
    ('mlp_200x10', ('mlp', 200, 10, 20)),
    ('so_lr', ('so_lr', 10, 10, 20)),
    ('cnn', ('cnn', 10, 10, 20)),
    ('gru', ('gru', 10, 10, 4)),
])


class Setting:
  """A model and a round shape: C clients × K steps × batch B."""

  def __init__(self, model: str, clients: int, steps: int, batch: int):
    self.model, self.clients, self.steps, self.batch = model, clients, steps, batch
    self.spec = MODELS[model]
    self.keras_fn, self.shape, self.classes = self.spec.keras_fn, self.spec.x_shape, self.spec.classes
    self.input_spec = (tf.TensorSpec((None,) + self.shape, self.spec.x_dtype),
                       tf.TensorSpec((None,) + self.spec.y_shape, self.spec.y_dtype))

  def loss_fn(self) -> tf.keras.losses.Loss:
    return bench_models.loss_fn(self.spec)

  def model_fn(self) -> tff.learning.models.VariableModel:
    return tff.learning.models.from_keras_model(
        self.keras_fn(), input_spec=self.input_spec, loss=self.loss_fn(),
        metrics=bench_models.metrics(self.spec))

  def task(self):
    # The registry's builders read model_fn, keras_model_fn and name only.
    return types.SimpleNamespace(name=f'bench_{self.model}', model_fn=self.model_fn,
                                 keras_model_fn=self.keras_fn)

  def client_tensors(self, seed):
    """Client `seed`'s K·B examples (also traced inside the executor's dataset fn)."""
    return bench_models.examples(self.spec, seed, self.steps * self.batch)

  def client_dataset(self, seed) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(self.client_tensors(seed)).batch(self.batch)

  def python_datasets(self):
    return [self.client_dataset(c) for c in range(self.clients)]

  def seeds(self):
    return [np.int32(c) for c in range(self.clients)]


def build_raw(setting: Setting):
  """The compute limit: a plain tf.function doing the round's minibatch steps."""
  model = setting.keras_fn()
  loss_fn = setting.loss_fn()
  variables = model.trainable_variables
  initial = [tf.constant(v.numpy()) for v in variables]
  xs, ys = zip(*(setting.client_tensors(c) for c in range(setting.clients)))
  b = setting.batch
  x = tf.reshape(tf.stack(xs), (setting.clients, setting.steps, b) + setting.shape)
  y = tf.reshape(tf.stack(ys), (setting.clients, setting.steps, b) + setting.spec.y_shape)

  @tf.function
  def raw_round():
    for c in tf.range(setting.clients):
      for v, w in zip(variables, initial):
        v.assign(w)
      for k in tf.range(setting.steps):
        with tf.GradientTape() as tape:
          loss = loss_fn(y[c, k], model(x[c, k], training=True))
        for v, g in zip(variables, tape.gradient(loss, variables)):
          v.assign_sub(LEARNING_RATE * tf.convert_to_tensor(g))  # Embedding grads are IndexedSlices
    return loss

  return lambda: raw_round().numpy()


def build_raw_pipeline(setting: Setting):
  """Raw compute fed by tf.data: the same steps, each client's batches read from
  `from_tensor_slices(client examples).batch(B)` (the rounds' own pipeline,
  `Setting.client_dataset`) inside the same `tf.function`, so that round ÷
  raw_pipeline is the executor's cost alone and raw_pipeline ÷ raw the data
  pipeline's."""
  model = setting.keras_fn()
  loss_fn = setting.loss_fn()
  variables = model.trainable_variables
  initial = [tf.constant(v.numpy()) for v in variables]
  xs, ys = zip(*(setting.client_tensors(c) for c in range(setting.clients)))
  clients = tf.data.Dataset.from_tensor_slices((tf.stack(xs), tf.stack(ys)))

  @tf.function
  def raw_round():
    loss = tf.constant(0.0)
    for xc, yc in clients:
      for v, w in zip(variables, initial):
        v.assign(w)
      for xb, yb in iter(tf.data.Dataset.from_tensor_slices((xc, yc)).batch(setting.batch)):
        with tf.GradientTape() as tape:
          loss = loss_fn(yb, model(xb, training=True))
        for v, g in zip(variables, tape.gradient(loss, variables)):
          v.assign_sub(LEARNING_RATE * tf.convert_to_tensor(g))  # Embedding grads are IndexedSlices
    return loss

  return lambda: raw_round().numpy()


def build_process(name: str, setting: Setting):
  if name == TFF_REFERENCE:
    return tff.learning.algorithms.build_weighted_fed_avg(
        setting.model_fn,
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(LEARNING_RATE),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0))
  algorithm, _ = ALGORITHMS[name]
  return registry.build(setting.task(), run_config(name, setting))


def run_config(name: str, setting: Setting):
  from workflow.flags import config  # pylint: disable=g-import-not-at-top
  algorithm, extra = ALGORITHMS[name]
  # per client, as the flag dict without --execution was built (bench_cohort builds cohorts)
  return config.from_flags(dict(algorithm=algorithm, client_learning_rate=LEARNING_RATE,
                                local_steps=setting.steps, execution='per_client', **extra))


class Runner:
  """One process driven one way ('python' datasets or client 'ids')."""

  def __init__(self, name: str, setting: Setting, data: str):
    t0 = time.perf_counter()
    process = build_process(name, setting)
    if data == 'ids':
      @tff.tensorflow.computation(tf.int32)
      def dataset_fn(seed):
        return setting.client_dataset(seed)
      process = tff.simulation.compose_dataset_computation_with_learning_process(
          dataset_fn, process)
      self.client_data = setting.seeds
    elif name in PERSONALISED:
      inputs = [process.client_input(d, bench_cohort.initial_private_state(process), test=d)
                for d in setting.python_datasets()]
      self.client_data = lambda: inputs
    else:
      datasets = setting.python_datasets()
      self.client_data = lambda: datasets
    self.build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    self.state = process.initialize()
    self.init_s = time.perf_counter() - t0
    self.initial_state = self.state
    self.process = process
    self.first_round_s = None
    self.first_state = None

  def __call__(self):
    out = self.process.next(self.state, self.client_data())
    self.state = out.state
    return out.metrics

  def first(self):
    bench_cohort.first_round(self)

