"""Thesis MNIST/CIFAR-10 tasks: Keras file loaders, the iid/shards splits with
matched per-client test data, and missing files."""

import os
import pickle

import numpy as np
import pytest
import tensorflow as tf

from tasks import data_files
from tasks import fixtures
from tasks import registry
from tasks.settings import TaskSettings
from tasks import thesis


def _create(task, data_dir, *, batch_size=20, seed=0, **flags):
  """The registry's `task` on `data_dir`: 10 clients by shards, one epoch unless `flags` say."""
  flags = dict(dict(num_clients=10, partition='shards', dirichlet_alpha=0.5), **flags)
  return registry.create_task(TaskSettings(task=task, data_dir=data_dir, **flags),
                              batch_size=batch_size, num_epochs=1, seed=seed)


def test_mnist_npz_is_found_in_data_dir_or_its_keras_datasets_subdir(tmp_path):
  fixtures.write_keras_mnist(str(tmp_path / 'datasets'), train=50, test=20)
  x_train, y_train, x_test, y_test = thesis.load_mnist(str(tmp_path))
  with np.load(tmp_path / 'datasets' / 'mnist.npz') as f:
    np.testing.assert_array_equal(x_train[..., 0], f['x_train'])
    np.testing.assert_array_equal(y_test, f['y_test'])
  assert x_train.shape == (50, 28, 28, 1) and x_test.dtype == np.uint8


def test_cifar10_batches_archive_and_npz_load_identically(tmp_path):
  directory = fixtures.write_keras_cifar10(str(tmp_path / 'dir'), per_batch=8, test=5)
  fixtures.write_keras_cifar10(str(tmp_path / 'tar'), per_batch=8, test=5, archive=True)
  from_dir = thesis.load_cifar10(str(tmp_path / 'dir'))
  from_tar = thesis.load_cifar10(str(tmp_path / 'tar'))
  np.savez(tmp_path / 'cifar10.npz', x_train=from_dir[0], y_train=from_dir[1],
           x_test=from_dir[2], y_test=from_dir[3])
  from_npz = thesis.load_cifar10(str(tmp_path))
  for a, b, c in zip(from_dir, from_tar, from_npz):
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
  assert from_dir[0].shape == (40, 32, 32, 3) and from_dir[2].shape == (5, 32, 32, 3)
  # Rows are channel planes (R, G, B), as Keras' load_batch reads them.
  with open(os.path.join(directory, 'data_batch_1'), 'rb') as f:
    row = pickle.load(f, encoding='bytes')[b'data'][0]
  np.testing.assert_array_equal(from_dir[0][0, :, :, 1], row[1024:2048].reshape(32, 32))


def test_iid_split_is_an_equal_partition_of_both_sets():
  y_train, y_test = np.arange(103) % 10, np.arange(51) % 10
  train, test = thesis.split_indices('iid', y_train, y_test, 5, seed=1)
  for parts, n in ((train, 103), (test, 51)):
    assert sorted(np.concatenate(parts)) == list(range(n))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_shards_give_two_classes_and_matching_test_classes():
  y_train, y_test = np.repeat(np.arange(10), 60), np.repeat(np.arange(10), 20)
  train, test = thesis.split_indices('shards', y_train, y_test, 10, seed=0)
  assert sorted(np.concatenate(train)) == list(range(600))
  for tr, te in zip(train, test):
    assert len(tr) == 60 and len(te) == 20
    assert len(set(y_train[tr])) <= 2 and set(y_test[te]) == set(y_train[tr])
  # Deterministic in the seed, different across seeds.
  again, _ = thesis.split_indices('shards', y_train, y_test, 10, seed=0)
  other, _ = thesis.split_indices('shards', y_train, y_test, 10, seed=1)
  assert all((a == b).all() for a, b in zip(train, again))
  assert not all(set(a) == set(b) for a, b in zip(train, other))


def test_dirichlet_split_uses_the_same_label_proportions_for_test():
  y_train, y_test = np.repeat(np.arange(10), 200), np.repeat(np.arange(10), 100)
  train, test = thesis.split_indices('dirichlet', y_train, y_test, 8, seed=0, alpha=0.2)
  hist = lambda parts, y: np.stack([np.bincount(y[p], minlength=10) for p in parts])
  htr, hte = hist(train, y_train), hist(test, y_test)
  np.testing.assert_allclose(htr / 200, hte / 100, atol=0.011)
  assert (htr.max(1) / htr.sum(1)).mean() > 0.3  # skewed, unlike an iid split


@pytest.mark.parametrize('task,model,shape', [('mnist', '2nn', (28, 28, 1)),
                                              ('mnist', 'cnn', (28, 28, 1)),
                                              ('cifar10', 'mtfl_cnn', (32, 32, 3))])
def test_tasks_scale_pixels_and_expose_user_test_data(tmp_path, task, model, shape):
  fixtures.write_keras_mnist(str(tmp_path), train=400, test=200)
  fixtures.write_keras_cifar10(str(tmp_path), per_batch=80, test=200)
  built = _create(task, str(tmp_path), **{f'{task}_model': model})
  assert len(built.train_data.client_ids) == 10
  cid = built.train_data.client_ids[3]
  batch = next(iter(built.preprocess_train(built.train_data.create_tf_dataset_for_client(cid))))
  assert batch['x'].shape[1:] == shape and batch['x'].dtype == tf.float32
  assert 0.0 <= float(tf.reduce_min(batch['x'])) and float(tf.reduce_max(batch['x'])) <= 1.0
  assert built.keras_model_fn()(batch['x']).shape == (batch['x'].shape[0], 10)
  # Two label-sorted shards each (a shard may straddle a label boundary of the
  # fixture's unbalanced random labels); the test shards have the same ids.
  for cid in built.train_data.client_ids:
    train_labels = [int(e['y']) for e in built.train_data.create_tf_dataset_for_client(cid)]
    test_labels = [int(e['y']) for e in built.test_client_data.create_tf_dataset_for_client(cid)]
    assert len(set(train_labels)) <= 4
    assert np.mean([y in set(train_labels) for y in test_labels]) >= 0.5


def test_split_errors_name_the_flag(tmp_path):
  fixtures.write_keras_mnist(str(tmp_path), train=100, test=30)
  with pytest.raises(ValueError, match='--num_clients=20 needs 2 test images per client'):
    _create('mnist', str(tmp_path), num_clients=20)
  with pytest.raises(ValueError, match='--mnist_model must be one of'):
    _create('mnist', str(tmp_path), mnist_model='resnet')


@pytest.mark.parametrize('task,expected', [('mnist', 'mnist.npz'),
                                           ('cifar10', 'cifar-10-batches-py')])
def test_missing_keras_files_are_named_with_the_fetch_command(tmp_path, task, expected):
  with pytest.raises(data_files.DataNotFoundError) as error:
    _create(task, str(tmp_path))
  message = str(error.value)
  assert expected in message and str(tmp_path) in message
  assert f'tf.keras.datasets.{task}.load_data()' in message
