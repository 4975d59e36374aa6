"""Offline tasks: shapes, determinism in the seed, and non-IID-ness."""

import numpy as np
import pytest

from tasks import common
from tasks import digits
from tasks import synthetic


def _label_skew(clients, num_classes=10):
  """Mean total-variation distance of client label distributions from the global one."""
  hist = common.label_histograms(clients, num_classes).astype(float)
  dist = hist / np.maximum(hist.sum(1, keepdims=True), 1)
  global_dist = hist.sum(0) / hist.sum()
  return 0.5 * np.abs(dist - global_dist).sum(1).mean()


@pytest.mark.parametrize('partition', digits.PARTITIONS)
def test_digits_shapes_and_coverage(partition):
  train, test = digits.generate(partition, num_clients=20, seed=3)
  assert len(train) == len(test) == 20
  n_train = sum(len(c['y']) for c in train.values())
  n_test = sum(len(c['y']) for c in test.values())
  assert n_train + n_test >= 1797  # every image used (Dirichlet may duplicate one per empty client)
  assert 340 <= n_test <= 370
  for c in train.values():
    assert c['x'].shape[1:] == (8, 8, 1) and c['x'].dtype == np.float32
    assert 0.0 <= c['x'].min() and c['x'].max() <= 1.0
    assert set(np.unique(c['y'])) <= set(range(10))


def test_digits_is_deterministic_in_seed():
  a, _ = digits.generate('dirichlet', 20, seed=1)
  b, _ = digits.generate('dirichlet', 20, seed=1)
  c, _ = digits.generate('dirichlet', 20, seed=2)
  assert all(np.array_equal(a[k]['y'], b[k]['y']) for k in a)
  assert not all(np.array_equal(a[k]['y'], c[k]['y']) for k in a)


def test_digits_partitions_are_non_iid_except_iid():
  skew = {p: _label_skew(digits.generate(p, 20, alpha=0.3, seed=0)[0]) for p in digits.PARTITIONS}
  assert skew['iid'] < 0.15
  assert skew['dirichlet'] > 0.4
  assert skew['shards'] > 0.6
  # Shards: a shard is a run of the label-sorted images shorter than one label's
  # (≈36 of ≈144), so it holds one label or straddles one boundary: at most 2
  # labels per shard, 4 per client (2 shards).
  train, test = digits.generate('shards', 20, seed=0)
  for cid in train:
    train_labels = set(np.unique(train[cid]['y']).tolist())
    assert len(train_labels) <= 4
    # Test data comes from the same shard ids of the label-sorted test split, whose
    # boundaries fall at nearly (not exactly) the same places: every test label is
    # a train label or next to one.
    for label in np.unique(test[cid]['y']).tolist():
      assert min(abs(label - t) for t in train_labels) <= 1, (cid, label, train_labels)


def test_shards_same_shard_ids_give_the_same_labels():
  """With label counts in proportion, the same shard ids give exactly the same labels."""
  rng = np.random.default_rng(0)
  y_train, y_test = np.repeat(np.arange(10), 40), np.repeat(np.arange(10), 8)  # 4 shards a label
  train_idx, test_idx = digits._split_shards(y_train, y_test, 20, rng)  # pylint: disable=protected-access
  assert sorted(i for idx in train_idx for i in idx) == list(range(400))  # a partition
  for tr, te in zip(train_idx, test_idx):
    assert len(tr) == 20 and len(te) == 4  # 2 shards each
    assert 1 <= len(set(y_train[tr])) <= 2
    assert set(y_test[te]) == set(y_train[tr])


def test_shards_test_split_matches_train_labels():
  train, test = digits.generate('shards', 10, seed=0)
  overlap = [len(set(train[c]['y']) & set(test[c]['y'])) / len(set(test[c]['y'])) for c in train]
  assert np.mean(overlap) > 0.8


def test_synthetic_shapes_determinism_and_heterogeneity():
  train, test = synthetic.generate(1.0, 1.0, num_clients=30, seed=0)
  again, _ = synthetic.generate(1.0, 1.0, num_clients=30, seed=0)
  assert all(np.array_equal(train[k]['x'], again[k]['x']) for k in train)
  for k in train:
    assert train[k]['x'].shape[1] == synthetic.DIM
    assert len(train[k]['y']) >= 40 and len(test[k]['y']) >= 10
  sizes = [len(c['y']) for c in train.values()]
  assert max(sizes) > 3 * min(sizes)  # lognormal sizes
  # β spreads the clients' input means (v_k ~ N(B_k, 1), B_k ~ N(0, β)).
  def input_mean_spread(clients):
    return np.std([c['x'].mean() for c in clients.values()])
  assert (input_mean_spread(synthetic.generate(0.0, 5.0, 30, seed=0)[0]) >
          2 * input_mean_spread(synthetic.generate(0.0, 0.0, 30, seed=0)[0]))


def test_tasks_are_tff_baseline_tasks():
  import tensorflow_federated as tff
  task = digits.create_task(num_clients=5, batch_size=4)
  assert isinstance(task.baseline, tff.simulation.baselines.BaselineTask)
  ds = task.preprocess_train(task.train_data.create_tf_dataset_for_client(task.train_data.client_ids[0]))
  batch = next(iter(ds))
  assert batch['x'].shape[1:] == (8, 8, 1) and batch['x'].shape[0] <= 4
  model = task.model_fn()
  assert len(model.trainable_variables) == 4
