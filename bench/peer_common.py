"""What every framework's worker of bench/peers.py shares: settings, models, data, raw loop.

Imported in the package's environment (TensorFlow 2.14, Keras 2) and in each
peer's own environment (pfl-research: TensorFlow >= 2.16, Keras 3), so it
uses only TensorFlow and NumPy, in the subset of the Keras API both versions
share (`tf.keras.Input` instead of `InputLayer(input_shape=...)`, layers
without version-specific arguments).

The same work in every framework comes from one file per setting
(`write_setting_data`, run once in the package's environment): the initial
weights of the model (its seeded initialisers, in `model.get_weights()`
order, which is the same in Keras 2 and 3 for these Sequential models) and
every client's examples, `x[c]`, `y[c]` with K·B rows. Each worker builds
the model with its own Keras, sets those weights, trains on those rows in
order (no shuffling anywhere) and reports the loss of its final global
weights on all clients' examples (`loss_of`).
"""

import collections
import json
import time

import numpy as np

try:
  import tensorflow as tf
except ImportError:  # a peer environment without TensorFlow (FedJAX): the data only
  tf = None

# setting → model, clients per round, local steps (K), batch (B), client and
# server learning rates. Every client has exactly K·B examples, so K steps of
# batch B are one local epoch: pfl-research's `local_num_epochs=1` and the
# package's `local_steps=K` train on the same batches.
Setting = collections.namedtuple('Setting', 'model clients steps batch client_lr server_lr')

SETTINGS = collections.OrderedDict([
    ('mlp_50x10', Setting('mlp', 50, 10, 20, 0.02, 1.0)),
    ('cnn_10x10', Setting('cnn', 10, 10, 20, 0.02, 1.0)),
    ('gru_10x10', Setting('gru', 10, 10, 4, 0.02, 1.0)),
    # pfl-research's CIFAR-10 benchmark (benchmarks/image_classification,
    # configs/baseline.yaml): 50 users per round with 50 images each, one
    # local epoch of batch 10, its `simple_cnn`, local learning rate 0.1.
    ('cifar10_50x5', Setting('cifar_cnn', 50, 5, 10, 0.1, 1.0)),
])

GRU_VOCAB, GRU_SEQUENCE = 90, 80
# Input shape, input dtype, label shape, classes.
SHAPES = {
    'mlp': ((8, 8, 1), 'float32', (), 10),
    'cnn': ((28, 28, 1), 'float32', (), 62),
    'gru': ((GRU_SEQUENCE,), 'int32', (GRU_SEQUENCE,), GRU_VOCAB),
    'cifar_cnn': ((32, 32, 3), 'float32', (), 10),
}


def build_model(model: str):
  """The setting's Keras model, seeded (the same architectures as bench_models.py;
  `cifar_cnn` is pfl-research's `simple_cnn`, dropout included)."""
  layers = tf.keras.layers
  glorot = lambda i: tf.keras.initializers.GlorotUniform(seed=i)
  shape, dtype, _, classes = SHAPES[model]
  if model == 'mlp':  # tasks/digits.py's MLP
    body = [layers.Flatten(), layers.Dense(64, activation='relu', kernel_initializer=glorot(1))]
  elif model in ('cnn', 'cifar_cnn'):
    body = [layers.Conv2D(32, 3, activation='relu', kernel_initializer=glorot(1)),
            layers.Conv2D(64, 3, activation='relu', kernel_initializer=glorot(2)),
            layers.MaxPool2D(2)]
    body += [layers.Dropout(0.25)] if model == 'cifar_cnn' else []
    body += [layers.Flatten(), layers.Dense(128, activation='relu', kernel_initializer=glorot(3))]
    body += [layers.Dropout(0.5)] if model == 'cifar_cnn' else []
  elif model == 'gru':  # the Shakespeare GRU, without mask_zero (bench_models.py says why)
    orthogonal = lambda i: tf.keras.initializers.Orthogonal(seed=i)
    body = [layers.Embedding(GRU_VOCAB, 8, embeddings_initializer=(
        tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=0)))]
    body += [layers.GRU(128, return_sequences=True, kernel_initializer=glorot(2 * i + 1),
                        recurrent_initializer=orthogonal(2 * i + 2)) for i in range(2)]
  else:
    raise ValueError(f'unknown model {model!r}')
  return tf.keras.Sequential([tf.keras.Input(shape=shape, dtype=dtype)] + body +
                             [layers.Dense(classes, kernel_initializer=glorot(9))])


def loss_fn():
  return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def write_setting_data(path: str, name: str, setting: Setting, seed: int = 0) -> dict:
  """The initial weights and every client's examples of `setting`, in `path` (.npz)."""
  shape, dtype, label_shape, classes = SHAPES[setting.model]
  rng = np.random.default_rng(seed)
  rows = setting.steps * setting.batch
  if dtype == 'int32':  # tokens 1..V-1 (0 would be padding)
    x = rng.integers(1, classes, (setting.clients, rows) + shape, dtype=np.int32)
  else:
    x = rng.random((setting.clients, rows) + shape, dtype=np.float32)
  y = rng.integers(0, classes, (setting.clients, rows) + label_shape, dtype=np.int32)
  weights = build_model(setting.model).get_weights()
  meta = dict(name=name, **setting._asdict())
  np.savez(path, x=x, y=y, meta=json.dumps(meta),
           **{f'w{i}': w for i, w in enumerate(weights)})
  return meta


class SettingData:
  """A setting's file: `setting`, `x`, `y` ([clients, K·B, ...]) and `weights`."""

  def __init__(self, path: str):
    self.path = path
    with np.load(path) as f:
      meta = json.loads(str(f['meta']))
      self.name = meta.pop('name')
      self.setting = Setting(**meta)
      self.x, self.y = f['x'], f['y']
      count = sum(1 for k in f.files if k.startswith('w'))
      self.weights = [f[f'w{i}'] for i in range(count)]

  def model(self):
    model = build_model(self.setting.model)
    model.set_weights(self.weights)
    return model

  def client_batches(self, c: int):
    """Client c's K batches (x, y), in order."""
    s = self.setting
    return [(self.x[c, k * s.batch:(k + 1) * s.batch], self.y[c, k * s.batch:(k + 1) * s.batch])
            for k in range(s.steps)]


def loss_of(data: SettingData, weights, eval_batch: int = 500) -> float:
  """Mean loss of `weights` over every client's examples (inference: no dropout)."""
  model = data.model()
  model.set_weights([np.asarray(w) for w in weights])
  x = data.x.reshape((-1,) + data.x.shape[2:])
  y = data.y.reshape((-1,) + data.y.shape[2:])
  fn = loss_fn()
  total = 0.0
  for i in range(0, len(x), eval_batch):
    total += float(fn(y[i:i + eval_batch], model(x[i:i + eval_batch], training=False))) * len(
        x[i:i + eval_batch])
  return total / len(x)


class RawLoop:
  """FedAvg as one plain `tf.function`: the same clients × K SGD steps on the same
  batches, already in memory, then the mean update applied with the server
  learning rate. The arithmetic every framework's round contains, and nothing
  else: no per-client dispatch, no data pipeline, no aggregation machinery."""

  def __init__(self, data: SettingData):
    s = data.setting
    self.model = data.model()
    variables = self.model.trainable_variables
    self.global_weights = [tf.Variable(np.asarray(w)) for w in data.weights]
    sums = [tf.Variable(tf.zeros_like(g)) for g in self.global_weights]
    x = tf.constant(data.x.reshape((s.clients, s.steps, s.batch) + data.x.shape[2:]))
    y = tf.constant(data.y.reshape((s.clients, s.steps, s.batch) + data.y.shape[2:]))
    fn = loss_fn()

    @tf.function
    def one_round():
      loss = tf.constant(0.0)
      for total in sums:
        total.assign(tf.zeros_like(total))
      for c in tf.range(s.clients):
        for v, g in zip(variables, self.global_weights):
          v.assign(g)
        for k in tf.range(s.steps):
          with tf.GradientTape() as tape:
            loss = fn(y[c, k], self.model(x[c, k], training=True))
          for v, grad in zip(variables, tape.gradient(loss, variables)):
            v.assign_sub(s.client_lr * tf.convert_to_tensor(grad))  # Embedding: IndexedSlices
        for total, v, g in zip(sums, variables, self.global_weights):
          total.assign_add(v - g)
      for g, total in zip(self.global_weights, sums):
        g.assign_add(s.server_lr * total / s.clients)
      return loss

    self._round = one_round

  def __call__(self):
    self._round().numpy()

  def weights(self):
    return [g.numpy() for g in self.global_weights]


def time_rounds(one_round, rounds: int) -> list:
  """Seconds of each of `rounds` calls of `one_round`."""
  times = []
  for _ in range(rounds):
    t0 = time.perf_counter()
    one_round()
    times.append(time.perf_counter() - t0)
  return times
