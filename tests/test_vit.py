"""ViT-S/16 (the FedAda2 paper): parameter counts, head/full fine-tuning, pretrained weights from a file.

The full-size model is only built (two builds, for the FedAda2 paper's two head sizes);
everything that trains or loads weights uses a tiny ViT of the same code
(32x32 images, two 16x16 patches a side, width 16, one block).
"""

import logging

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import vit_fixtures
from tasks import vit_tasks
from tasks.models import vit
from tff_adaptive.execution import runtime
from tff_adaptive.algorithms import fedopt

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow

TINY = vit.ViTConfig(image_size=32, patch_size=16, width=16, depth=1, num_heads=2, mlp_dim=32)
CLASSES = 5


def _trainable(model):
  return sum(int(np.prod(v.shape)) for v in model.trainable_weights)


def test_vit_s16_parameter_counts_of_the_fedada2_paper():
  full = vit.create_vit(100, finetune='full')
  assert full.count_params() == 21_704_164 == vit.num_params(vit.VIT_S16, 100)
  assert _trainable(full) == 21_704_164
  assert full.output_shape == (None, 100)
  head = vit.create_vit(203, finetune='head')
  assert head.count_params() == 21_743_819 == vit.num_params(vit.VIT_S16, 203)
  # Head-only fine-tuning trains 384 weights + 1 bias per class.
  assert _trainable(head) == 203 * 385
  assert [v.name.split('/')[0] for v in head.trainable_weights] == ['head', 'head']


def test_tiny_config_counts_and_bad_arguments():
  for finetune, trainable in (('full', vit.num_params(TINY, CLASSES)), ('head', 17 * CLASSES)):
    model = vit.create_vit(CLASSES, TINY, finetune=finetune)
    assert model.count_params() == vit.num_params(TINY, CLASSES)
    assert _trainable(model) == trainable
  with pytest.raises(ValueError, match='--finetune'):
    vit.create_vit(CLASSES, TINY, finetune='last_layer')


@pytest.fixture(scope='module')
def weights_file(tmp_path_factory):
  path = str(tmp_path_factory.mktemp('vit') / 'tiny.npz')
  return path, vit_fixtures.write_vit_npz(path, TINY, num_classes=7)


def _backbone(model):
  return {key: v.numpy() for key, v in vit.google_variables(model) if not key.startswith('head/')}


def test_pretrained_weights_load_from_a_local_file(weights_file, tmp_path):
  path, arrays = weights_file
  model = vit.create_vit(CLASSES, TINY, pretrained=vit.PretrainedWeights(path, TINY))
  loaded = _backbone(model)
  assert set(loaded) == {k for k in arrays if k.startswith(('embedding', 'cls', 'Transformer'))}
  for key, value in loaded.items():
    np.testing.assert_array_equal(value, arrays[key], err_msg=key)
  # The checkpoint's 7-class head is replaced by a zero-initialised 5-class one.
  np.testing.assert_array_equal(model.get_layer('head').kernel.numpy(), np.zeros((16, CLASSES)))
  # Round trip through the writer: the saved file loads back to the same arrays.
  model.get_layer('head').kernel.assign(np.ones((16, CLASSES), np.float32))
  vit.save_npz(model, str(tmp_path / 'again.npz'))
  again = vit.load_npz(str(tmp_path / 'again.npz'), TINY)
  assert set(again) == set(loaded)
  for key, value in again.items():
    np.testing.assert_array_equal(value, loaded[key], err_msg=key)


def test_bad_weight_files_are_refused(weights_file, tmp_path):
  path, _ = weights_file
  with pytest.raises(ValueError, match='pos_embedding.*shape'):
    vit.load_npz(path, vit.ViTConfig(image_size=48, patch_size=16, width=16, depth=1,
                                     num_heads=2, mlp_dim=32))
  with pytest.raises(ValueError, match='encoderblock_1'):
    vit.load_npz(path, vit.ViTConfig(image_size=32, patch_size=16, width=16, depth=2,
                                     num_heads=2, mlp_dim=32))
  with pytest.raises(ValueError, match='does not exist'):
    vit.load_npz(str(tmp_path / 'missing.npz'), TINY)
  (tmp_path / 'weights.h5').write_bytes(b'')
  with pytest.raises(ValueError, match='npz'):
    vit.load_npz(str(tmp_path / 'weights.h5'), TINY)


def test_task_flags_need_weights_or_allow_random_init(weights_file, caplog):
  flags = dict(config=TINY, finetune='head', pretrained_weights='', allow_random_init=False,
               seed=0)
  with pytest.raises(ValueError, match='--pretrained_weights.*--allow_random_init'):
    vit_tasks.vit_keras_model_fn('gld23k', CLASSES, **flags)
  with caplog.at_level(logging.WARNING):
    build = vit_tasks.vit_keras_model_fn('gld23k', CLASSES, **dict(flags, allow_random_init=True))
  assert 'RANDOM initialisation' in caplog.text and 'pretrained' in caplog.text
  assert _trainable(build()) == 17 * CLASSES
  with pytest.raises(ValueError, match='--finetune'):
    vit_tasks.vit_keras_model_fn('gld23k', CLASSES, **dict(flags, finetune='lora'))
  build = vit_tasks.vit_keras_model_fn(
      'gld23k', CLASSES, **dict(flags, finetune='full', pretrained_weights=weights_file[0]))
  assert _trainable(build()) == vit.num_params(TINY, CLASSES)


def test_head_finetuning_round_changes_only_the_head(weights_file):
  """One FedAvg round in TFF: the pretrained backbone is the initial model and stays fixed."""
  path, arrays = weights_file
  spec = (tf.TensorSpec([None, 32, 32, 3], tf.float32), tf.TensorSpec([None], tf.int32))
  keras_model_fn = vit_tasks.vit_keras_model_fn(
      'gld23k', CLASSES, config=TINY, finetune='head', pretrained_weights=path,
      allow_random_init=False, seed=0)
  model_fn = vit_tasks.vit_model_fn(keras_model_fn, spec)
  process = fedopt.build_fedopt(
      model_fn, tff.learning.optimizers.build_sgdm(0.5), tff.learning.optimizers.build_sgdm(1.0),
      local_steps=2)
  rng = np.random.default_rng(0)
  data = [tf.data.Dataset.from_tensor_slices((
      rng.normal(size=(6, 32, 32, 3)).astype(np.float32),
      rng.integers(0, CLASSES, 6).astype(np.int32))).batch(3) for _ in range(2)]
  runtime.use_local_cpp_context()
  try:
    state = process.initialize()
    before = process.get_model_weights(state)
    state = process.next(state, data).state
    after = process.get_model_weights(state)
  finally:
    runtime.shutdown_workers()
  # Trainable: the head only (kernel, bias), zero at the start; the rest is the file's.
  assert [np.shape(t) for t in before.trainable] == [(16, CLASSES), (CLASSES,)]
  assert all(not np.any(t) for t in before.trainable)
  reference = vit.create_vit(CLASSES, TINY, finetune='head')
  backbone_keys = [key for key, v in vit.google_variables(reference)
                   if any(v is w for w in reference.non_trainable_weights)]
  order = {id(w): i for i, w in enumerate(reference.non_trainable_weights)}
  for key, v in vit.google_variables(reference):
    if id(v) in order:
      np.testing.assert_array_equal(before.non_trainable[order[id(v)]], arrays[key], err_msg=key)
  assert len(backbone_keys) == len(before.non_trainable) == len(reference.weights) - 2
  for b, a in zip(before.non_trainable, after.non_trainable):
    np.testing.assert_array_equal(a, b)
  assert all(np.any(a != b) for a, b in zip(after.trainable, before.trainable))
