"""LEAF tasks on LEAF-format JSON fixtures: the papers' preprocessing and client
filters, the one-off conversion to TFF's SQLite layout, and missing data."""

import json
import os
import sqlite3

import numpy as np
import pytest
import tensorflow as tf

from tasks import data_files
from tasks import fixtures
from tasks import leaf
from tasks import registry
from tasks.settings import TaskSettings

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow


def _create(task, data_dir, *, batch_size=4, seed=0, **flags):
  """The registry's `task` on `data_dir`: one epoch, the other task flags at their defaults."""
  return registry.create_task(TaskSettings(task=task, data_dir=data_dir, **flags),
                              batch_size=batch_size, num_epochs=1, seed=seed)


def _json_users(data_dir, split):
  users = {}
  for name in sorted(os.listdir(os.path.join(data_dir, split))):
    with open(os.path.join(data_dir, split, name)) as f:
      users.update(json.load(f)['user_data'])
  return users


def _examples(client_data, cid):
  return list(client_data.create_tf_dataset_for_client(cid))


def test_femnist_clients_in_file_order_with_inverted_images(tmp_path):
  data_dir = fixtures.write_leaf_femnist(str(tmp_path), users_per_file=(3, 2))
  task = _create('femnist', data_dir)
  # Default: the papers' first 3,000 writers, here all 5, in file order.
  users = [cid.split('_', 1)[1] for cid in task.train_data.client_ids]
  assert users == ['f0000_00', 'f0001_01', 'f0002_02', 'f1000_00', 'f1001_01']
  train_json, test_json = _json_users(data_dir, 'train'), _json_users(data_dir, 'test')
  cid = task.train_data.client_ids[3]
  raw = train_json[users[3]]
  examples = [task.preprocess_train(tf.data.Dataset.from_tensors(e)) for e in
              _examples(task.train_data, cid)]
  x = np.concatenate([next(iter(ds))['x'] for ds in examples])
  y = np.concatenate([next(iter(ds))['y'] for ds in examples])
  np.testing.assert_allclose(x.reshape(len(x), -1), 1.0 - np.array(raw['x']), atol=1e-6)
  np.testing.assert_array_equal(y, raw['y'])
  # The matched test split is the same writer's LEAF test samples.
  test_y = [int(e['y']) for e in task.test_client_data.create_tf_dataset_for_client(cid)]
  assert test_y == test_json[users[3]]['y']
  first_two = _create('femnist', data_dir, num_clients=2).train_data.client_ids
  assert first_two == task.train_data.client_ids[:2]
  with pytest.raises(ValueError, match='only 5 femnist users'):
    _create('femnist', data_dir, num_clients=6)


def test_femnist_models_take_the_same_batches(tmp_path):
  data_dir = fixtures.write_leaf_femnist(str(tmp_path))
  for model, params in (('cnn', 870_334), ('dnn', 209_662)):
    task = _create('femnist', data_dir, femnist_model=model)
    batch = next(iter(task.preprocess_train(
        task.train_data.create_tf_dataset_for_client(task.train_data.client_ids[0]))))
    assert task.keras_model_fn()(batch['x']).shape == (4, 62)
    assert task.keras_model_fn().count_params() == params


def test_sent140_filters_vocabulary_and_normalised_bags(tmp_path, monkeypatch):
  # A 20-word vocabulary makes the fixture's rare "zzz" tokens fall outside it.
  monkeypatch.setattr(leaf, 'SENT140_VOCAB_SIZE', 20)
  data_dir = fixtures.write_leaf_sent140(str(tmp_path), num_users=4, samples=12)
  train, test, meta = leaf.load_client_data('sent140', data_dir)
  # user04 has 5 tweets (< 10): dropped, as LEAF's -k 10.
  assert [c.split('_', 1)[1] for c in train.client_ids] == ['user00', 'user01', 'user02', 'user03']
  vocab = meta['vocab']
  assert len(vocab) == 20 and not any(w.startswith('zzz') for w in vocab)
  train_json = _json_users(data_dir, 'train')
  for cid in train.client_ids:
    raw = train_json[cid.split('_', 1)[1]]
    kept = [(t[4], y) for t, y in zip(raw['x'], raw['y'])
            if any(w in vocab for w in t[4].split(' '))]
    examples = _examples(train, cid)
    assert len(examples) == len(kept) == len(raw['y']) - 1  # the all-"zzz" tweet is discarded
    for example, (text, label) in zip(examples, kept):
      bag = leaf._sent140_xy(example)
      counts = np.zeros(20)
      for word in text.split(' '):
        if word in vocab:
          counts[vocab.index(word)] += 1
      np.testing.assert_allclose(bag['x'][:20], counts / counts.sum(), rtol=1e-6)
      assert float(tf.reduce_sum(bag['x'])) == pytest.approx(1.0) and int(bag['y']) == label


def test_sent140_task_batches_and_evaluation(tmp_path):
  data_dir = fixtures.write_leaf_sent140(str(tmp_path))
  task = _create('sent140', data_dir, batch_size=8)
  batch = next(iter(task.preprocess_train(
      task.train_data.create_tf_dataset_for_client(task.train_data.client_ids[0]))))
  assert batch['x'].shape == (8, leaf.SENT140_VOCAB_SIZE) and batch['x'].dtype == tf.float32
  evaluation = task.keras_evaluation()
  assert not evaluation.cache  # token ids are cached, not 5,000-float bags
  x, y = next(iter(evaluation.data_fn()))
  assert x.shape[1] == leaf.SENT140_VOCAB_SIZE and set(np.unique(y)) <= {0, 1}


def test_shakespeare_leaf_sequences_map_to_the_79_symbols(tmp_path):
  data_dir = fixtures.write_leaf_shakespeare(str(tmp_path), num_users=3, samples=10)
  task = _create('shakespeare_leaf', data_dir)
  train_json = _json_users(data_dir, 'train')
  cid = task.train_data.client_ids[1]
  raw = train_json[cid.split('_', 1)[1]]
  for example, text, target in zip(_examples(task.train_data, cid), raw['x'], raw['y']):
    assert ''.join(leaf.SHAKESPEARE_VOCAB[i] for i in example['x'].numpy()) == text
    assert leaf.SHAKESPEARE_VOCAB[int(example['y'])] == target
  batch = next(iter(task.preprocess_train(task.train_data.create_tf_dataset_for_client(cid))))
  assert batch['x'].shape == (4, 80) and task.keras_model_fn()(batch['x']).shape == (4, 79)


def test_unsplit_all_data_is_split_per_user(tmp_path):
  # Shakespeare: the last 20% of each role's lines are the test set (the FedGBO paper).
  data_dir = fixtures.write_leaf_shakespeare(str(tmp_path / 'shakes'), samples=10, split=False)
  train, test, _ = leaf.load_client_data('shakespeare_leaf', data_dir)
  with open(os.path.join(data_dir, 'all_data', 'all_data_0.json')) as f:
    users = json.load(f)['user_data']
  cid = train.client_ids[0]
  raw_y = users[cid.split('_', 1)[1]]['y']
  decode = lambda examples: [leaf.SHAKESPEARE_VOCAB[int(e['y'])] for e in examples]
  assert decode(_examples(train, cid)) == raw_y[:8] and decode(_examples(test, cid)) == raw_y[8:]
  # FEMNIST: a random 20% per writer, together covering the writer's samples.
  data_dir = fixtures.write_leaf_femnist(str(tmp_path / 'femnist'), samples=10, split=False)
  train, test, _ = leaf.load_client_data('femnist', data_dir)
  for cid in train.client_ids:
    assert (len(_examples(train, cid)), len(_examples(test, cid))) == (8, 2)


def test_conversion_is_cached_and_redone_when_the_source_changes(tmp_path, capsys):
  data_dir = fixtures.write_leaf_femnist(str(tmp_path))
  leaf.load_client_data('femnist', data_dir)
  assert 'Converting LEAF femnist' in capsys.readouterr().err
  cache = os.path.join(data_dir, 'tff_adaptive_cache')
  files = sorted(os.listdir(cache))
  leaf.load_client_data('femnist', data_dir)
  assert 'Converting' not in capsys.readouterr().err and sorted(os.listdir(cache)) == files
  source = os.path.join(data_dir, 'train', sorted(os.listdir(os.path.join(data_dir, 'train')))[0])
  os.utime(source, ns=(0, 0))
  leaf.load_client_data('femnist', data_dir)
  assert 'Converting' in capsys.readouterr().err


def test_unwritable_data_directory_caches_in_home(tmp_path, monkeypatch):
  data_dir = fixtures.write_leaf_shakespeare(str(tmp_path / 'data'))
  # A file where the cache directory would go: unwritable even for root.
  (tmp_path / 'data' / 'tff_adaptive_cache').write_text('in the way')
  monkeypatch.setenv('HOME', str(tmp_path / 'home'))
  train, _, _ = leaf.load_client_data('shakespeare_leaf', data_dir)
  home_cache = tmp_path / 'home' / '.cache' / 'tff_adaptive'
  assert any(n.endswith('.sqlite') for n in os.listdir(home_cache))
  assert len(train.client_ids) == 3


def test_clients_are_read_from_the_cache_when_sampled(tmp_path):
  data_dir = fixtures.write_leaf_femnist(str(tmp_path))
  task = _create('femnist', data_dir)
  for split in ('train', 'test'):  # the JSON is no longer needed
    for name in os.listdir(os.path.join(data_dir, split)):
      os.remove(os.path.join(data_dir, split, name))
  cid = task.train_data.client_ids[0]
  before = len(_examples(task.train_data, cid))
  cache = os.path.join(data_dir, 'tff_adaptive_cache')
  path = os.path.join(cache, next(n for n in os.listdir(cache) if n.endswith('.sqlite')))
  with sqlite3.connect(path) as db:
    db.execute('INSERT INTO examples VALUES (?, ?, ?)', ('train', cid, data_files.serialize_example(
        {'pixels': np.ones(784, np.float32), 'label': 3})))
  assert len(_examples(task.train_data, cid)) == before + 1


@pytest.mark.parametrize('task,leaf_name', [('sent140', 'sent140'), ('femnist', 'femnist'),
                                            ('shakespeare_leaf', 'shakespeare')])
def test_missing_leaf_data_says_how_to_make_it(tmp_path, task, leaf_name):
  with pytest.raises(data_files.DataNotFoundError) as error:
    _create(task, str(tmp_path))
  message = str(error.value)
  assert 'train/*.json' in message and str(tmp_path) in message
  assert 'https://github.com/TalwalkarLab/leaf' in message
  assert f'leaf/data/{leaf_name} && ./preprocess.sh' in message
  with pytest.raises(data_files.DataNotFoundError, match='set --data_dir'):
    _create(task, '')
