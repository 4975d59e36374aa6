"""bench/standins.py at a tiny size: TFF's schema, read by the tasks as TFF's files.

The full-size files are written by the bench command, never here.
"""

import json
import os
import sqlite3
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import fixtures
from tasks import registry
from tasks.settings import TaskSettings
from workflow.training import program

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'bench'))

import standins  # pylint: disable=g-import-not-at-top


@pytest.fixture(scope='module')
def standin_dir(tmp_path_factory):
  out = str(tmp_path_factory.mktemp('standins'))
  standins.write_emnist(out, example_scale=0.05, client_scale=0.002, pool=8)
  standins.write_stackoverflow(out, example_scale=0.02, client_scale=0.0001, pool=32,
                               words=12_000, tags=600)
  return out


def _schema(path):
  con = sqlite3.connect(path)
  try:
    tables = {name: [(c[1], c[2], c[3]) for c in con.execute(f'PRAGMA table_info({name});')]
              for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type='table';")}
    splits = {s for (s,) in con.execute('SELECT DISTINCT split_name FROM client_metadata;')}
    consistent = con.execute(
        'SELECT COUNT(*) FROM client_metadata m WHERE num_examples != (SELECT COUNT(*) FROM '
        'examples e WHERE e.client_id = m.client_id AND e.split_name = m.split_name);').fetchone()
    return tables, splits, consistent[0]
  finally:
    con.close()


def test_same_tables_and_splits_as_tffs_files(standin_dir, tmp_path):
  fixture_dir = str(tmp_path)
  fixtures.write_tff_emnist(fixture_dir)
  fixtures.write_tff_stackoverflow(fixture_dir)
  for name in ('emnist_all.sqlite', 'stackoverflow.sqlite'):
    tables, splits, mismatched = _schema(os.path.join(standin_dir, name))
    reference_tables, reference_splits, _ = _schema(os.path.join(fixture_dir, name))
    assert tables == reference_tables and splits == reference_splits
    assert mismatched == 0  # client_metadata.num_examples counts the rows


def test_client_counts_scale_with_tffs_published_sizes(standin_dir):
  train, test = tff.simulation.datasets.emnist.load_data(only_digits=False,
                                                         cache_dir=standin_dir)
  assert len(train.client_ids) == round(standins.EMNIST_WRITERS * 0.002)
  assert train.client_ids == test.client_ids
  example = next(iter(train.create_tf_dataset_for_client(train.client_ids[0])))
  assert example['pixels'].shape == (28, 28) and 0 <= int(example['label']) < 62
  so_train, so_heldout, so_test = tff.simulation.datasets.stackoverflow.load_data(
      cache_dir=standin_dir)
  assert len(so_train.client_ids) == round(342_477 * 0.0001)
  assert len(so_heldout.client_ids) == round(38_758 * 0.0001)
  assert set(so_test.client_ids) <= set(so_train.client_ids)
  assert not set(so_heldout.client_ids) & set(so_train.client_ids)
  post = next(iter(so_train.create_tf_dataset_for_client(so_train.client_ids[0])))
  assert set(post) == {'creation_date', 'score', 'tags', 'title', 'tokens', 'type'}
  with open(os.path.join(standin_dir, 'stackoverflow.tag_count')) as f:
    tag_counts = json.load(f)
  assert len(tag_counts) == 600 and list(tag_counts.values()) == sorted(tag_counts.values(),
                                                                      reverse=True)


def test_count_distributions_keep_the_mean_and_shape():
  rng = np.random.default_rng(0)
  emnist = standins.per_client_counts(rng, 3400, 671_585, 'gamma', standins.EMNIST_CV)
  assert abs(emnist.mean() / (671_585 / 3400) - 1) < 0.01
  assert 0.3 < emnist.std() / emnist.mean() < 0.5
  so = standins.per_client_counts(rng, 20_000, 20_000 * 396.6, 'lognormal', 1.2, 1 / 32)
  assert abs(so.mean() / (396.6 / 32) - 1) < 0.05 and so.min() >= 1
  assert np.median(so) < 0.7 * so.mean()  # heavy right tail, as the real users'


@pytest.mark.parametrize('task_name', ['emnist_character', 'stackoverflow_word',
                                       'stackoverflow_tag'])
def test_tasks_read_the_standins_as_tffs_files(standin_dir, task_name):
  task = registry.create_task(TaskSettings(task=task_name, data_dir=standin_dir),
                              batch_size=4, num_epochs=1, seed=0)
  ids = program.sample_clients(task.train_data.client_ids, 3, seed=0, round_num=1)
  batches = [next(iter(ds)) for ds in program.client_datasets(task, ids, local_steps=2)]
  assert len(batches) == 3
  model = task.keras_model_fn()
  x = batches[0][0] if isinstance(batches[0], tuple) else batches[0]['x']
  assert model(x).shape[0] == x.shape[0]
  if task_name == 'stackoverflow_tag':
    assert x.shape[1] == 10_000 and x.dtype == tf.float32


def test_data_path_bench_runs_on_the_standins(standin_dir, tmp_path):
  # bench/data_path.py's measurements in this process at a tiny size (schema only).
  import data_path  # pylint: disable=g-import-not-at-top
  args = data_path.main.__globals__['argparse'].Namespace(
      data_dir=standin_dir, batch=4, local_steps=2, rounds=1, emnist_model='cnn',
      baseline=False)
  created = data_path.child_create(args, 'stackoverflow_tag')
  assert created['train_clients'] == round(342_477 * 0.0001)
  assert created['create_s'] > 0 and created['peak_rss_mib'] > 0 < created['rss_after_import_mib']
  rounds = data_path.child_rounds(args, 'emnist_character', 2)
  assert len(rounds['rounds']) == 2
  for key in ('sample_s', 'build_s', 'build_eager_s', 'pipeline_s', 'round_s', 'round_mem_s'):
    assert rounds['medians'][key] > 0
  assert 0 < rounds['python_data_share'] < 1
