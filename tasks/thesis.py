"""The thesis' MNIST and CIFAR-10 tasks (thesis chapters 3 and 4).

Chapter 3 (CE-FedAvg) and chapter 4 (MTFL) split the official training set
over W clients (`--num_clients`):
  * `--partition=iid`: shuffled, equal parts;
  * `--partition=shards`: sorted by label, cut into 2W shards, two random
    shards per client (McMahan et al. 2017), so most clients see two classes.
Chapter 4 measures user accuracy, so the official test set is split the same
way: the same shard ids (hence the same classes) per client, or an equal IID
part; it is the task's `test_client_data`. `--partition=dirichlet` (label
proportions from Dirichlet(`--dirichlet_alpha`), the same proportions for the
test split) is offered beside them; the thesis does not use it.

Data come from the standard Keras dataset files in `--data_dir` (or its
`datasets/` subdirectory, where Keras caches them; default
`~/.keras/datasets`): `mnist.npz` for MNIST; for CIFAR-10 the
`cifar-10-batches-py/` directory Keras extracts, the `cifar-10-python.tar.gz`
archive it downloads, or a `cifar10.npz` with MNIST's keys (`x_train`,
`y_train`, `x_test`, `y_test`). Pixels stay uint8 in memory (these datasets
are small) and are scaled to [0, 1] per batch, as the thesis code scales them.
"""

import os
import pickle
import tarfile
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import base
from tasks import common
from tasks import data_files
from tasks.models import thesis_models

PARTITIONS = ('iid', 'shards', 'dirichlet')
MNIST_MODELS = ('2nn', 'cnn', 'mtfl_2nn')
CIFAR10_MODELS = ('cnn', 'mtfl_cnn')
DEFAULT_DATA_DIR = '~/.keras/datasets'
DEFAULT_NUM_CLIENTS = 100
_CIFAR_DIR = 'cifar-10-batches-py'
_CIFAR_ARCHIVE = 'cifar-10-python.tar.gz'


def _missing(task: str, data_dir: str, expected: str,
             keras_name: str) -> data_files.DataNotFoundError:
  return data_files.DataNotFoundError(data_files.missing_message(
      task, data_dir, expected, f"Keras' {keras_name} dataset (tf.keras.datasets.{keras_name})",
      f'python -c "import tensorflow as tf; tf.keras.datasets.{keras_name}.load_data()" '
      f'(it saves into ~/.keras/datasets)'))


class DataFileError(ValueError):
  """A data file that is there but malformed; the message names it and what is wrong."""


def _checked(path: str, x: Any, y: Any, image_shape: tuple[int, ...], split: str):
  """(x as uint8 [N, *image_shape], y as int32 [N] in [0, 10)) or DataFileError naming `path`."""
  x, y = np.asarray(x), np.asarray(y)
  if x.dtype.kind not in 'uif' or y.dtype.kind not in 'uif':
    raise DataFileError(f'{path}: {split} images and labels must be numeric arrays; got '
                        f'{x.dtype} and {y.dtype}')
  y = y.reshape(-1) if y.ndim == 2 and y.shape[1:] == (1,) else y
  size = int(np.prod(image_shape))
  if y.ndim != 1 or x.ndim < 1 or x.shape[0] != len(y) or x[:1].size not in (0, size) or (
      len(y) and x.size != len(y) * size):
    raise DataFileError(f'{path}: {split} holds {x.shape[0] if x.ndim else 0} images of shape '
                        f'{x.shape[1:]} and {len(y)} labels of shape {y.shape[1:]}; expected N '
                        f'images of {image_shape} and N labels')
  if not len(y):
    raise DataFileError(f'{path}: {split} is empty')
  if not np.all(np.isfinite(y)) or np.any(y != np.round(y)) or y.min() < 0 or y.max() > 9:
    raise DataFileError(f'{path}: {split} labels must be integers in [0, 9]; got values in '
                        f'[{y.min()}, {y.max()}]')
  if not np.all(np.isfinite(x)) or x.min() < 0 or x.max() > 255:
    raise DataFileError(f'{path}: {split} pixels must be in [0, 255]')
  return x.astype(np.uint8).reshape((-1,) + image_shape), y.astype(np.int32)


def _load_npz(path: str, image_shape: tuple[int, ...]):
  """(x_train, y_train, x_test, y_test) from an .npz with Keras' keys, checked."""
  keys = ('x_train', 'y_train', 'x_test', 'y_test')
  try:
    with np.load(path, allow_pickle=False) as f:
      missing = [k for k in keys if k not in f.files]
      if missing:
        raise DataFileError(f'{path}: missing array(s) {", ".join(missing)} (an .npz with '
                            f'{", ".join(keys)} is expected)')
      arrays = [f[k] for k in keys]
  except DataFileError:
    raise
  except (OSError, ValueError, EOFError, KeyError) as e:  # not a zip, truncated, pickled objects
    raise DataFileError(f'{path}: not a readable .npz of arrays ({type(e).__name__}: '
                        f'{str(e).splitlines()[0] if str(e) else ""})') from None
  return (*_checked(path, arrays[0], arrays[1], image_shape, 'x_train/y_train'),
          *_checked(path, arrays[2], arrays[3], image_shape, 'x_test/y_test'))


def load_mnist(data_dir: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(x_train, y_train, x_test, y_test) as uint8 images [N, 28, 28, 1] and int labels."""
  path = data_files.find_file(data_dir, ['mnist.npz'])
  if path is None:
    raise _missing('mnist', data_dir, 'mnist.npz', 'mnist')
  return _load_npz(path, (28, 28, 1))


class _RestrictedUnpickler(pickle.Unpickler):
  """Builds only plain containers, bytes, strings, numbers and NumPy arrays.

  CIFAR-10's batches are pickled dicts of a uint8 array and lists; anything
  else (a class or function named by a planted file) is refused instead of
  imported, so reading `--data_dir` cannot run code.
  """

  _ALLOWED = {
      ('numpy', 'ndarray'), ('numpy', 'dtype'),
      ('numpy.core.multiarray', '_reconstruct'), ('numpy._core.multiarray', '_reconstruct'),
      ('numpy.core.multiarray', 'scalar'), ('numpy._core.multiarray', 'scalar'),
      ('builtins', 'list'), ('builtins', 'dict'), ('builtins', 'tuple'), ('builtins', 'set'),
      ('builtins', 'bytes'), ('builtins', 'bytearray'), ('builtins', 'str'),
      ('builtins', 'int'), ('builtins', 'float'), ('_codecs', 'encode'),
      ('collections', 'OrderedDict'),
  }

  def find_class(self, module, name):
    if (module, name) in self._ALLOWED:
      return super().find_class(module, name)
    raise pickle.UnpicklingError(f'refusing to load {module}.{name}: only plain containers, '
                                 'bytes and NumPy arrays are read')


def restricted_loads(raw: bytes) -> Any:
  import io  # pylint: disable=g-import-not-at-top
  return _RestrictedUnpickler(io.BytesIO(raw), encoding='bytes').load()


def _cifar_batch(raw: bytes, path: str = 'CIFAR-10 batch') -> tuple[np.ndarray, np.ndarray]:
  # Keras' `cifar.load_batch`: rows of 3072 bytes, channels first.
  try:
    batch = restricted_loads(raw)
  except Exception as e:  # pylint: disable=broad-except  (any garbage: pickle, EOF, value errors)
    raise DataFileError(f'{path}: not a CIFAR-10 batch ({type(e).__name__}: '
                        f'{str(e).splitlines()[0] if str(e) else ""})') from None
  if not isinstance(batch, dict):
    raise DataFileError(f'{path}: not a CIFAR-10 batch (a pickled dict with "data" and "labels"); '
                        f'got a {type(batch).__name__}')
  batch = {k.decode('utf8', 'replace') if isinstance(k, bytes) else k: v for k, v in batch.items()}
  if 'data' not in batch or 'labels' not in batch:
    raise DataFileError(f'{path}: not a CIFAR-10 batch (no "data" and "labels" entries)')
  try:
    data, labels = np.asarray(batch['data']), np.asarray(batch['labels'])
  except (ValueError, TypeError) as e:
    raise DataFileError(f'{path}: unreadable "data" or "labels" ({e})') from None
  if data.ndim != 2 or data.shape[1] != 3072 or labels.shape != (data.shape[0],):
    raise DataFileError(f'{path}: "data" has shape {data.shape} and "labels" {labels.shape}; '
                        'expected [N, 3072] and [N]')
  x = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
  return _checked(path, x, labels, (32, 32, 3), 'the batch')


def load_cifar10(data_dir: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(x_train, y_train, x_test, y_test), uint8 images [N, 32, 32, 3], as Keras loads them."""
  names = [f'data_batch_{i}' for i in range(1, 6)] + ['test_batch']
  npz = data_files.find_file(data_dir, ['cifar10.npz'])
  directory = data_files.find_file(data_dir, [_CIFAR_DIR])
  archive = data_files.find_file(data_dir, [_CIFAR_ARCHIVE])
  if directory is not None:
    raw = {}
    for name in names:
      path = os.path.join(directory, name)
      try:
        with open(path, 'rb') as f:
          raw[path] = f.read()
      except OSError as e:
        raise DataFileError(f'{path}: cannot be read ({e.strerror}); {_CIFAR_DIR}/ must hold '
                            f'{", ".join(names)}') from None
  elif archive is not None:
    raw = {}
    try:
      with tarfile.open(archive, 'r:gz') as tar:
        for name in names:
          member = tar.extractfile(f'{_CIFAR_DIR}/{name}')
          if member is None:
            raise KeyError(f'{_CIFAR_DIR}/{name} is not a file')
          raw[f'{archive}:{_CIFAR_DIR}/{name}'] = member.read()
    except (tarfile.TarError, OSError, EOFError, KeyError, zlib_error()) as e:
      raise DataFileError(f'{archive}: not a complete CIFAR-10 archive ({type(e).__name__}: '
                          f'{str(e).splitlines()[0] if str(e) else ""})') from None
  elif npz is not None:
    return _load_npz(npz, (32, 32, 3))
  else:
    raise _missing('cifar10', data_dir, f'{_CIFAR_DIR}/ (or {_CIFAR_ARCHIVE}, or cifar10.npz)',
                   'cifar10')
  batches = [_cifar_batch(data, path) for path, data in raw.items()]
  train, (x_test, y_test) = batches[:5], batches[5]
  return (np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train]),
          x_test, y_test)


def zlib_error():
  import zlib  # pylint: disable=g-import-not-at-top
  return zlib.error


def split_indices(partition: str, y_train: np.ndarray, y_test: np.ndarray, num_clients: int,
                  seed: int, alpha: float = 0.5) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """Per-client indices into the train and test sets, split the same way.

  Deterministic in `seed`. For `shards` (thesis ch. 4 / MTFL's `shard_split`),
  both sets are sorted by label and cut into 2W shards, and client w gets the
  same two shard ids in both; for `iid` both are shuffled and cut into W
  equal parts; for `dirichlet` each label's images are divided with the same
  client proportions in both.
  """
  if partition not in PARTITIONS:
    raise ValueError(f'--partition must be one of {", ".join(PARTITIONS)}; got {partition!r}')
  if num_clients < 1:
    raise ValueError(f'--num_clients must be positive; got {num_clients}')
  if 2 * num_clients > len(y_test) and partition == 'shards':
    raise ValueError(f'--num_clients={num_clients} needs 2 test images per client for the shards '
                     f'split; the test set has {len(y_test)}')
  rng = np.random.default_rng(seed)
  if partition == 'iid':
    return [np.array_split(rng.permutation(len(y)), num_clients) for y in (y_train, y_test)]
  if partition == 'shards':
    assignment = rng.permutation(2 * num_clients).reshape(num_clients, 2)
    result = []
    for y in (y_train, y_test):
      shards = np.array_split(np.argsort(y, kind='stable'), 2 * num_clients)
      result.append([np.concatenate([shards[s] for s in pair]) for pair in assignment])
    return result[0], result[1]
  num_classes = int(max(y_train.max(), y_test.max())) + 1
  train_parts = [[] for _ in range(num_clients)]
  test_parts = [[] for _ in range(num_clients)]
  for label in range(num_classes):
    share = rng.dirichlet(alpha * np.ones(num_clients))
    for y, parts in ((y_train, train_parts), (y_test, test_parts)):
      idx = rng.permutation(np.flatnonzero(y == label))
      cuts = (np.cumsum(share)[:-1] * len(idx)).astype(int)
      for c, part in enumerate(np.split(idx, cuts)):
        parts[c].append(part)
  return ([np.concatenate(p) for p in train_parts], [np.concatenate(p) for p in test_parts])


def _client_data(x: np.ndarray, y: np.ndarray, parts: list[np.ndarray]):
  return tff.simulation.datasets.TestClientData({
      f'client_{c:04d}': {'x': x[idx], 'y': y[idx]} for c, idx in enumerate(parts)})


def _to_float(batch):
  return {'x': tf.cast(batch['x'], tf.float32) / 255.0, 'y': tf.cast(batch['y'], tf.int32)}


def _create(task: str, loader: Callable, keras_model_fn: Callable, *, data_dir: str,
            partition: str, num_clients: int, dirichlet_alpha: float, batch_size: int,
            num_epochs: int, seed: int) -> base.FederatedTask:
  data_dir = data_files.expand_dir(data_dir, DEFAULT_DATA_DIR)
  x_train, y_train, x_test, y_test = loader(data_dir)
  num_clients = num_clients or DEFAULT_NUM_CLIENTS
  train_parts, test_parts = split_indices(partition, y_train, y_test, num_clients, seed,
                                          dirichlet_alpha)
  empty = [c for c, part in enumerate(train_parts) if len(part) == 0]
  if empty:
    raise ValueError(f'--num_clients={num_clients} leaves {len(empty)} clients without training '
                     'images; use fewer clients or another --partition')
  train = _client_data(x_train, y_train, train_parts)
  test = _client_data(x_test, y_test, test_parts)

  def train_preprocess(ds):
    ds = ds.shuffle(1000, seed=seed, reshuffle_each_iteration=True)
    return ds.repeat(num_epochs).batch(batch_size).map(_to_float)

  datasets = common.baseline_datasets(train, test, train_preprocess,
                                      lambda ds: ds.batch(256).map(_to_float))
  model_fn = common.classifier_model_fn(keras_model_fn, datasets.element_type_structure)
  return base.FederatedTask(
      name=task, baseline=tff.simulation.baselines.BaselineTask(datasets, model_fn),
      keras_model_fn=keras_model_fn, num_classes=10,
      test_client_data=test.preprocess(lambda ds: ds.map(
          lambda e: {'x': tf.cast(e['x'], tf.float32) / 255.0, 'y': tf.cast(e['y'], tf.int32)})))


def create_mnist(*, mnist_model: str, data_dir: str, partition: str, num_clients: int,
                 dirichlet_alpha: float, batch_size: int, num_epochs: int,
                 seed: int) -> base.FederatedTask:
  model = mnist_model
  if model not in MNIST_MODELS:
    raise ValueError(f'--mnist_model must be one of {", ".join(MNIST_MODELS)}; got {model!r}')
  builder = {'2nn': thesis_models.create_mnist_2nn, 'cnn': thesis_models.create_mnist_cnn,
             'mtfl_2nn': thesis_models.create_mnist_mtfl_2nn}[model]
  return _create('mnist', load_mnist, lambda: builder(seed=seed), data_dir=data_dir,
                 partition=partition, num_clients=num_clients, dirichlet_alpha=dirichlet_alpha,
                 batch_size=batch_size, num_epochs=num_epochs, seed=seed)


def create_cifar10(*, cifar10_model: str, data_dir: str, partition: str, num_clients: int,
                   dirichlet_alpha: float, batch_size: int, num_epochs: int,
                   seed: int) -> base.FederatedTask:
  model = cifar10_model
  if model not in CIFAR10_MODELS:
    raise ValueError(f'--cifar10_model must be one of {", ".join(CIFAR10_MODELS)}; got {model!r}')
  builder = {'cnn': thesis_models.create_cifar10_cnn,
             'mtfl_cnn': thesis_models.create_cifar10_mtfl_cnn}[model]
  return _create('cifar10', load_cifar10, lambda: builder(seed=seed), data_dir=data_dir,
                 partition=partition, num_clients=num_clients, dirichlet_alpha=dirichlet_alpha,
                 batch_size=batch_size, num_epochs=num_epochs, seed=seed)
