"""Client drift (FedGBO paper Fig. 6.1): the sum-of-unit-vectors identity and the round metric.

The composer measures mean pairwise cosine distances from Σ u_i alone
(`accounting/drift.py`); these tests compare it with a pair-by-pair NumPy
computation, on random vectors and on one FedAvg round whose client updates
are recomputed in NumPy on the tiny linear-softmax model of
`algorithm_testing`.
"""

import csv
import types

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import algorithm_testing as at
from tff_adaptive.accounting import drift
from tff_adaptive.algorithms import composer
from tff_adaptive.algorithms import fedopt
from workflow.flags import algorithms
from workflow.flags import config
from workflow.training import algorithm_builders as registry
from workflow.training import cli
from workflow.training import experiment

K = 3
LR = 0.1


# TFF's local C++ context for the module, its worker stopped after (conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('local_cpp_context')]


def _from_sum(vectors):
  units, counts = zip(*[drift.unit_vector([tf.constant(v)]) for v in vectors])
  return float(drift.mean_cosine_distance_from_sum(tf.add_n(units), tf.add_n(counts)))


def test_identity_matches_pairwise_numpy_on_random_vectors():
  rng = np.random.default_rng(0)
  for n, dim in ((2, 3), (5, 40), (9, 7)):
    vectors = [rng.normal(size=dim) + (0.5 if i % 2 else -0.2) for i in range(n)]
    expected = drift.pairwise_cosine_distance_numpy(vectors)
    assert 0.0 < expected < 2.0
    np.testing.assert_allclose(_from_sum(vectors), expected, rtol=1e-12, atol=1e-13)


def test_zero_vectors_are_left_out_and_too_few_clients_give_nan():
  rng = np.random.default_rng(1)
  vectors = [rng.normal(size=6) for _ in range(3)]
  with_zero = vectors + [np.zeros(6)]
  np.testing.assert_allclose(_from_sum(with_zero), drift.pairwise_cosine_distance_numpy(vectors),
                             rtol=1e-12)
  assert np.isnan(_from_sum([vectors[0], np.zeros(6)]))
  # Opposite directions are at distance 2, the same direction at 0.
  np.testing.assert_allclose(_from_sum([vectors[0], -3.0 * vectors[0]]), 2.0, rtol=1e-12)
  assert abs(_from_sum([vectors[0], 2.0 * vectors[0], 7.0 * vectors[0]])) < 1e-12


def _fedavg(measure_client_drift=None):
  """FedAvg (server SGD, η_s = 1) with exactly K client steps."""
  return composer.build_process(
      at.model_fn, fedopt.fedopt_recipe(tff.learning.optimizers.build_sgdm(1.0)),
      client_learning_rate=LR, local_steps=K, measure_client_drift=measure_client_drift)


@pytest.fixture(scope='module')
def drift_process():
  return _fedavg(True)


def _np_client_model(w0, client):
  w = [a.astype(np.float64) for a in w0]
  for x, y in at.np_batches(client, K):
    w = [wi - LR * gi for wi, gi in zip(w, at.np_grad(w, x, y))]
  return w


def test_round_metric_matches_numpy(drift_process):
  clients = at.make_clients((7, 12, 5, 9), seed=3)
  state = drift_process.initialize()
  w0 = [np.asarray(t) for t in state.global_model_weights.trainable]
  metrics = drift_process.next(state, at.datasets(clients)).metrics['client_drift']
  models = [_np_client_model(w0, c) for c in clients]
  flat = lambda ws: np.concatenate([a.reshape(-1) for a in ws])
  deltas = [flat(w0) - flat(m) for m in models]
  expected_delta = drift.pairwise_cosine_distance_numpy(deltas)
  expected_model = drift.pairwise_cosine_distance_numpy([flat(m) for m in models])
  assert metrics['num_clients'] == 4
  # Clients train in float32: agreement to float32 accuracy of the updates.
  np.testing.assert_allclose(metrics['delta_cosine_distance'], expected_delta, rtol=1e-5)
  np.testing.assert_allclose(metrics['model_cosine_distance'], expected_model, rtol=1e-5)
  assert expected_delta > 0.05  # heterogeneous clients: a non-trivial value
  assert 0 < metrics['model_cosine_distance'] < metrics['delta_cosine_distance']


def test_identical_uploads_have_zero_drift(drift_process):
  same = at.make_clients((8,), seed=4) * 3
  metrics = drift_process.next(drift_process.initialize(), at.datasets(same)).metrics
  assert metrics['client_drift']['num_clients'] == 3
  assert abs(metrics['client_drift']['delta_cosine_distance']) < 1e-12
  assert abs(metrics['client_drift']['model_cosine_distance']) < 1e-12


def test_off_by_default_and_the_registry_flag():
  tf_type = lambda p: p.next.type_signature.result.metrics.member
  assert 'client_drift' not in dir(tf_type(_fedavg()))
  task = types.SimpleNamespace(name='tiny', model_fn=at.model_fn, keras_model_fn=at.keras_model)
  settings = config.from_flags(dict(
      algorithm='fedgbo', client_optimizer='sgdm', client_learning_rate=LR, local_steps=K,
      clients_per_round=3, measure_client_drift=True, execution='per_client'))
  process = registry.build(task, settings)
  assert 'client_drift' in dir(tf_type(process))
  # The context does not leak: a later build without the flag has no metric.
  assert 'client_drift' not in dir(tf_type(registry.build(task, settings.replace(
      measure_client_drift=False))))
  # Mimelite is a recipe (its full-gradient pass included): it measures drift too.
  assert 'client_drift' in dir(tf_type(registry.build(task, settings.replace(
      algorithm='mimelite', client_optimizer='sgd'))))
  with pytest.raises(algorithms.ConfigError, match='measure_client_drift'):
    registry.build(task, settings.replace(algorithm='pfedme', client_optimizer='sgd'))


# bin/train's drift run at 4 clients: epoch rounds on Dirichlet clients put
# clients of different sizes in shards of their own, and a shard of one client
# is where the cohort program once failed (tf.norm squeezed its client axis).
DRIFT_RUN = ['--task=digits', '--digits_model=mlp', '--num_clients=8', '--clients_per_round=4',
             '--client_batch_size=32', '--total_rounds=1', '--rounds_per_eval=1',
             '--show_progress=false', '--algorithm=fedavg', '--measure_client_drift']


def test_bin_train_drift_runs_and_agrees_in_both_executions(tmp_path):
  rows = {}
  for execution in ('per_client', 'cohort'):
    settings, notes = cli.config_from_args(
        [*DRIFT_RUN, f'--execution={execution}', f'--root_output_dir={tmp_path / execution}'])
    _, rows[execution] = cli.run_training(settings, notes)
    with open(tmp_path / execution / experiment.default_experiment_name(settings) / 'metrics.csv',
              newline='') as f:
      written = list(csv.DictReader(f))
    keys = [k for k in written[-1] if 'client_drift' in k]
    assert keys and all(np.isfinite(float(written[-1][k])) for k in keys), written[-1]
  keys = [k for k in rows['per_client'] if 'client_drift' in k]
  assert {k for k in rows['cohort'] if 'client_drift' in k} == set(keys)
  assert any(k.endswith('num_clients') and rows['cohort'][k] == 4 for k in keys), keys
  for key in keys:
    np.testing.assert_allclose(rows['cohort'][key], rows['per_client'][key], rtol=1e-5,
                               atol=1e-6, err_msg=key)
