"""TFF's tasks on fixtures in TFF's own SQLite format: loading, preprocessing,
model variants, evaluation hooks, laziness and the offline missing-data path.

No TFF computation runs here (training rounds are in test_tasks_docs.py).
"""

import lzma
import os
import sqlite3
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import data_files
from tasks import fixtures
from tasks import registry
from tasks.settings import TaskSettings
from tasks import tff_files
from tasks import tff_native
from workflow.training import program

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def tff_dir(tmp_path_factory):
  return fixtures.write_tff_all(str(tmp_path_factory.mktemp('tff')))


def _create(task, data_dir, *, batch_size=4, seed=0, **flags):
  """The registry's `task` on `data_dir`: one epoch, the other task flags at their defaults."""
  return registry.create_task(TaskSettings(task=task, data_dir=data_dir, **flags),
                              batch_size=batch_size, num_epochs=1, seed=seed)


def _epoch(task, cid):
  return list(task.preprocess_train(task.train_data.create_tf_dataset_for_client(cid)))


def test_fixtures_are_read_by_tffs_own_loaders(tff_dir):
  train, test = tff.simulation.datasets.emnist.load_data(only_digits=False, cache_dir=tff_dir)
  digits_train, _ = tff.simulation.datasets.emnist.load_data(only_digits=True, cache_dir=tff_dir)
  assert len(train.client_ids) == 3 and train.client_ids == test.client_ids
  example = next(iter(train.create_tf_dataset_for_client(train.client_ids[0])))
  assert example['pixels'].shape == (28, 28) and example['label'].dtype == tf.int32
  assert all(int(e['label']) < 10 for e in digits_train.create_tf_dataset_for_client(
      digits_train.client_ids[0]))
  so_train, so_heldout, so_test = tff.simulation.datasets.stackoverflow.load_data(cache_dir=tff_dir)
  post = next(iter(so_train.create_tf_dataset_for_client(so_train.client_ids[0])))
  assert set(post) == {'creation_date', 'score', 'tags', 'title', 'tokens', 'type'}
  assert len(so_heldout.client_ids) == len(so_test.client_ids) == 3
  cifar_train, _ = tff.simulation.datasets.cifar100.load_data(cache_dir=tff_dir)
  image = next(iter(cifar_train.create_tf_dataset_for_client(cifar_train.client_ids[0])))
  assert image['image'].dtype == tf.uint8 and image['image'].shape == (32, 32, 3)


def test_emnist_character_uses_tffs_preprocessing_on_every_example(tff_dir):
  task = _create('emnist_character', tff_dir)
  cid = task.train_data.client_ids[0]
  raw = list(task.train_data.create_tf_dataset_for_client(cid))
  batches = _epoch(task, cid)
  # TFF maps batches in parallel without ordering them, so compare sizes as a multiset.
  assert sorted(b[0].shape[0] for b in batches) == [2, 4]
  assert batches[0][0].shape[1:] == (28, 28, 1)
  # Same examples (shuffled by TFF): compare image sums paired with labels.
  seen = sorted((round(float(np.sum(x)), 3), int(y)) for b in batches for x, y in zip(*b))
  stored = sorted((round(float(np.sum(e['pixels'])), 3), int(e['label'])) for e in raw)
  assert seen == stored
  assert task.num_classes == 62
  assert task.keras_model_fn().output_shape == (None, 62)


def test_tff_model_fn_and_keras_model_fn_build_the_same_model(tff_dir):
  for name, flags in (('emnist_character', {}), ('emnist_autoencoder', {}),
                      ('stackoverflow_tag', {}), ('emnist_character',
                                                   {'emnist_character_model': 'fedgbo_cnn'})):
    task = _create(name, tff_dir, **flags)
    tff_shapes = [v.shape.as_list() for v in task.model_fn().trainable_variables]
    keras_shapes = [w.shape.as_list() for w in task.keras_model_fn().trainable_weights]
    assert tff_shapes == keras_shapes, name


def _normalised(image):
  return (image.astype(np.float32) / 255.0 - np.array(tff_native.FEDGBO_CIFAR_MEAN)) / np.array(
      tff_native.FEDGBO_CIFAR_STD)


def test_cifar100_fedgbo_cnn_flips_and_crops_zero_padded_normalised_images(tff_dir):
  task = _create('cifar100_image', tff_dir, cifar100_image_model='fedgbo_cnn')
  cid = task.train_data.client_ids[0]
  raw = [e['image'].numpy() for e in task.train_data.create_tf_dataset_for_client(cid)]
  candidates = []
  for image in raw:
    for flipped in (image, image[:, ::-1]):
      padded = np.pad(_normalised(flipped), ((4, 4), (4, 4), (0, 0)))
      candidates += [padded[dy:dy + 32, dx:dx + 32] for dy in range(9) for dx in range(9)]
  candidates = np.stack(candidates)
  for batch in _epoch(task, cid):
    for image in batch[0].numpy():
      assert image.shape == (32, 32, 3)
      assert np.min(np.abs(candidates - image).reshape(len(candidates), -1).max(1)) < 1e-5
  # Evaluation images are normalised only (TFF visits test clients in random order).
  evaluated = np.concatenate([b[0] for b in task.keras_evaluation().data_fn()])
  expected = np.stack([_normalised(e['image'].numpy()) for e in
                       task.baseline.datasets.test_data.create_tf_dataset_from_all_clients()])
  assert len(evaluated) == len(expected) == 9
  for image in evaluated:
    assert np.min(np.abs(expected - image).reshape(len(expected), -1).max(1)) < 1e-5


def test_cifar100_resnet_takes_standardised_24x24_crops(tff_dir):
  task = _create('cifar100_image', tff_dir)
  x, y = _epoch(task, task.train_data.client_ids[1])[0]
  assert x.shape[1:] == (24, 24, 3)
  np.testing.assert_allclose(np.mean(x.numpy(), axis=(1, 2, 3)), 0.0, atol=1e-4)
  np.testing.assert_allclose(np.std(x.numpy(), axis=(1, 2, 3)), 1.0, atol=1e-2)
  assert task.keras_evaluation().loss_fn().get_config()['from_logits'] is False


def test_emnist_autoencoder_reconstructs_inverted_pixels_and_evaluates_mse(tff_dir):
  task = _create('emnist_autoencoder', tff_dir)
  x, y = _epoch(task, task.train_data.client_ids[0])[0]
  np.testing.assert_array_equal(x, y)
  assert x.shape[1:] == (784,)
  # Evaluation: Keras' numbers equal a direct computation of the MSE/MAE.
  model = task.keras_model_fn()
  weights = tff.learning.models.ModelWeights.from_model(model)
  metrics = program.KerasEvaluator(task)(weights)
  data = list(task.keras_evaluation().data_fn())
  inputs = np.concatenate([b[0] for b in data])
  error = model.predict(inputs, verbose=0) - inputs
  assert set(metrics) == {'loss', 'mean_squared_error', 'mean_absolute_error'}
  assert metrics['mean_squared_error'] == pytest.approx(np.mean(error ** 2), rel=1e-4)
  assert metrics['mean_absolute_error'] == pytest.approx(np.mean(np.abs(error)), rel=1e-4)


def test_eval_stride_evaluates_every_kth_test_example(tff_dir):
  task = _create('emnist_autoencoder', tff_dir)
  model = task.keras_model_fn()
  weights = tff.learning.models.ModelWeights.from_model(model)
  inputs = np.concatenate([b[0] for b in task.keras_evaluation().data_fn()])
  kept = inputs[::3]
  assert 0 < len(kept) < len(inputs)
  metrics = program.KerasEvaluator(task, stride=3)(weights)
  error = model.predict(kept, verbose=0) - kept
  assert metrics['mean_squared_error'] == pytest.approx(np.mean(error ** 2), rel=1e-4)
  everything = program.KerasEvaluator(task)(weights)['mean_squared_error']
  assert everything != pytest.approx(metrics['mean_squared_error'], rel=1e-6)


def test_the_test_clients_are_joined_in_one_order_on_every_build(tmp_path):
  """TFF joins the test clients in an order drawn without a seed at every call;
  the tasks join them in one fixed order, so a strided evaluation evaluates the
  same examples in every process and after every resume (6 clients: 720 orders)."""
  fixtures.write_tff_shakespeare(str(tmp_path), num_clients=6)

  def test_rows():
    task = _create('shakespeare_character', str(tmp_path), shakespeare_character_model='gru128')
    return [x.numpy().tobytes() for x, _ in task.keras_evaluation().data_fn()]

  assert test_rows() == test_rows() == test_rows()


def test_shakespeare_character_targets_are_inputs_shifted(tff_dir):
  task = _create('shakespeare_character', tff_dir, shakespeare_character_model='gru128')
  x, y = _epoch(task, task.train_data.client_ids[0])[0]
  assert x.shape[1:] == (80,) and y.shape[1:] == (80,)
  np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
  assert int(tf.reduce_max(x)) < task.num_classes == 90
  # Like TFF's LSTM, the GRU predicts all 90 tokens at every position.
  assert task.keras_model_fn()(x).shape == (x.shape[0], 80, 90)


def test_client_shuffles_follow_the_seed_and_the_client(tff_dir):
  """TFF's preprocessing shuffles without a seed; the tasks built on it shuffle
  before it (`base.ClientShuffle`) with --seed and the client's id: the same
  order on every build, traced or eager, and another for another seed."""
  def orders(seed):
    task = _create('shakespeare_character', tff_dir, shakespeare_character_model='gru128',
                   seed=seed)
    ids = task.train_data.client_ids
    as_bytes = lambda dataset: [x.numpy().tobytes() for x, _ in dataset]
    traced = [as_bytes(d) for d in program.client_datasets(task, ids, None)]
    eager = [as_bytes(task.preprocess_train(task.train_data.create_tf_dataset_for_client(c), c))
             for c in ids]
    assert traced == eager
    return traced

  first = orders(0)
  assert first == orders(0)
  assert first != orders(1)


def test_stackoverflow_tag_bag_of_words_recall_at_5_and_sampled_evaluation(tff_dir, monkeypatch):
  monkeypatch.setattr(tff_native, 'STACKOVERFLOW_EVAL_EXAMPLES', 5)
  task = _create('stackoverflow_tag', tff_dir)
  # The vocabularies come from the Keras-cached archives, extracted on first use.
  assert os.path.exists(os.path.join(tff_dir, 'datasets', 'stackoverflow.word_count'))
  x, y = _epoch(task, task.train_data.client_ids[0])[0]
  assert x.shape[1] == len(fixtures._WORDS) and y.shape[1] == len(fixtures._TAGS)
  np.testing.assert_allclose(tf.reduce_sum(x, 1), 1.0, rtol=1e-5)  # normalised bag of words
  assert set(np.unique(y)) <= {0.0, 1.0} and float(tf.reduce_min(tf.reduce_sum(y, 1))) >= 1
  evaluation = task.keras_evaluation()
  assert not evaluation.cache
  assert sum(b[0].shape[0] for b in evaluation.data_fn()) == 5
  metrics = program.KerasEvaluator(task)(
      tff.learning.models.ModelWeights.from_model(task.keras_model_fn()))
  assert set(metrics) == {'loss', 'precision', 'recall_at_5'}
  assert 0.0 <= metrics['recall_at_5'] <= 1.0


def test_stackoverflow_vocabulary_is_read_in_count_order(tff_dir):
  tags = tff_files.load_vocabulary('t', 'tag', tff_dir, 3)
  words = tff_files.load_vocabulary('t', 'word', tff_dir, 4)
  assert tags == list(fixtures._TAGS[:3]) and words == list(fixtures._WORDS[:4])


def test_stackoverflow_word_sequences_and_metrics(tff_dir):
  task = _create('stackoverflow_word', tff_dir)
  x, y = _epoch(task, task.train_data.client_ids[0])[0]
  assert x.shape[1:] == (20,) and y.shape[1:] == (20,)
  np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
  names = [m.name for m in task.keras_evaluation().metrics_fn()]
  assert names == ['accuracy', 'accuracy_without_out_of_vocab',
                   'accuracy_without_out_of_vocab_or_end_of_sentence']
  assert task.keras_model_fn().output_shape[-1] == len(fixtures._WORDS) + 4


def test_client_subset_is_seeded_and_examples_are_capped(tmp_path):
  data_dir = str(tmp_path)
  fixtures.write_tff_emnist(data_dir, num_clients=8, examples=5)
  ids = lambda seed: _create('emnist_character', data_dir, num_clients=3,
                             seed=seed).train_data.client_ids
  assert ids(0) == ids(0) and len(ids(0)) == 3
  assert len({tuple(ids(s)) for s in range(4)}) > 1
  capped = _create('emnist_character', data_dir, max_client_examples=2)
  full, _ = tff.simulation.datasets.emnist.load_data(only_digits=False, cache_dir=data_dir)
  cid = capped.train_data.client_ids[0]
  kept = [e['label'].numpy() for e in capped.train_data.create_tf_dataset_for_client(cid)]
  first = [e['label'].numpy() for e in full.create_tf_dataset_for_client(cid)][:2]
  assert kept == first
  with pytest.raises(ValueError, match='only 8 training clients'):
    _create('emnist_character', data_dir, num_clients=9)


def test_client_datasets_are_read_from_disk_when_built(tmp_path):
  data_dir = str(tmp_path)
  path = fixtures.write_tff_emnist(data_dir, num_clients=2, examples=3)
  task = _create('emnist_character', data_dir)
  cid = task.train_data.client_ids[0]
  with sqlite3.connect(path) as db:  # a sample added after the task was built
    example = data_files.serialize_example({'pixels': np.zeros((28, 28), np.float32), 'label': 7})
    db.execute('INSERT INTO examples VALUES (?, ?, ?)', ('all_train', cid, example))
  assert sum(b[0].shape[0] for b in _epoch(task, cid)) == 4


@pytest.mark.parametrize('task,expected', [
    ('cifar100_image', 'cifar100.sqlite'), ('emnist_character', 'emnist_all.sqlite'),
    ('emnist_autoencoder', 'emnist_all.sqlite'), ('shakespeare_character', 'shakespeare.sqlite'),
    ('stackoverflow_word', 'stackoverflow.sqlite'), ('stackoverflow_tag', 'stackoverflow.sqlite')])
def test_missing_file_is_named_with_its_source_and_fetch_command(tmp_path, task, expected):
  with pytest.raises(data_files.DataNotFoundError) as error:
    _create(task, str(tmp_path))
  message = str(error.value)
  assert expected in message and str(tmp_path) in message
  assert f'https://storage.googleapis.com/tff-datasets-public/{expected}.lzma' in message
  assert 'python -c "import tensorflow_federated as tff; tff.simulation.datasets.' in message
  assert os.listdir(tmp_path) == []  # nothing downloaded, nothing half-written


def test_missing_stackoverflow_vocabulary_is_named(tmp_path):
  fixtures.write_tff_stackoverflow(str(tmp_path))
  for name in os.listdir(tmp_path / 'datasets'):
    os.remove(tmp_path / 'datasets' / name)
  with pytest.raises(data_files.DataNotFoundError,
                     match='stackoverflow.word_count.*load_word_counts'):
    _create('stackoverflow_word', str(tmp_path))


def test_corrupt_file_and_compressed_download_are_handled(tmp_path):
  (tmp_path / 'bad').mkdir()
  (tmp_path / 'bad' / 'cifar100.sqlite').write_bytes(b'not a database at all')
  with pytest.raises(data_files.DataNotFoundError, match="not one of TFF's client-data SQLite"):
    _create('cifar100_image', str(tmp_path / 'bad'))
  # The .lzma as published is decompressed in place, as TFF's downloader does.
  path = fixtures.write_tff_cifar100(str(tmp_path))
  with open(path, 'rb') as f, lzma.open(path + '.lzma', 'wb', format=lzma.FORMAT_ALONE) as out:
    out.write(f.read())
  os.remove(path)
  task = _create('cifar100_image', str(tmp_path), cifar100_image_model='fedgbo_cnn')
  assert len(task.train_data.client_ids) == 3 and os.path.exists(path)


def test_bin_train_reports_missing_data_in_one_line_without_traceback(tmp_path):
  proc = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'bin', 'train.py'), '--task=emnist_character',
       f'--data_dir={tmp_path}', f'--root_output_dir={tmp_path / "runs"}'],
      capture_output=True, text=True, timeout=300, cwd=ROOT)
  assert proc.returncode == 2
  errors = [line for line in proc.stderr.splitlines() if 'error:' in line]
  assert len(errors) == 1 and 'emnist_all.sqlite' in errors[0]
  assert 'Traceback' not in proc.stderr and 'URLError' not in proc.stderr
  assert not (tmp_path / 'runs').exists()


def _example_set(datasets):
  return [sorted((round(float(np.sum(x)), 3), int(y)) for b in ds for x, y in zip(*b))
          for ds in datasets]


def test_traced_client_datasets_equal_the_eager_ones(tmp_path):
  # One traced function of the client id builds a round's datasets.
  data_dir = str(tmp_path)
  fixtures.write_tff_emnist(data_dir, num_clients=4, examples=5)
  task = _create('emnist_character', data_dir)
  assert task.trace_client_datasets
  ids = task.train_data.client_ids[1:]
  traced = program.client_datasets(task, ids, None)
  eager = [task.preprocess_train(task.train_data.create_tf_dataset_for_client(c), c) for c in ids]
  assert [d.element_spec for d in traced] == [d.element_spec for d in eager]
  assert _example_set(traced) == _example_set(eager)
  assert [sum(1 for _ in d) for d in program.client_datasets(task, ids, 3)] == [3, 3, 3]
  with pytest.raises(ValueError, match='not a client'):
    program.client_datasets(task, ['nobody'], None)


def test_stackoverflow_heldout_and_test_client_ids_are_read_on_first_use(tff_dir):
  task = _create('stackoverflow_tag', tff_dir)
  datasets = task.baseline.datasets
  for lazy in (datasets.validation_data, datasets.test_data):
    assert lazy._data is None  # pylint: disable=protected-access
  _, heldout, test = tff.simulation.datasets.stackoverflow.load_data(cache_dir=tff_dir)
  assert datasets.test_data.element_type_structure == test.element_type_structure
  assert datasets.test_data.client_ids == test.client_ids
  assert datasets.validation_data.client_ids == heldout.client_ids
  cid = test.client_ids[0]
  tokens = lambda data: [e['tokens'].numpy() for e in data.create_tf_dataset_for_client(cid)]
  assert tokens(datasets.test_data) == tokens(test)
