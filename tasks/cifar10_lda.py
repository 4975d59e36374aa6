"""CIFAR-10 as in the FedOpt paper (Reddi et al. 2021, Appendix C): LDA over labels.

`--task=cifar10 --partition=dirichlet --dirichlet_alpha=0.1` splits CIFAR-10's
50,000 training images over 500 clients of 100 images each (`--num_clients`;
each client gets |train| / num_clients images) with the latent Dirichlet
allocation of Hsu et al. (2019) as FedOpt's code implements it:

  * each client c draws label proportions q_c ~ Dirichlet(α·1) (10 classes);
  * clients are filled one after the other, one image at a time: a label is
    drawn from q_c and the next unused image of that label is taken;
  * when a label's images run out, that label is removed from every client's
    distribution (its column of q set to 0) and the rows are renormalised.
    A row left with no mass (all of its labels exhausted) becomes uniform over
    the labels that remain (FedOpt's code would divide by zero).

The 10,000 test images are split the same way with the same q (20 per client:
the task's per-client `test_client_data`); evaluation uses the whole test set.
With α = 0.1 most clients hold one or two labels; large α tends to IID.

The split is deterministic in `--seed`, and saved with the run as
`<experiment dir>/cifar10_partition.npz` (indices, q, α, seed); a run that
finds the file (a resumed or repeated run) uses the saved split, so it is
repeated exactly even if NumPy's generators change. A saved split made with
other settings is an error.

Model: `--cifar10_model=resnet18`, TFF's ResNet-18 with GroupNorm (10
classes, softmax output), with TFF's CIFAR pipeline (random 24x24 crops and
flips for training, central crops for evaluation, per-image
standardisation), as FedOpt trains CIFAR-10 and CIFAR-100. The thesis' CNNs
(`cnn`, `mtfl_cnn`) are accepted too, on 32x32 images scaled to [0, 1] as in
`tasks/thesis.py`. Data: Keras' CIFAR-10 files in `--data_dir` (see
`tasks/thesis.py`); `--partition=iid|shards` stay the thesis' splits.
"""

import os
from collections.abc import Callable
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import base
from tasks import common
from tasks import data_files
from tasks import thesis
from tasks.models import thesis_models

NUM_CLASSES = 10
DEFAULT_NUM_CLIENTS = 500
MODELS = ('resnet18', 'cnn', 'mtfl_cnn')
RESNET_CROP = 24
PARTITION_FILE = 'cifar10_partition.npz'


def lda_partition(labels: np.ndarray, num_clients: int, examples_per_client: int, alpha: float,
                  rng: np.random.Generator, proportions: Optional[np.ndarray] = None,
                  num_classes: int = NUM_CLASSES) -> tuple[np.ndarray, np.ndarray]:
  """Indices [num_clients, examples_per_client] into `labels`, and the q used.

  Args:
    labels: integer labels in [0, num_classes).
    num_clients, examples_per_client: the split's shape; their product must
      not exceed len(labels).
    alpha: symmetric Dirichlet concentration.
    rng: the generator (deterministic in its seed).
    proportions: q [num_clients, num_classes] to reuse (the test split uses
      the train split's); None draws them.
  """
  labels = np.asarray(labels).reshape(-1)
  if num_clients * examples_per_client > len(labels):
    raise ValueError(f'{num_clients} clients x {examples_per_client} examples need '
                     f'{num_clients * examples_per_client} images; there are {len(labels)}')
  if not alpha > 0:
    raise ValueError(f'--dirichlet_alpha must be positive; got {alpha}')
  if proportions is None:
    proportions = rng.dirichlet(alpha * np.ones(num_classes), size=num_clients)
  q = np.array(proportions, np.float64)
  by_label = [rng.permutation(np.flatnonzero(labels == k)) for k in range(num_classes)]
  used = np.zeros(num_classes, np.int64)
  available = np.array([len(ids) > 0 for ids in by_label])
  q[:, ~available] = 0.0
  indices = np.empty((num_clients, examples_per_client), np.int64)
  for c in range(num_clients):
    for i in range(examples_per_client):
      row = q[c]
      total = row.sum()
      if not total > 0:
        row = q[c] = available / available.sum()
        total = 1.0
      # Inverse-CDF draw; the clip guards the float edge u·total = cumsum[-1].
      label = min(int(np.searchsorted(np.cumsum(row), rng.random() * total, side='right')),
                  num_classes - 1)
      while row[label] == 0:  # only reachable through that float edge
        label -= 1
      indices[c, i] = by_label[label][used[label]]
      used[label] += 1
      if used[label] == len(by_label[label]):
        available[label] = False
        q[:, label] = 0.0
        sums = q.sum(axis=1, keepdims=True)
        q = np.divide(q, sums, out=np.zeros_like(q), where=sums > 0)
  return indices, np.asarray(proportions)


def split(y_train: np.ndarray, y_test: np.ndarray, num_clients: int, alpha: float,
          seed: int) -> dict[str, np.ndarray]:
  """The train and test LDA splits (same q), as saved with the run."""
  rng = np.random.default_rng(seed)
  train, proportions = lda_partition(y_train, num_clients, len(y_train) // num_clients, alpha,
                                     rng)
  test, _ = lda_partition(y_test, num_clients, len(y_test) // num_clients, alpha, rng,
                          proportions=proportions)
  return dict(train=train, test=test, proportions=proportions, alpha=np.float64(alpha),
              seed=np.int64(seed), num_clients=np.int64(num_clients))


def _saved_split(run_dir: Optional[str], make: Callable[[], dict[str, np.ndarray]],
                 alpha: float, seed: int, num_clients: int) -> dict[str, np.ndarray]:
  """The run's saved split if there is one, else `make()`, saved with the run."""
  # `run_dir` is given by the training workflow (the run's directory): tasks
  # never compute it themselves, so the naming of runs lives in one place.
  if not run_dir:
    return make()  # not a training run (tests, scripts): nothing to save it with
  path = os.path.join(run_dir, PARTITION_FILE)
  if os.path.exists(path):
    with np.load(path, allow_pickle=False) as f:
      saved = {k: f[k] for k in f.files}
    settings = (float(saved['alpha']), int(saved['seed']), int(saved['num_clients']))
    if settings != (alpha, seed, num_clients):
      raise ValueError(f'{path} holds a CIFAR-10 split with (alpha, seed, num_clients) = '
                       f'{settings}, not {(alpha, seed, num_clients)}; use another '
                       '--experiment_name')
    return saved
  result = make()
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.savez(path + '.tmp.npz', **result)
    os.replace(path + '.tmp.npz', path)
  except OSError as e:
    raise ValueError(
        f'cannot save the CIFAR-10 split with the run ({e.strerror}: {path})') from None
  return result


def _client_data(x: np.ndarray, y: np.ndarray, parts: np.ndarray):
  # TFF's CIFAR element format: uint8 'image', int64 'label'.
  return tff.simulation.datasets.TestClientData({
      f'client_{c:04d}': {'image': x[idx], 'label': y[idx].astype(np.int64)}
      for c, idx in enumerate(parts)})


def _thesis_preprocess_fn(spec: tff.simulation.baselines.ClientSpec, seed: int):
  def preprocess(dataset):
    if spec.shuffle_buffer_size != 1:
      dataset = dataset.shuffle(1000, seed=seed, reshuffle_each_iteration=True)
    dataset = dataset.repeat(spec.num_epochs).batch(spec.batch_size)
    return dataset.map(lambda e: (tf.cast(e['image'], tf.float32) / 255.0,
                                  tf.cast(e['label'], tf.int32)))
  return preprocess


def create_task(*, cifar10_model: str, dirichlet_alpha: float, num_clients: int, data_dir: str,
                batch_size: int, num_epochs: int, seed: int,
                run_dir: Optional[str] = None) -> base.FederatedTask:
  """The FedOpt paper's CIFAR-10 split; `run_dir` (the run's directory) keeps it, if given."""
  model = cifar10_model
  if model not in MODELS:
    raise ValueError(f'--cifar10_model must be one of {", ".join(MODELS)}; got {model!r}')
  alpha = float(dirichlet_alpha)
  seed = int(seed)
  num_clients = int(num_clients or DEFAULT_NUM_CLIENTS)
  data_dir = data_files.expand_dir(data_dir, thesis.DEFAULT_DATA_DIR)
  x_train, y_train, x_test, y_test = thesis.load_cifar10(data_dir)
  if len(y_train) < num_clients or len(y_test) < num_clients:
    raise ValueError(f'--num_clients={num_clients} exceeds the number of CIFAR-10 images')
  parts = _saved_split(run_dir, lambda: split(y_train, y_test, num_clients, alpha, seed),
                       alpha, seed, num_clients)
  train = _client_data(x_train, y_train, parts['train'])
  test = _client_data(x_test, y_test, parts['test'])
  spec = tff.simulation.baselines.ClientSpec(num_epochs=num_epochs, batch_size=batch_size)
  eval_spec = tff.simulation.baselines.ClientSpec(num_epochs=1, batch_size=256,
                                                  shuffle_buffer_size=1)
  if model == 'resnet18':
    cifar = tff.simulation.baselines.cifar100.image_classification_preprocessing
    crop = (RESNET_CROP, RESNET_CROP, 3)
    train_fn = cifar.create_preprocess_fn(spec, crop, distort_image=True)
    eval_fn = cifar.create_preprocess_fn(eval_spec, crop, distort_image=False)
    keras_model_fn = lambda: tff.simulation.models.resnet_models.create_resnet18(
        input_shape=crop, num_classes=NUM_CLASSES)
    from_logits = False  # TFF's ResNet ends in a softmax
    element_map = cifar.build_image_map(crop, distort=False)
  else:
    train_fn = _thesis_preprocess_fn(spec, seed)
    eval_fn = _thesis_preprocess_fn(eval_spec, seed)
    builder = {'cnn': thesis_models.create_cifar10_cnn,
               'mtfl_cnn': thesis_models.create_cifar10_mtfl_cnn}[model]
    keras_model_fn = lambda: builder(seed=seed)
    from_logits = True
    element_map = lambda e: (tf.cast(e['image'], tf.float32) / 255.0, e['label'])
  datasets = common.baseline_datasets(
      train, tff.simulation.datasets.TestClientData(
          {'all': {'image': x_test, 'label': y_test.astype(np.int64)}}), train_fn, eval_fn)
  model_fn = common.classifier_model_fn(keras_model_fn, datasets.element_type_structure,
                                        from_logits)
  evaluation = base.KerasEvaluation(
      loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits),
      metrics_fn=lambda: [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')],
      data_fn=lambda: base.centralized_test_data(datasets))
  return base.FederatedTask(
      name='cifar10', baseline=tff.simulation.baselines.BaselineTask(datasets, model_fn),
      keras_model_fn=keras_model_fn, num_classes=NUM_CLASSES,
      # Per-client test examples, unbatched {'x', 'y'} as the other tasks give them.
      test_client_data=test.preprocess(lambda ds: ds.map(
          lambda e: dict(zip(('x', 'y'), element_map(e))))), evaluation=evaluation)


def create_cifar10(*, partition: str, cifar10_model: str, dirichlet_alpha: float,
                   num_clients: int, data_dir: str, batch_size: int, num_epochs: int, seed: int,
                   run_dir: Optional[str] = None) -> base.FederatedTask:
  """The `cifar10` task: the FedOpt paper's split for `--partition=dirichlet`, else the thesis' task."""
  if partition == 'dirichlet':
    return create_task(cifar10_model=cifar10_model, dirichlet_alpha=dirichlet_alpha,
                       num_clients=num_clients, data_dir=data_dir, batch_size=batch_size,
                       num_epochs=num_epochs, seed=seed, run_dir=run_dir)
  return thesis.create_cifar10(cifar10_model=cifar10_model, data_dir=data_dir,
                               partition=partition, num_clients=num_clients,
                               dirichlet_alpha=dirichlet_alpha, batch_size=batch_size,
                               num_epochs=num_epochs, seed=seed)
