"""The FedOpt paper's CIFAR-10 split: per-client Dirichlet(α) label distributions, 500 x 100.

The partition is checked on CIFAR-10's real label counts (5,000 per class) without
images; the task itself on Keras-format fixture files.
"""

import dataclasses
import os

import numpy as np
import pytest

from tasks import cifar10_lda
from tasks import fixtures
from tasks import registry
from tasks.settings import TaskSettings
from tasks import thesis

LABELS = np.repeat(np.arange(10), 5000)  # CIFAR-10's training labels, as counts


def _histograms(indices, labels=LABELS):
  return np.stack([np.bincount(labels[row], minlength=10) for row in indices])


@pytest.fixture(scope='module')
def split_01():
  return cifar10_lda.lda_partition(LABELS, 500, 100, 0.1, np.random.default_rng(0))


def test_sizes_cover_every_image_once(split_01):
  indices, proportions = split_01
  assert indices.shape == (500, 100)
  assert proportions.shape == (500, 10)
  np.testing.assert_allclose(proportions.sum(axis=1), 1.0)
  # 500 x 100 = 50,000: every training image is used exactly once.
  np.testing.assert_array_equal(np.sort(indices.reshape(-1)), np.arange(50_000))


def test_alpha_0_1_clients_are_dominated_by_one_or_two_labels(split_01):
  hist = _histograms(split_01[0])
  top2 = np.sort(hist, axis=1)[:, -2:].sum(axis=1)
  # Most clients: ≥ 80 of their 100 images from their two main labels (78% of
  # them here; a few hold a single label only).
  assert np.mean(top2 >= 80) > 0.7
  assert np.mean(hist.max(axis=1) == 100) > 0.02
  # The label draws follow q: where it is exhausted-free, a client's main
  # label is its largest proportion.
  q = split_01[1]
  assert np.mean(hist.argmax(axis=1) == q.argmax(axis=1)) > 0.8


def test_alpha_100_is_close_to_uniform():
  indices, _ = cifar10_lda.lda_partition(LABELS, 500, 100, 100.0, np.random.default_rng(0))
  # 500 x 100 uses every image: the last clients take what remains once
  # labels run out, so the uniformity holds for the bulk of the clients.
  hist = _histograms(indices[:450])
  assert np.all((hist > 0).sum(axis=1) == 10)
  # Multinomial(100, ≈1/10) counts: mean 10, sd ≈ 3.
  assert abs(hist.mean() - 10) < 1e-9 and 2.5 < hist.std() < 3.8
  top2 = np.sort(hist, axis=1)[:, -2:].sum(axis=1)
  assert np.max(top2) < 50


def test_deterministic_in_the_seed_and_exhausted_labels_are_removed():
  a = cifar10_lda.split(LABELS, LABELS[::5], 500, 0.1, seed=3)
  b = cifar10_lda.split(LABELS, LABELS[::5], 500, 0.1, seed=3)
  c = cifar10_lda.split(LABELS, LABELS[::5], 500, 0.1, seed=4)
  for key in ('train', 'test', 'proportions'):
    np.testing.assert_array_equal(a[key], b[key])
  assert not np.array_equal(a['train'], c['train'])
  assert a['test'].shape == (500, 20)  # 10,000 test images, same q
  # A tiny population where a label runs out: the split still completes, and
  # after exhaustion the label is never drawn again (each index used once).
  labels = np.array([0] * 3 + [1] * 30)
  indices, _ = cifar10_lda.lda_partition(labels, 3, 11, 0.1, np.random.default_rng(1),
                                         proportions=np.array([[1.0, 0.0]] * 3), num_classes=2)
  assert len(set(indices.reshape(-1))) == 33
  assert (labels[indices[0]] == 0).sum() == 3  # client 0 took all three 0s, then only 1s
  with pytest.raises(ValueError, match='need'):
    cifar10_lda.lda_partition(labels, 4, 10, 0.1, np.random.default_rng(0), num_classes=2)


def test_task_on_fixture_saves_and_reuses_its_split(tmp_path):
  data_dir = str(tmp_path / 'keras')
  fixtures.write_keras_cifar10(data_dir, per_batch=200, test=100)  # 1,000 train images
  settings = TaskSettings(task='cifar10', partition='dirichlet', dirichlet_alpha=0.1,
                          num_clients=10, data_dir=data_dir, cifar10_model='resnet18')
  run = dict(batch_size=20, num_epochs=1, seed=0, run_dir=str(tmp_path / 'runs' / 'lda'))
  task = registry.create_task(settings, **run)
  assert len(task.train_data.client_ids) == 10
  sizes = [len(list(task.train_data.create_tf_dataset_for_client(c)))
           for c in task.train_data.client_ids]
  assert sizes == [100] * 10
  x, y = next(iter(task.preprocess_train(
      task.train_data.create_tf_dataset_for_client(task.train_data.client_ids[0]))))
  assert x.shape == (20, 24, 24, 3) and y.shape == (20,)
  saved = os.path.join(str(tmp_path / 'runs'), 'lda', cifar10_lda.PARTITION_FILE)
  with np.load(saved) as f:
    first = f['train'].copy()
    assert f['train'].shape == (10, 100) and float(f['alpha']) == 0.1
  # A repeated run reads the saved split, even if the generator would differ.
  with np.load(saved) as f:
    tampered = {k: f[k] for k in f.files}
  tampered['train'] = first[::-1].copy()
  np.savez(saved, **tampered)
  again = registry.create_task(settings, **run)
  first_client = again.train_data.create_tf_dataset_for_client(again.train_data.client_ids[0])
  y_train = thesis.load_cifar10(data_dir)[1]
  assert sorted(y_train[first[-1]]) != sorted(y_train[first[0]])
  assert sorted(int(e['label']) for e in first_client) == sorted(y_train[first[-1]])
  with pytest.raises(ValueError, match='alpha'):
    registry.create_task(dataclasses.replace(settings, dirichlet_alpha=0.5), **run)
  # Other partitions stay the thesis' splits.
  shards = registry.create_task(
      dataclasses.replace(settings, partition='shards', cifar10_model='cnn'), **run)
  assert len(shards.train_data.client_ids) == 10
