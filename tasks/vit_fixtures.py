"""Tiny files in the on-disk formats of the ViT tasks, for tests and smoke runs.

* `write_tff_gld23k`: the cache that `tff.simulation.datasets.gldv2.load_data(
  gld23k=True, cache_dir=D)` reads (see `tasks/gld.py`): `D/gld23k/train/<client
  id>` TFRecord files and `D/gld23k/test.tfRecord`, with the `tf.train.Example`s
  TFF's own `vision_datasets_utils.create_example` writes (`image/encoded_jpeg`,
  `class`). Images are random JPEGs of varied sizes, one of them grayscale, as
  real photos are.
* `write_vit_npz`: a ViT's weights in Google's checkpoint layout (with a head
  and an extra unused array, as published checkpoints have).
"""

import os

import numpy as np
import tensorflow as tf

from tensorflow_federated.python.simulation.datasets import vision_datasets_utils
from tasks.models import vit

_GLD_NUM_CLASSES = 203


def _jpeg(rng: np.random.Generator, grayscale: bool = False) -> bytes:
  height, width = int(rng.integers(150, 300)), int(rng.integers(150, 300))
  pixels = rng.integers(0, 256, (height, width, 1 if grayscale else 3), dtype=np.uint8)
  return tf.io.encode_jpeg(pixels).numpy()


def write_tff_gld23k(data_dir: str, num_clients: int = 3, examples: int = 4,
                     test_examples: int = 5, seed: int = 0) -> str:
  """TFF's gld23k cache in miniature; returns `data_dir/gld23k`."""
  rng = np.random.default_rng(seed)
  cache = os.path.join(data_dir, 'gld23k')
  os.makedirs(os.path.join(cache, 'train'), exist_ok=True)

  def write(path, n, first_grayscale):
    with tf.io.TFRecordWriter(path) as writer:
      for i in range(n):
        example = vision_datasets_utils.create_example(
            _jpeg(rng, grayscale=first_grayscale and i == 0), int(rng.integers(_GLD_NUM_CLASSES)))
        writer.write(example.SerializeToString())

  for c in range(num_clients):
    write(os.path.join(cache, 'train', str(100 + c)), examples + c, first_grayscale=c == 0)
  write(os.path.join(cache, 'test.tfRecord'), test_examples, first_grayscale=False)
  return cache


def write_vit_npz(path: str, config: vit.ViTConfig, num_classes: int = 7, seed: int = 1) -> dict:
  """Random (non-zero everywhere) ViT weights in Google's layout; returns the arrays."""
  model = vit.create_vit(num_classes, config, seed=seed)
  rng = np.random.default_rng(seed)
  arrays = {}
  for key, variable in vit.google_variables(model):
    arrays[key] = rng.normal(0.0, 0.05, variable.shape).astype(np.float32)
  arrays['pre_logits/kernel'] = np.zeros((config.width, config.width), np.float32)
  np.savez(path, **arrays)
  return arrays
