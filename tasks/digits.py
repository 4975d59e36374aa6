"""scikit-learn's bundled handwritten digits (1,797 8×8 images), split non-IID.

Offline and small: the package's default task. 20% of the images (stratified,
seeded) are held out for testing. Partitions of the training images:
  * `dirichlet`: for every label, its images are divided among clients in
    proportions drawn from Dirichlet(α) (small α: few labels per client);
  * `shards`: images sorted by label, cut into 2W shards, 2 random shards per
    client (McMahan et al. 2017);
  * `iid`: a random equal split.
Each client's test data is split the same way (same label proportions, or the
same shard ids), so per-client (user) accuracy is meaningful.
"""

import numpy as np
import sklearn.datasets
import tensorflow as tf
import tensorflow_federated as tff

from tasks import base
from tasks import common

NUM_CLASSES = 10
PARTITIONS = ('dirichlet', 'shards', 'iid')
MODELS = ('mlp', 'cnn', 'cnn_bn')


def _split_dirichlet(y_train, y_test, num_clients, alpha, rng):
  train_idx = [[] for _ in range(num_clients)]
  test_idx = [[] for _ in range(num_clients)]
  for label in range(NUM_CLASSES):
    share = rng.dirichlet(alpha * np.ones(num_clients))
    for y, out in ((y_train, train_idx), (y_test, test_idx)):
      idx = rng.permutation(np.flatnonzero(y == label))
      cuts = (np.cumsum(share)[:-1] * len(idx)).astype(int)
      for c, part in enumerate(np.split(idx, cuts)):
        out[c].extend(part.tolist())
  return train_idx, test_idx


def _split_shards(y_train, y_test, num_clients, rng):
  shard_ids = rng.permutation(2 * num_clients).reshape(num_clients, 2)
  result = []
  for y in (y_train, y_test):
    shards = np.array_split(np.argsort(y, kind='stable'), 2 * num_clients)
    result.append([np.concatenate([shards[s] for s in ids]).tolist() for ids in shard_ids])
  return result


def _split_iid(n_train, n_test, num_clients, rng):
  return [[part.tolist() for part in np.array_split(rng.permutation(n), num_clients)]
          for n in (n_train, n_test)]


def generate(partition: str = 'dirichlet', num_clients: int = 20, alpha: float = 0.5,
             seed: int = 0) -> tuple[common.ClientArrays, common.ClientArrays]:
  """Returns (train, test) client arrays; deterministic in `seed`."""
  if partition not in PARTITIONS:
    raise ValueError(f'--partition must be one of {", ".join(PARTITIONS)}; got {partition!r}')
  digits = sklearn.datasets.load_digits()
  x = (digits.images / 16.0).astype(np.float32)[..., None]
  y = digits.target.astype(np.int32)
  rng = np.random.default_rng(seed)
  test_mask = np.zeros(len(y), bool)
  for label in range(NUM_CLASSES):  # stratified 20% test split
    idx = rng.permutation(np.flatnonzero(y == label))
    test_mask[idx[:len(idx) // 5]] = True
  x_train, y_train, x_test, y_test = x[~test_mask], y[~test_mask], x[test_mask], y[test_mask]
  if not 1 <= num_clients <= len(y_train):
    raise ValueError(f'--num_clients must be in [1, {len(y_train)}] for --task=digits (its '
                     f'training images); got {num_clients}')
  if partition == 'dirichlet':
    train_idx, test_idx = _split_dirichlet(y_train, y_test, num_clients, alpha, rng)
  elif partition == 'shards':
    train_idx, test_idx = _split_shards(y_train, y_test, num_clients, rng)
  else:
    train_idx, test_idx = _split_iid(len(y_train), len(y_test), num_clients, rng)
  train, test = {}, {}
  for c in range(num_clients):
    cid = f'client_{c:04d}'
    # A Dirichlet draw can leave a client without images; give it one so every
    # client id has data (TFF samples ids uniformly).
    tr = train_idx[c] or [int(rng.integers(len(y_train)))]
    train[cid] = {'x': x_train[tr], 'y': y_train[tr]}
    test[cid] = {'x': x_test[test_idx[c]], 'y': y_test[test_idx[c]]}
  return train, test


def build_keras_model(model: str = 'mlp') -> tf.keras.Model:
  """Small models; seeded initialisers make initial weights reproducible."""
  init = lambda i: tf.keras.initializers.GlorotUniform(seed=i)
  layers = tf.keras.layers
  if model == 'mlp':
    body = [layers.Reshape((-1,)), layers.Dense(64, activation='relu', kernel_initializer=init(1))]
  elif model == 'cnn':
    body = [layers.Conv2D(16, 3, activation='relu', kernel_initializer=init(1)),
            layers.MaxPool2D(2), layers.Reshape((-1,)),
            layers.Dense(64, activation='relu', kernel_initializer=init(2))]
  elif model == 'cnn_bn':
    body = [layers.Conv2D(16, 3, kernel_initializer=init(1)), layers.BatchNormalization(),
            layers.ReLU(), layers.MaxPool2D(2), layers.Reshape((-1,)),
            layers.Dense(64, kernel_initializer=init(2)), layers.BatchNormalization(),
            layers.ReLU()]
  else:
    raise ValueError(f'--digits_model must be one of {", ".join(MODELS)}; got {model!r}')
  return tf.keras.Sequential([layers.InputLayer(input_shape=(8, 8, 1))] + body +
                             [layers.Dense(NUM_CLASSES, kernel_initializer=init(9))])


def create_task(*, partition: str = 'dirichlet', num_clients: int = 20, alpha: float = 0.5,
                model: str = 'mlp', batch_size: int = 10, num_epochs: int = 1,
                seed: int = 0) -> base.FederatedTask:
  train, test = generate(partition, num_clients, alpha, seed)
  train_data = common.client_data_from_arrays(train)
  test_data = common.client_data_from_arrays(test)
  datasets = common.baseline_datasets(
      train_data, test_data, common.make_preprocess_fn(batch_size, num_epochs, seed),
      lambda ds: ds.batch(256))
  keras_fn = lambda: build_keras_model(model)
  model_fn = common.keras_model_fn(keras_fn, train_data.element_type_structure)
  return base.FederatedTask(
      name='digits', baseline=tff.simulation.baselines.BaselineTask(datasets, model_fn),
      keras_model_fn=keras_fn, num_classes=NUM_CLASSES, test_client_data=test_data)
