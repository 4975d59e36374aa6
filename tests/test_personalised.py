"""Per-FedAvg's evaluation (one SGD step on one batch), pFedMe against NumPy, noisy
clients and bad input of the personalised processes, on tests/test_mtfl.py's tiny models."""

import collections
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import algorithm_testing as at
from tasks import base as task_base
from tasks import common
from tff_adaptive.personalization import client_state
from tff_adaptive.rounds import cohort
from workflow.training import personalization
from workflow.training import program
from tff_adaptive.algorithms import fedopt
from tff_adaptive.algorithms import mtfl
from tff_adaptive.algorithms import perfedavg
from tff_adaptive.algorithms import pfedme
from workflow.flags import config
from workflow.flags import validation
from workflow.training import algorithm_builders as registry

from test_mtfl import (IDS, LR, _SPEC, _arrays, _flat, _train_datasets, arrays, bn_keras_model,  # pylint: disable=g-bad-import-order,unused-import
                       bn_model_fn, keras_local_sgd, mlp_keras_model, mtfl_all, task)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('local_cpp_context')]


# ---------------------------------------------------------------------------
# Per-FedAvg: the evaluation is ONE SGD step on ONE batch; pFedMe vs NumPy.
# ---------------------------------------------------------------------------


def test_perfedavg_evaluation_is_one_sgd_step_on_one_batch(task, arrays):
  alpha = 0.3
  process = perfedavg.build_perfedavg(bn_model_fn, tff.learning.optimizers.build_sgdm(alpha),
                                      beta=0.05, local_steps=2)
  hook = personalization.PersonalizationHook(process, task)
  ids = ['c1', 'c3']
  data = hook.client_data(1, ids, _train_datasets(task, ids))
  state = process.initialize()
  t0, n0 = _flat(process.get_model_weights(state))
  evaluated = process.evaluate_clients(state, data)
  trained = process.next(state, data)
  test = _arrays(0)[1]
  loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

  def test_loss(cid, sgd_steps):
    # The step runs in training mode: it also moves the batch-norm statistics
    # (as in the thesis's PyTorch code), and the test uses the moved ones.
    t, n = keras_local_sgd(t0, n0, arrays[cid], steps=sgd_steps, lr=alpha)
    model = bn_keras_model()
    for v, value in zip(model.trainable_variables + model.non_trainable_variables, t + n):
      v.assign(value)
    return float(loss_fn(test[cid]['y'], model(test[cid]['x'], training=False))) * 6

  for i, cid in enumerate(ids):
    for result in (evaluated[i], trained.clients[i]):  # UA before training, both ways
      got = float(result['ua']['loss_sum'])
      assert got == pytest.approx(test_loss(cid, 1), rel=1e-5)
      assert got != pytest.approx(test_loss(cid, 0), rel=1e-3)
      assert got != pytest.approx(test_loss(cid, 2), rel=1e-3)


def _np_pfedme_round(x, clients, steps, inner, lam, eta_p, eta, beta):
  finals, weights = [], []
  for client in clients:
    w = [a.astype(np.float64) for a in x]
    theta = [a.copy() for a in w]
    for bx, by in at.np_batches(client, steps):
      for _ in range(inner):
        g = at.np_grad(theta, bx, by)
        theta = [t - eta_p * (gi + lam * (t - wi)) for t, gi, wi in zip(theta, g, w)]
      w = [wi - eta * lam * (wi - t) for wi, t in zip(w, theta)]
    finals.append(w)
    weights.append(sum(len(y) for _, y in at.np_batches(client, steps)))
  p = np.array(weights, np.float64) / sum(weights)
  mean = [sum(pi * f[j] for pi, f in zip(p, finals)) for j in range(len(x))]
  return [(1 - beta) * xj + beta * mj for xj, mj in zip(x, mean)]


def test_pfedme_matches_numpy_reference():
  lam, eta_p, eta, beta, inner, steps = 2.0, 0.05, 0.2, 0.7, 2, 3
  process = pfedme.build_pfedme(at.model_fn, tff.learning.optimizers.build_sgdm(eta), lam=lam,
                                personal_learning_rate=eta_p, inner_steps=inner, beta=beta,
                                local_steps=steps)
  clients = at.make_clients((7, 12, 5), seed=1)
  datasets = at.datasets(clients)
  data = [collections.OrderedDict(train=ds, test=ds) for ds in datasets]
  state = process.initialize()
  x = [np.asarray(w, np.float64) for w in process.get_model_weights(state).trainable]
  for _ in range(2):
    state = process.next(state, data).state
    x = _np_pfedme_round(x, clients, steps, inner, lam, eta_p, eta, beta)
    got = process.get_model_weights(state).trainable
    for a, b in zip(got, x):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# Noisy clients and bad input.
# ---------------------------------------------------------------------------


def test_noisy_clients_get_fixed_noise_and_leave_the_mean(task, mtfl_all, tmp_path):
  noisy = personalization.noisy_client_ids(IDS, 0.25, seed=0)
  assert len(noisy) == 1
  noisy_task = personalization.add_input_noise(task, noisy, stddev=3.0, seed=0)
  for cid in IDS:
    clean = np.stack([e['x'] for e in task.train_data.create_tf_dataset_for_client(cid)
                      .as_numpy_iterator()])
    first = np.stack([e['x'] for e in noisy_task.train_data.create_tf_dataset_for_client(cid)
                      .as_numpy_iterator()])
    again = np.stack([e['x'] for e in noisy_task.train_data.create_tf_dataset_for_client(cid)
                      .as_numpy_iterator()])
    np.testing.assert_array_equal(first, again)  # fixed, not redrawn per pass
    if cid in noisy:
      assert 2.0 < np.std(first - clean) < 4.0
    else:
      np.testing.assert_array_equal(first, clean)
  hook = personalization.PersonalizationHook(
      mtfl_all, noisy_task, noisy_clients=noisy,
      store=client_state.ClientStateStore(str(tmp_path), mtfl_all.private_initial,
                                          mtfl_all.fingerprint))
  outputs = [collections.OrderedDict(ua=collections.OrderedDict(correct=c, examples=6))
             for c in (6, 3, 0, 6)]
  accuracies = hook._accuracies(IDS, outputs)  # pylint: disable=protected-access
  assert len(accuracies) == 3
  assert np.mean(accuracies) == pytest.approx(
      np.mean([c / 6 for cid, c in zip(IDS, (6, 3, 0, 6)) if cid not in noisy]))


def test_bad_input_gets_clear_errors(tmp_path):
  with pytest.raises(ValueError, match=r"private='gamma_beta' needs a model with "
                                       r'BatchNormalization'):
    mtfl.build_mtfl(common.keras_model_fn(mlp_keras_model, _SPEC), mlp_keras_model,
                    tff.learning.optimizers.build_sgdm(LR), private='gamma_beta')
  with pytest.raises(ValueError, match='patch_layout: private must be one of'):
    mtfl.patch_layout(bn_keras_model(), 'everything')
  # Through the registry, as bin/train builds it (exit 2 with this one line).
  from tasks import digits  # pylint: disable=g-import-not-at-top
  digits_mlp = digits.create_task(partition='shards', num_clients=4, model='mlp')
  with pytest.raises(ValueError, match=r'--private=all needs .*--digits_model=cnn_bn'):
    registry.build(digits_mlp, config.from_flags({
        'algorithm': 'mtfl', 'private': 'all', 'client_learning_rate': 0.1,
        'client_optimizer': 'sgd', 'execution': 'per_client'}))
  with pytest.raises(ValueError, match='--client_optimizer=adam contradicts'):
    registry.build(digits_mlp, config.from_flags({
        'algorithm': 'mtfl', 'private': 'none', 'client_learning_rate': 0.1,
        'client_optimizer': 'adam', 'execution': 'per_client'}))

  # A client-state directory of another model, or of another experiment.
  layout = collections.OrderedDict(g=np.ones(4, np.float32))
  client_state.ClientStateStore(str(tmp_path), layout, {'experiment': 'a'})
  other_model = collections.OrderedDict(g=np.ones(8, np.float32))
  with pytest.raises(client_state.ClientStateError, match='different model'):
    client_state.ClientStateStore(str(tmp_path), other_model, {'experiment': 'a'})
  with pytest.raises(client_state.ClientStateError,
                     match=r"different experiment \(experiment is 'a' there, 'b' here\)"):
    client_state.ClientStateStore(str(tmp_path), layout, {'experiment': 'b'})
  with pytest.raises(ValueError, match='--noisy_client_fraction needs a personalised'):
    validation.check_personalized(config.from_flags({'algorithm': 'fedavg',
                                                     'noisy_client_fraction': 0.2,
                                                     'noise_stddev': 1.0}))


def test_personalized_process_hyperparameters_round_trip():
  """get_hparams/set_hparams as a LearningProcess's (a resume applies the command's)."""
  adam = mtfl.build_mtfl(at.model_fn, at.keras_model, tff.learning.optimizers.build_sgdm(0.1),
                         private='none', strategy='fedadam')
  other = mtfl.build_mtfl(at.model_fn, at.keras_model, tff.learning.optimizers.build_sgdm(0.3),
                          tff.learning.optimizers.build_adam(0.05), private='none',
                          strategy='fedadam')
  state = adam.initialize()
  assert adam.get_hparams(state)['finalizer']['learning_rate'] == pytest.approx(0.01)
  changed = adam.set_hparams(state, other.get_hparams(other.initialize()))
  hparams = adam.get_hparams(changed)
  assert hparams['client_work']['learning_rate'] == pytest.approx(0.3)
  assert hparams['finalizer']['learning_rate'] == pytest.approx(0.05)
  for a, b in zip(at.trainable(adam, changed), at.trainable(adam, state), strict=True):
    np.testing.assert_array_equal(a, b)  # the weights are untouched


def test_a_client_state_write_stopped_midway_leaves_no_archive_on_a_closed_file(
    tmp_path, monkeypatch):
  """Ctrl-C while a client's .npz is written: the run's one-line message is not followed,
  at exit, by a ZipFile finaliser seeking the closed file ('seek of closed file')."""
  import gc  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  store = client_state.ClientStateStore(
      str(tmp_path), collections.OrderedDict(a=np.zeros(3, np.float32), b=np.ones(2, np.float32)),
      {'experiment': 'x'})
  store.put('c1', {'a': np.ones(3, np.float32), 'b': np.zeros(2, np.float32)})
  real_write_array = np.lib.format.write_array
  calls = []

  def interrupted(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:  # the second array of the archive
      raise KeyboardInterrupt
    return real_write_array(*args, **kwargs)

  monkeypatch.setattr(np.lib.format, 'write_array', interrupted)
  unraisable = []
  monkeypatch.setattr(sys, 'unraisablehook', unraisable.append)
  with pytest.raises(KeyboardInterrupt):
    store.save(1)
  gc.collect()
  assert calls and not unraisable, [str(u.exc_value) for u in unraisable]
