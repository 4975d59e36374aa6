"""The FedAda2 paper's ViT tasks on fixtures: gld23k through TFF's real gldv2 loader, cifar100_image ViT.

`vit_fixtures.write_tff_gld23k` writes the cache layout that
`tff.simulation.datasets.gldv2.load_data(gld23k=True)` reads, with TFF's own
example writer; the task must read it with TFF's reader (see tasks/gld.py for
TFF 0.87's bug in it), resize to 224x224 and rescale to [-1, 1] as TFF's
landmark pipeline does, and fail offline with one clear message when the
cache is missing.
No ViT-S/16 is built here (test_vit.py does): the model builder is lazy.
"""

import importlib.util
import os
import re
import shlex

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tensorflow_federated.python.simulation.datasets import vision_datasets_utils
from tasks import data_files
from tasks import fixtures
from tasks import gld
from tasks import registry
from tasks.settings import TaskSettings
from tasks import vit_fixtures
from tasks import vit_tasks
from workflow.flags import config
from workflow.flags import train_flags
from workflow.flags import validation

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow


@pytest.fixture(scope='module')
def gld_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp('gld')
  vit_fixtures.write_tff_gld23k(str(root), num_clients=3, examples=4, test_examples=5)
  return str(root)


def _create(task, data_dir, *, batch_size=3, **flags):
  """The registry's `task` on `data_dir`: head fine-tuning from random weights, one epoch."""
  flags = dict(dict(allow_random_init=True, finetune='head'), **flags)
  return registry.create_task(TaskSettings(task=task, data_dir=data_dir, **flags),
                              batch_size=batch_size, num_epochs=1, seed=0)


def test_fixture_is_what_tffs_own_reader_reads(gld_dir):
  """TFF's record reader parses the fixture; TFF 0.87's cache loader cannot (its bug)."""
  cache = os.path.join(gld_dir, 'gld23k')
  element = next(iter(vision_datasets_utils.load_tfrecord(
      os.path.join(cache, 'test.tfRecord'), 'gldv2')))
  assert set(element) == {'image/decoded', 'class'} and element['class'].shape == (1,)
  train, test = gld.load_gld23k(gld_dir)
  assert sorted(train.client_ids) == ['100', '101', '102']
  assert [len(list(train.create_tf_dataset_for_client(c))) for c in train.client_ids] == [4, 5, 6]
  assert len(list(test)) == 5
  try:
    tff_train, _ = vision_datasets_utils.load_data_from_cache(cache, 'train', 'test.tfRecord',
                                                              'gldv2')
  except TypeError as e:  # TFF 0.87: load_tfrecord() called without its logger_tag
    assert 'logger_tag' in str(e)
  else:  # a TFF that reads its own cache: the task must read the same clients
    assert tff_train.client_ids == train.client_ids


def test_gld23k_task_reads_the_fixture_at_224(gld_dir):
  task = _create('gld23k', gld_dir)
  assert task.num_classes == gld.NUM_CLASSES == 203
  assert len(task.train_data.client_ids) == 3
  # Client '100' has 4 images, the first one grayscale: batches of 3 then 1.
  batches = list(task.preprocess_train(task.train_data.create_tf_dataset_for_client('100')))
  assert [int(x.shape[0]) for x, _ in batches] == [3, 1]
  for x, y in batches:
    assert x.shape[1:] == (224, 224, 3) and y.shape[1:] == (1,)
    assert -1.0 <= float(np.min(x)) and float(np.max(x)) <= 1.0
    assert np.all((0 <= y.numpy()) & (y.numpy() < 203))
  test_batches = list(task.centralized_test_data())
  assert sum(int(x.shape[0]) for x, _ in test_batches) == 5
  assert test_batches[0][0].shape[1:] == (224, 224, 3)
  # The Keras evaluation pairs logits with these batches.
  evaluation = task.keras_evaluation()
  assert evaluation.loss_fn().get_config()['from_logits']
  # --num_clients samples a subset of TFF's clients.
  subset = _create('gld23k', gld_dir, num_clients=2)
  assert len(subset.train_data.client_ids) == 2


def test_gld23k_offline_error_and_weights_flags(tmp_path, gld_dir):
  with pytest.raises(data_files.DataNotFoundError) as error:
    _create('gld23k', str(tmp_path))
  message = str(error.value)
  assert '--task=gld23k' in message and 'gld23k/train/' in message
  assert 'gldv2.load_data(gld23k=True' in message and '\n' not in message
  with pytest.raises(ValueError, match='--pretrained_weights'):
    _create('gld23k', gld_dir, allow_random_init=False)


def test_cifar100_image_vit_variant(tmp_path):
  fixtures.write_tff_cifar100(str(tmp_path), num_clients=3, examples=5)
  task = _create('cifar100_image', str(tmp_path), cifar100_image_model='vit_s16',
                 batch_size=4)
  cid = task.train_data.client_ids[0]
  x, y = next(iter(task.preprocess_train(task.train_data.create_tf_dataset_for_client(cid))))
  assert x.shape == (4, 224, 224, 3) and y.shape == (4,)
  # ImageNet normalisation: (p/255 − mean)/std, so the range exceeds [0, 1] on both sides.
  assert float(np.min(x)) < -1.5 and float(np.max(x)) > 2.0
  # The map by hand: bilinear resizing keeps the corner pixel (half-pixel centres).
  raw = next(iter(task.train_data.create_tf_dataset_for_client(cid)))
  spec = tff.simulation.baselines.ClientSpec(num_epochs=1, batch_size=1, shuffle_buffer_size=1)
  one = next(iter(vit_tasks.cifar100_vit_preprocess_fn(spec, 224)(
      tf.data.Dataset.from_tensors(raw))))[0][0].numpy()
  pixel = raw['image'].numpy()[0, 0] / 255.0
  np.testing.assert_allclose(one[0, 0], (pixel - np.array(vit_tasks.vit.IMAGENET_MEAN)) /
                             np.array(vit_tasks.vit.IMAGENET_STD), atol=1e-5)
  assert task.num_classes == 100
  # The other models still come from the TFF task.
  resnet = _create('cifar100_image', str(tmp_path), cifar100_image_model='resnet18')
  x, _ = next(iter(resnet.preprocess_train(resnet.train_data.create_tf_dataset_for_client(cid))))
  assert x.shape[1:] == (24, 24, 3)


def _train_flags():
  """bin/train's flags (defined once per process, whoever imports bin/train first)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  if 'finetune' not in flags.FLAGS:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location('tff_adaptive_bin_train',
                                                  os.path.join(root, 'bin', 'train.py'))
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
  return flags.FLAGS


def test_documented_commands_parse_and_validate():
  """docs/tasks_vit.md's commands are valid bin/train flags for registered tasks."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with open(os.path.join(root, 'docs', 'tasks_vit.md')) as f:
    commands = re.findall(r'`(bin/train\.py [^`]*)`', f.read())
  assert len(commands) == 6
  values = _train_flags()
  seen = set()
  for command in commands:
    values.unparse_flags()
    try:
      values(shlex.split(command))
      cfg = {name: values[name].value for name in train_flags.TRAIN_FLAG_NAMES if name in values}
    finally:
      values.unparse_flags()
    validation.validate(config.from_flags(cfg))
    assert cfg['task'] in registry.TASKS
    seen.add((cfg['task'], cfg.get('cifar100_image_model') if cfg['task'] == 'cifar100_image'
              else cfg.get('partition') if cfg['task'] == 'cifar10' else cfg.get('finetune')))
    if cfg['task'] in ('gld23k', 'cifar100_image'):
      assert cfg['client_batch_size'] == 32 and cfg['pretrained_weights']
  assert seen == {('gld23k', 'head'), ('gld23k', 'full'), ('cifar100_image', 'vit_s16'),
                  ('cifar10', 'dirichlet')}
