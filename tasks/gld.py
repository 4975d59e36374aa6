"""GLD-23K: the FedAda2 paper's landmark task, through TFF's Google Landmarks v2 loader.

Data: `tff.simulation.datasets.gldv2.load_data(gld23k=True, cache_dir=D)`,
233 clients (photographers), 23,080 training images of 203 landmarks, and a
centralised test set. TFF builds this once from the GLDv2 image shards (a
download of hundreds of GB) into its cache, which is what this task reads:

  D/gld23k/train/<client id>   one TFRecord file per client
  D/gld23k/test.tfRecord       the test set

with one `tf.train.Example` per image: `image/encoded_jpeg` (JPEG bytes) and
`class` (int64). `D` is `--data_dir` (default `~/.tff`). When the cache is not
there, TFF's `load_data` would start that download (and fail offline deep in
urllib); the task checks first and raises `DataNotFoundError`, the same one-line
error as the other tasks.

The cache is read with TFF's own reader, `vision_datasets_utils.
load_data_from_cache` (what `gldv2.load_data` returns when the cache exists).
In TFF 0.87 that function cannot read it: it hands `load_tfrecord(fname,
logger_tag)` to `FilePerUserClientData.create_from_dir`, which calls it with
the file name only (a TypeError), and `gldv2.load_data` then falls back to the
full download. The task therefore calls TFF's reader and, on that TypeError,
builds the same `FilePerUserClientData` and test dataset from the same TFF
functions with the missing argument bound.

Preprocessing: TFF's landmark baseline pipeline (`tff.simulation.baselines.
landmark`: map, shuffle with a 3,500 buffer, repeat, take, batch; training
images randomly flipped, pixels rescaled to [-1, 1], labels of shape [1]) at
the FedAda2 paper's 224x224 instead of TFF's 128x128: images are resized to 224x224
(the FedAda2 paper, Appendix H.2) before TFF's crop (then a no-op) and flip. Model:
the ViT-S/16 with a 203-class head (`tasks/vit_tasks.py`; `--finetune`,
`--pretrained_weights`). The FedAda2 paper samples a fraction of the 233 clients per
round and uses client batch size 32.
"""

import functools
import os
from collections.abc import Callable
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tensorflow_federated.python.simulation.datasets import vision_datasets_utils
from tasks import base
from tasks import common
from tasks import data_files
from tasks import vit_tasks
from tasks.models import vit

NUM_CLASSES = 203
NUM_CLIENTS = 233
DEFAULT_CACHE_DIR = '~/.tff'
# TFF's landmark preprocessing: shuffle buffer = the largest client's size.
MAX_CLIENT_DATASET_SIZE = 3500
_GLDV2 = tff.simulation.datasets.gldv2
# TFF's record reader with the argument that TFF 0.87 forgets to pass.
_load_records = functools.partial(vision_datasets_utils.load_tfrecord, logger_tag=_GLDV2.LOGGER)


def _fetch_command(data_dir: str) -> str:
  return ('python -c "import tensorflow_federated as tff; '
          f"tff.simulation.datasets.gldv2.load_data(gld23k=True, cache_dir='{data_dir}')\"")


def load_gld23k(data_dir: str) -> tuple[tff.simulation.datasets.ClientData, tf.data.Dataset]:
  """What TFF's `gldv2.load_data(gld23k=True)` returns from its cache (no download)."""
  cache = os.path.join(data_dir, _GLDV2.MINI_GLD_CACHE)
  train_dir = os.path.join(cache, _GLDV2.TRAIN_SUB_DIR)
  test_file = os.path.join(cache, _GLDV2.TEST_FILE_NAME)
  if not (os.path.isdir(train_dir) and os.listdir(train_dir) and os.path.isfile(test_file)):
    raise data_files.DataNotFoundError(data_files.missing_message(
        'gld23k', data_dir,
        f'{_GLDV2.MINI_GLD_CACHE}/{_GLDV2.TRAIN_SUB_DIR}/ (one TFRecord file per client) and '
        f'{_GLDV2.MINI_GLD_CACHE}/{_GLDV2.TEST_FILE_NAME}',
        "TFF's federated Google Landmarks v2 (GLD-23K), which TFF builds from the GLDv2 image "
        'shards (hundreds of GB)', _fetch_command(data_dir)))
  try:
    return vision_datasets_utils.load_data_from_cache(
        cache, _GLDV2.TRAIN_SUB_DIR, _GLDV2.TEST_FILE_NAME, _GLDV2.LOGGER)
  except TypeError:
    # TFF 0.87's bug (module docstring): the same reader, argument bound.
    train = tff.simulation.datasets.FilePerUserClientData.create_from_dir(train_dir, _load_records)
    return train, _load_records(test_file)


def _restrict_train_data(train: tff.simulation.datasets.ClientData, data_dir: str,
                         num_clients: int, max_client_examples: int,
                         seed: int) -> tff.simulation.datasets.ClientData:
  """`--num_clients` / `--max_client_examples` as for the other TFF tasks.

  The same seeded client sample as `tff_files.restrict_train_data`, kept a
  `FilePerUserClientData` (whose dataset function takes tensors only).
  """
  if num_clients < 0 or max_client_examples < 0:
    raise ValueError('--num_clients and --max_client_examples must be non-negative')
  ids = train.client_ids
  if num_clients > len(ids):
    raise ValueError(f'--num_clients={num_clients} but gld23k has only {len(ids)} training '
                     'clients')
  if 0 < num_clients < len(ids):
    chosen = np.sort(np.random.default_rng(seed).choice(len(ids), num_clients, replace=False))
    train_dir = os.path.join(data_dir, _GLDV2.MINI_GLD_CACHE, _GLDV2.TRAIN_SUB_DIR)
    train = tff.simulation.datasets.FilePerUserClientData(
        {ids[i]: os.path.join(train_dir, ids[i]) for i in chosen}, _load_records)
  if max_client_examples:
    train = train.preprocess(lambda ds: ds.take(max_client_examples))
  return train


def _image_model(image_size: int, is_training: bool) -> tf.keras.Model:
  """TFF's landmark transformation (`landmark_preprocessing._create_model`) at `image_size`."""
  crop = (tf.keras.layers.RandomCrop(image_size, image_size) if is_training else
          tf.keras.layers.CenterCrop(image_size, image_size))
  flip = [tf.keras.layers.RandomFlip('horizontal')] if is_training else []
  return tf.keras.Sequential([crop, *flip, tf.keras.layers.Rescaling(scale=2.0 / 255, offset=-1.0)])


def preprocess_fn(spec: tff.simulation.baselines.ClientSpec, is_training: bool,
                  image_size: int = 224,
                  seed: Optional[int] = None) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
  """TFF's `landmark_preprocessing.create_preprocess_fn`, resizing to `image_size` first."""
  buffer = spec.shuffle_buffer_size
  if buffer is None:
    buffer = MAX_CLIENT_DATASET_SIZE

  def preprocess(dataset: tf.data.Dataset) -> tf.data.Dataset:
    model = _image_model(image_size, is_training)

    def map_fn(element):
      image = element['image/decoded']
      # A grayscale JPEG decodes to one channel; the model takes RGB.
      image = tf.cond(tf.shape(image)[-1] == 1, lambda: tf.image.grayscale_to_rgb(image),
                      lambda: image)
      image = tf.ensure_shape(image, [None, None, 3])
      image = tf.image.resize(image, [image_size, image_size])  # the FedAda2 paper: resized to 224
      return model(image), element['class']

    dataset = dataset.map(map_fn, num_parallel_calls=tf.data.AUTOTUNE)
    if buffer > 1:
      dataset = dataset.shuffle(buffer, seed=seed)
    if spec.num_epochs > 1:
      dataset = dataset.repeat(spec.num_epochs)
    if spec.max_elements is not None:
      dataset = dataset.take(spec.max_elements)
    return dataset.batch(spec.batch_size)

  return preprocess


def create_gld23k(*, finetune: str, pretrained_weights: str, allow_random_init: bool,
                  data_dir: str, num_clients: int, max_client_examples: int, batch_size: int,
                  num_epochs: int, seed: int) -> base.FederatedTask:
  keras_model_fn = vit_tasks.vit_keras_model_fn(
      'gld23k', NUM_CLASSES, finetune=finetune, pretrained_weights=pretrained_weights,
      allow_random_init=allow_random_init, seed=seed)
  image_size = vit.VIT_S16.image_size
  data_dir = data_files.expand_dir(data_dir, DEFAULT_CACHE_DIR)
  train, test = load_gld23k(data_dir)
  train = _restrict_train_data(train, data_dir, num_clients, max_client_examples, seed)
  spec = tff.simulation.baselines.ClientSpec(num_epochs=num_epochs, batch_size=batch_size)
  # TFF's landmark task evaluates with batches of 64, unshuffled.
  eval_spec = tff.simulation.baselines.ClientSpec(num_epochs=1, batch_size=64,
                                                  shuffle_buffer_size=1)
  datasets = common.baseline_datasets(
      train, test, preprocess_fn(spec, is_training=True, image_size=image_size),
      preprocess_fn(eval_spec, is_training=False, image_size=image_size))
  baseline = tff.simulation.baselines.BaselineTask(
      datasets, vit_tasks.vit_model_fn(keras_model_fn, datasets.element_type_structure))
  return base.FederatedTask(name='gld23k', baseline=baseline, keras_model_fn=keras_model_fn,
                            num_classes=NUM_CLASSES,
                            evaluation=vit_tasks.logits_evaluation(datasets))
