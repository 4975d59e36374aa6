"""MTFL (thesis ch. 4), its client-state store, Per-FedAvg and pFedMe.

Processes run on a tiny model with one batch-norm layer (5 → Dense 4 → BN →
ReLU → Dense 3) and unshuffled client datasets, so every client's local
training can be recomputed independently with eager Keras (patches) or NumPy
(pFedMe on the linear-softmax model of `algorithm_testing`).
"""

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

D, C, B = at.D, at.C, at.B
K = 3
LR = 0.1
SIZES = (7, 12, 5, 9)  # c0: batches 4, 3, 4 (K = 3 cycles); c2 cycles within a round
IDS = [f'c{i}' for i in range(len(SIZES))]
# Trainable: kernel1, bias1, γ, β, kernel2, bias2; non-trainable: μ, σ².
GAMMA, BETA, MEAN, VAR = 'trainable_2', 'trainable_3', 'non_trainable_0', 'non_trainable_1'
SHARED_FLOATS = D * 4 + 4 + 4 * C + C


def bn_keras_model() -> tf.keras.Model:
  init = lambda seed: tf.keras.initializers.RandomNormal(stddev=0.5, seed=seed)
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(D,)),
      tf.keras.layers.Dense(4, kernel_initializer=init(1), bias_initializer=init(2)),
      # A fast momentum so that moving statistics visibly change in K steps.
      tf.keras.layers.BatchNormalization(momentum=0.5),
      tf.keras.layers.ReLU(),
      tf.keras.layers.Dense(C, kernel_initializer=init(3), bias_initializer=init(4))])


def mlp_keras_model() -> tf.keras.Model:
  return tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(D,)),
                              tf.keras.layers.Dense(C)])


_SPEC = collections.OrderedDict(x=tf.TensorSpec([D], tf.float32), y=tf.TensorSpec([], tf.int32))
bn_model_fn = common.keras_model_fn(bn_keras_model, _SPEC)


def _arrays(seed):
  rng = np.random.default_rng(seed)
  train, test = {}, {}
  for i, (cid, n) in enumerate(zip(IDS, SIZES)):
    # Client i's inputs are shifted: different batch statistics per client.
    train[cid] = {'x': rng.normal(0.5 * i, 1.0 + 0.3 * i, (n, D)).astype(np.float32),
                  'y': rng.integers(0, C, n).astype(np.int32)}
    test[cid] = {'x': rng.normal(0.5 * i, 1.0 + 0.3 * i, (6, D)).astype(np.float32),
                 'y': rng.integers(0, C, 6).astype(np.int32)}
  return train, test


def make_task() -> task_base.FederatedTask:
  """A FederatedTask around the tiny BN model; unshuffled batches of B."""
  train, test = _arrays(0)
  train_data = common.client_data_from_arrays(train)
  test_data = common.client_data_from_arrays(test)
  datasets = tff.simulation.baselines.BaselineTaskDatasets(
      train_data=train_data, test_data=test_data, validation_data=None,
      train_preprocess_fn=lambda ds: ds.batch(B), eval_preprocess_fn=lambda ds: ds.batch(4))
  return task_base.FederatedTask(
      name='tiny_bn', baseline=tff.simulation.baselines.BaselineTask(datasets, bn_model_fn),
      keras_model_fn=bn_keras_model, num_classes=C, test_client_data=test_data)


# TFF's local C++ context for the module, its worker stopped after (conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('local_cpp_context')]


@pytest.fixture(scope='module')
def task():
  return make_task()


@pytest.fixture(scope='module')
def arrays():
  return _arrays(0)[0]


@pytest.fixture(scope='module')
def mtfl_all():
  return mtfl.build_mtfl(bn_model_fn, bn_keras_model, tff.learning.optimizers.build_sgdm(LR),
                         private='all', strategy='fedavg', local_steps=K)


def _train_datasets(task, ids):
  return program.client_datasets(task, ids, None)


def _flat(weights):
  return ([np.asarray(w) for w in weights.trainable], [np.asarray(w) for w in weights.non_trainable])


def keras_local_sgd(trainable, non_trainable, client, steps=K, lr=LR):
  """Independent eager Keras SGD: K steps in training mode from the given weights."""
  model = bn_keras_model()
  for v, value in zip(model.trainable_variables, trainable):
    v.assign(value)
  for v, value in zip(model.non_trainable_variables, non_trainable):
    v.assign(value)
  loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  for x, y in at.np_batches(client, steps):
    with tf.GradientTape() as tape:
      loss = loss_fn(y, model(x.astype(np.float32), training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    for v, g in zip(model.trainable_variables, grads):
      v.assign(v - lr * g)
  return ([v.numpy() for v in model.trainable_variables],
          [v.numpy() for v in model.non_trainable_variables])


def _patched(trainable, non_trainable, private):
  t, n = list(trainable), list(non_trainable)
  t[2], t[3], n[0], n[1] = private[GAMMA], private[BETA], private[MEAN], private[VAR]
  return t, n


def _examples(client, steps=K):
  return sum(len(y) for _, y in at.np_batches(client, steps))


# ---------------------------------------------------------------------------
# Patches: exactly local training's result, untouched by others and the server.
# ---------------------------------------------------------------------------


def test_patches_are_local_training_results_and_untouched(mtfl_all, task, arrays, tmp_path):
  store = client_state.ClientStateStore(str(tmp_path), mtfl_all.private_initial,
                                        mtfl_all.fingerprint)
  hook = personalization.PersonalizationHook(mtfl_all, task, store=store)
  state = mtfl_all.initialize()
  t0, n0 = _flat(mtfl_all.get_model_weights(state))
  # A client that never trained has the server's initial batch-norm values.
  for key, value in ((GAMMA, t0[2]), (BETA, t0[3]), (MEAN, n0[0]), (VAR, n0[1])):
    np.testing.assert_array_equal(mtfl_all.private_initial[key], value)

  # Round 1: c0, c1 start from the initial patch.
  ids = ['c0', 'c1']
  out = mtfl_all.next(state, hook.client_data(1, ids, _train_datasets(task, ids)))
  hook.after_round(1, ids, out, evaluate=False)
  expected = {}
  for cid, client_out in zip(ids, out.clients):
    ref_t, ref_n = keras_local_sgd(*_patched(t0, n0, mtfl_all.private_initial), arrays[cid])
    expected[cid] = (ref_t, ref_n)
    got = client_out['private']
    for key, ref in ((GAMMA, ref_t[2]), (BETA, ref_t[3]), (MEAN, ref_n[0]), (VAR, ref_n[1])):
      np.testing.assert_allclose(got[key], ref, rtol=1e-5, atol=1e-6, err_msg=f'{cid} {key}')
    # The store holds exactly what the client returned.
    for key, value in store.get(cid).items():
      np.testing.assert_array_equal(value, got[key])
    assert not np.allclose(got[MEAN], mtfl_all.private_initial[MEAN])  # statistics moved
  # The server never received a patch: its BN values are still the initial ones.
  t1, n1 = _flat(mtfl_all.get_model_weights(out.state))
  for i in (2, 3):
    np.testing.assert_array_equal(t1[i], t0[i])
  for i in (0, 1):
    np.testing.assert_array_equal(n1[i], n0[i])
  # Shared weights are the example-weighted average of the clients' results.
  w = np.array([_examples(arrays[c]) for c in ids], np.float64)
  for i in (0, 1, 4, 5):
    mean = sum(wj * expected[c][0][i] for wj, c in zip(w / w.sum(), ids))
    np.testing.assert_allclose(t1[i], mean, rtol=1e-5, atol=1e-6)

  # Round 2 without c0: c0's stored patch is untouched, bit for bit; c1
  # starts from the new global model plus ITS patch of round 1.
  c0_before = store.get('c0')
  c1_patch = store.get('c1')
  ids = ['c1', 'c2']
  out2 = mtfl_all.next(out.state, hook.client_data(2, ids, _train_datasets(task, ids)))
  hook.after_round(2, ids, out2, evaluate=False)
  for key, value in store.get('c0').items():
    np.testing.assert_array_equal(value, c0_before[key])
  ref_t, ref_n = keras_local_sgd(*_patched(t1, n1, c1_patch), arrays['c1'])
  np.testing.assert_allclose(out2.clients[0]['private'][GAMMA], ref_t[2], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out2.clients[0]['private'][MEAN], ref_n[0], rtol=1e-5, atol=1e-6)
  # c2 has never trained: it got the initial patch.
  ref_t, _ = keras_local_sgd(*_patched(t1, n1, mtfl_all.private_initial), arrays['c2'])
  np.testing.assert_allclose(out2.clients[1]['private'][BETA], ref_t[3], rtol=1e-5, atol=1e-6)

  # UA is measured before training, with the global model plus the patch.
  model = bn_keras_model()
  pt, pn = _patched(t1, n1, c1_patch)
  for v, value in zip(model.trainable_variables + model.non_trainable_variables, pt + pn):
    v.assign(value)
  test_x, test_y = _arrays(0)[1]['c1']['x'], _arrays(0)[1]['c1']['y']
  hits = np.sum(np.argmax(model(test_x, training=False).numpy(), -1) == test_y)
  assert out2.clients[0]['ua']['correct'] == hits
  assert out2.clients[0]['ua']['examples'] == len(test_y)


# ---------------------------------------------------------------------------
# Private values are never uploaded, aggregated or counted.
# ---------------------------------------------------------------------------


def _leaf_shapes(type_spec):
  return [list(t.shape) for t in tf.nest.flatten(tff.types.type_to_tf_tensor_specs(type_spec))]


def test_private_values_never_in_upload_or_bits(mtfl_all, task):
  upload = mtfl_all.upload_type
  # What is aggregated: Δ of the two dense layers only; nothing of the BN layer.
  assert _leaf_shapes(upload) == [[D, 4], [4], [4, C], [C]]
  assert [name for name, _ in tff.structure.iter_elements(upload)] == ['trainable',
                                                                      'non_trainable']
  assert len(upload.trainable) == 4 and not list(upload.non_trainable)
  assert mtfl_all.upload_bits == 32 * SHARED_FLOATS
  ids = ['c0', 'c1']
  data = [mtfl_all.client_input(ds, mtfl_all.private_initial, test=ds)
          for ds in _train_datasets(task, ids)]
  out = mtfl_all.next(mtfl_all.initialize(), data)
  assert out.metrics['cost']['upload_bits_per_client'] == 32 * SHARED_FLOATS
  # Download: the shared weights and the round's (η, K); no patch.
  assert out.metrics['cost']['download_bits_per_client'] == 32 * SHARED_FLOATS + 64

  # FedAvg-Adam: the private γ, β keep their Adam moments on the client too.
  adam = mtfl.build_mtfl(bn_model_fn, bn_keras_model,
                         tff.learning.optimizers.build_adam(0.01, beta_2=0.99, epsilon=1e-8),
                         private='all', strategy='fedavg_adam', local_steps=K)
  assert sorted(adam.private_initial) == sorted(
      [GAMMA, BETA, MEAN, VAR, 'optimizer_m_2', 'optimizer_m_3', 'optimizer_v_2',
       'optimizer_v_3'])
  for key in ('m', 'v'):  # moments of the shared weights only
    assert _leaf_shapes(adam.upload_type.optimizer[key]) == [[D, 4], [4], [4, C], [C]]
  assert _leaf_shapes(adam.upload_type.optimizer.step) == [[]]
  assert adam.upload_bits == 32 * (3 * SHARED_FLOATS + 1)  # Δ, m, v of shared + step

  # The other choices, from the layout (what the round splits on).
  keras_model = bn_keras_model()
  assert mtfl.patch_layout(keras_model, 'mu_sigma').private_trainable == ()
  assert mtfl.patch_layout(keras_model, 'mu_sigma').private_non_trainable == (0, 1)
  assert mtfl.patch_layout(keras_model, 'gamma_beta').private_trainable == (2, 3)
  assert mtfl.patch_layout(keras_model, 'gamma_beta').private_non_trainable == ()
  assert mtfl.patch_layout(keras_model, 'none').empty


# ---------------------------------------------------------------------------
# --private=none is plain FedAvg.
# ---------------------------------------------------------------------------


def test_none_equals_fedavg(task, arrays):
  ours = mtfl.build_mtfl(bn_model_fn, bn_keras_model, tff.learning.optimizers.build_sgdm(LR),
                         private='none', strategy='fedavg', local_steps=K)
  assert not ours.has_private_state
  fedavg = fedopt.build_fedopt(
      bn_model_fn, tff.learning.optimizers.build_sgdm(LR), fedopt.build_server_optimizer('sgd', 1.0),
      local_steps=K)
  ids = ['c0', 'c1', 'c3']
  datasets = _train_datasets(task, ids)
  hook = personalization.PersonalizationHook(ours, task)
  s_ours, s_ref = ours.initialize(), fedavg.initialize()
  t0, n0 = _flat(ours.get_model_weights(s_ours))
  for round_num in (1, 2):
    out = ours.next(s_ours, hook.client_data(round_num, ids, datasets))
    s_ours, s_ref = out.state, fedavg.next(s_ref, datasets).state
    assert 'private' not in out.clients[0]
    ours_t, ours_n = _flat(ours.get_model_weights(s_ours))
    ref_t, _ = _flat(fedavg.get_model_weights(s_ref))
    for a, b in zip(ours_t, ref_t):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    if round_num == 1:
      # Moving statistics are shared too: the example-weighted average of the
      # clients' (the composer leaves them at their initial values).
      w = np.array([_examples(arrays[c]) for c in ids], np.float64)
      finals = [keras_local_sgd(t0, n0, arrays[c])[1] for c in ids]
      for i in (0, 1):
        mean = sum(wj * f[i] for wj, f in zip(w / w.sum(), finals))
        np.testing.assert_allclose(ours_n[i], mean, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# Checkpoint and resume: bit for bit, also after a lost server checkpoint.
# ---------------------------------------------------------------------------


def _run(process, task, out_dir, total_rounds):
  store = client_state.ClientStateStore(os.path.join(out_dir, 'client_state'),
                                        process.private_initial, process.fingerprint)
  hook = personalization.PersonalizationHook(process, task, store=store)
  config = program.LoopConfig(total_rounds=total_rounds, clients_per_round=2, rounds_per_eval=2,
                              rounds_per_checkpoint=2, output_dir=out_dir, seed=3,
                              show_progress=False, client_state=hook)
  state, row = program.run(process, task, config)
  return state, row, store


@pytest.fixture(scope='module')
def mtfl_all_cohort():
  return mtfl.build_mtfl(bn_model_fn, bn_keras_model, tff.learning.optimizers.build_sgdm(LR),
                         private='all', strategy='fedavg', local_steps=K, execution='cohort')


# The cohort keeps the private state in the same store: a resume must restore
# it there as it does per client.
@pytest.mark.parametrize('execution', ['per_client', 'cohort'])
def test_state_survives_checkpoint_and_resume_bit_for_bit(execution, request, task, tmp_path):
  mtfl_all = request.getfixturevalue('mtfl_all' if execution == 'per_client' else
                                     'mtfl_all_cohort')
  assert cohort.is_cohort(mtfl_all) == (execution == 'cohort')
  full = str(tmp_path / 'full')
  state_a, row_a, store_a = _run(mtfl_all, task, full, 3)
  assert 'ua/mean' in row_a and 'ua_all/mean' in row_a and 'eval/accuracy' in row_a

  # Interrupted: the server checkpoint of round 3 is lost (a crash between
  # the client-state snapshot and the server save): the rerun resumes at 2,
  # must drop the client snapshot of round 3 and redo round 3.
  part = str(tmp_path / 'part')
  _run(mtfl_all, task, part, 3)
  assert os.path.exists(os.path.join(part, 'client_state', 'manifest_3.json'))
  shutil.rmtree(os.path.join(part, 'checkpoints', 'program_state_3'))
  state_b, row_b, store_b = _run(mtfl_all, task, part, 3)

  for a, b in zip(tf.nest.flatten(state_a), tf.nest.flatten(state_b)):
    np.testing.assert_array_equal(a, b)
  assert store_a.known_clients() == store_b.known_clients() and store_a.known_clients()
  for cid in IDS:
    a, b = store_a.get(cid), store_b.get(cid)
    assert list(a) == list(b)
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])
  # A fresh store reading the last snapshot from disk sees the same values.
  reopened = client_state.ClientStateStore(os.path.join(part, 'client_state'),
                                           mtfl_all.private_initial, mtfl_all.fingerprint)
  reopened.restore(3)
  for cid in IDS:
    for key, value in reopened.get(cid).items():
      np.testing.assert_array_equal(value, store_a.get(cid)[key])
  assert row_a['ua/mean'] == row_b['ua/mean'] and row_a['ua_all/mean'] == row_b['ua_all/mean']


def test_store_snapshots_restore_and_trim(tmp_path):
  initial = collections.OrderedDict(a=np.zeros(3, np.float32), b=np.ones((2, 2), np.float32))
  store = client_state.ClientStateStore(str(tmp_path), initial, {'x': 1}, keep_total=2,
                                        max_cached=1)
  rng = np.random.default_rng(0)
  history = {}
  for version in (1, 2, 3):
    for cid in ('u/1', 'u 2'):  # ids that are not file names
      value = collections.OrderedDict(a=rng.normal(size=3).astype(np.float32),
                                      b=rng.normal(size=(2, 2)).astype(np.float32))
      if version == 2 and cid == 'u 2':
        continue  # not sampled in round 2
      store.put(cid, value)
      history[(cid, version)] = value
    store.save(version)
  assert store.versions() == [2, 3]  # keep_total
  assert 'never' not in store and np.array_equal(store.get('never')['b'], initial['b'])
  store.restore(2)  # round 3's snapshot is dropped
  assert store.versions() == [2]
  for cid, version in (('u/1', 2), ('u 2', 1)):
    for key, value in store.get(cid).items():
      assert value.tobytes() == history[(cid, version)][key].tobytes()
  with pytest.raises(client_state.ClientStateError, match='no snapshot of round 3'):
    store.restore(3)
  with pytest.raises(ValueError, match='b is float32'):
    store.put('u/1', collections.OrderedDict(a=np.zeros(3, np.float32),
                                             b=np.zeros(3, np.float32)))
