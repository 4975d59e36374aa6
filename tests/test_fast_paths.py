"""The round's fast paths compute what the plain paths compute.

- `model_info.client_model`: a client's trainable variables start at zero
  instead of running their random initialisers (overwritten by the broadcast
  weights anyway); every other variable keeps its initialiser.
- FedGBO clients compute β1·m and √v + ε once per round
  (`BiasedOptimizer.fixed_factors`): the direction is bit-identical to U(g, s)
  evaluated in full at every step.
- The executor's default concurrency (`runtime.resolve_concurrency`).
- Values are serialised in place (`tff_patches._serialize_into`): the same
  protos as TFF's serialiser, without a copy per level of nesting.
- `bench/native_profile.py`'s sorting of `perf` symbols into categories.
"""

import os
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import algorithm_testing as at  # pylint: disable=g-bad-import-order
from tff_adaptive.execution import runtime
from tff_adaptive.execution import tff_patches
from tff_adaptive.optimizers import biased as biased_optimizers
from tff_adaptive.rounds import model_info

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'bench'))

import native_profile  # pylint: disable=g-import-not-at-top,wrong-import-position


# TFF's local C++ context for the module, its worker stopped after (conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('local_cpp_context')]


def _keras_model():
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(3,)),
      tf.keras.layers.Dense(4, kernel_initializer='glorot_uniform',
                            bias_initializer=tf.keras.initializers.Constant(0.5)),
      tf.keras.layers.BatchNormalization(moving_variance_initializer='ones'),
      tf.keras.layers.Dense(2)])


def _model_fn():
  return tff.learning.models.from_keras_model(
      _keras_model(), input_spec=(tf.TensorSpec((None, 3)), tf.TensorSpec((None,), tf.int32)),
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])


def test_client_model_zeroes_trainables_and_keeps_other_initialisers():
  with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
    model = model_info.client_model(_model_fn)
    plain = _model_fn()
    sess.run(tf.compat.v1.global_variables_initializer())
    weights = sess.run(tff.learning.models.ModelWeights.from_model(model))
    plain_weights = sess.run(tff.learning.models.ModelWeights.from_model(plain))
  assert len(weights.trainable) == 6
  for w in weights.trainable:
    np.testing.assert_array_equal(w, np.zeros_like(w))
  # The same model built plainly has non-zero random kernels and the 0.5 bias.
  assert np.abs(plain_weights.trainable[0]).sum() > 0
  np.testing.assert_array_equal(plain_weights.trainable[1], np.full(4, 0.5, np.float32))
  # Non-trainable: BatchNorm moving mean 0 and moving variance 1, as declared.
  moving_mean, moving_variance = weights.non_trainable
  np.testing.assert_array_equal(moving_mean, np.zeros(4, np.float32))
  np.testing.assert_array_equal(moving_variance, np.ones(4, np.float32))


def test_client_model_trains_like_the_plain_model_in_a_process():
  """Weights assigned from the broadcast: FedAvg rounds are identical."""
  from workflow.training import algorithm_builders as registry  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top
  task = types.SimpleNamespace(name='t', model_fn=_model_fn, keras_model_fn=_keras_model)
  from workflow.flags import config  # pylint: disable=g-import-not-at-top
  process = registry.build(task, config.from_flags({
      'algorithm': 'fedavg', 'client_learning_rate': 0.1, 'local_steps': 2,
      'execution': 'per_client'}))
  rng = np.random.default_rng(0)
  data = [tf.data.Dataset.from_tensor_slices(
      (rng.normal(size=(8, 3)).astype(np.float32), rng.integers(0, 2, 8).astype(np.int32))
  ).batch(4) for _ in range(2)]
  state = process.initialize()
  x0 = process.get_model_weights(state)
  state = process.next(state, data).state
  x1 = process.get_model_weights(state)

  # Reference: the same two clients in plain TF from x0 (plain Keras model).
  model = _model_fn()
  deltas, weights = [], []
  for ds in data:
    for v, w in zip(model.trainable_variables, x0.trainable):
      v.assign(w)
    for v, w in zip(model.non_trainable_variables, x0.non_trainable):
      v.assign(w)
    n = 0
    for batch in ds:
      with tf.GradientTape() as tape:
        out = model.forward_pass(batch, training=True)
      grads = tape.gradient(out.loss, model.trainable_variables)
      for v, g in zip(model.trainable_variables, grads):
        v.assign_sub(0.1 * g)
      n += int(out.num_examples)
    deltas.append([a - v.numpy() for a, v in zip(x0.trainable, model.trainable_variables)])
    weights.append(n)
  mean = at.weighted_mean(deltas, weights)
  at.assert_close(x1.trainable, [start - d for start, d in zip(x0.trainable, mean)],
                  rtol=1e-5, atol=1e-6, what='FedAvg round with client_model')


@pytest.mark.parametrize('name', biased_optimizers.NAMES)
def test_fedgbo_fixed_factors_give_the_direction_bit_for_bit(name):
  opt = biased_optimizers.BiasedOptimizer(name)
  rng = np.random.default_rng(1)
  shapes = [(5, 3), (3,)]
  state = opt.init([tf.TensorSpec(s) for s in shapes])
  state = opt.track(state, [tf.constant(rng.normal(size=s), tf.float32) for s in shapes])
  g = [tf.constant(rng.normal(size=s), tf.float32) for s in shapes]
  # U(g, s) written out in full, every term evaluated per step.
  if name == 'sgdm':
    expected = [opt.beta_1 * m + (1 - opt.beta_1) * gi for m, gi in zip(state['m'], g)]
  elif name in ('rmsprop', 'adagrad'):
    expected = [gi / (tf.sqrt(v) + opt.epsilon) for gi, v in zip(g, state['v'])]
  else:
    expected = [(opt.beta_1 * m + (1 - opt.beta_1) * gi) / (tf.sqrt(v) + opt.epsilon)
                for m, gi, v in zip(state['m'], g, state['v'])]
  got = opt.fixed_direction_from(opt.fixed_factors(state), g)
  for a, b in zip(got, expected):
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_default_concurrency_is_two_clients_per_usable_core():
  cores = len(os.sched_getaffinity(0))
  assert runtime.usable_cores() == cores
  assert runtime.resolve_concurrency(0) == 2 * cores
  assert runtime.resolve_concurrency(None) == 2 * cores
  assert runtime.resolve_concurrency(-1) == -1  # unlimited, TFF's default
  assert runtime.resolve_concurrency(-7) == -1
  assert runtime.resolve_concurrency(3) == 3


def test_native_profile_sorts_perf_symbols_into_categories():
  report = '\n'.join([
      '# comment',
      '    40.00%  [JIT] tid 123          [.] 0x00007f',
      '    10.00%  worker_binary          [.] Eigen::internal::scalar_sqrt_op<float>',
      '     5.00%  worker_binary          [.] tsl::random::PhiloxRandom::operator()',
      '     5.00%  libc.so.6              [.] __memmove_avx512_unaligned_erms',
      '     4.00%  [kernel.kallsyms]      [k] exc_page_fault',
      '     1.00%  mystery.so             [.] frobnicate',
  ])
  shares = native_profile.categorize(report)
  assert shares['convolution (oneDNN JIT code)'] == 40.0
  assert shares['element-wise: sqrt'] == 10.0
  assert shares['random numbers (Philox)'] == 5.0
  assert shares['memcpy / memmove / memset'] == 5.0
  assert shares['operating system kernel (page faults, scheduling)'] == 4.0
  assert shares['other (mystery.so)'] == 1.0
  assert list(shares)[0] == 'convolution (oneDNN JIT code)'  # largest first


@pytest.mark.skipif(bool(native_profile.perf_usable()), reason=native_profile.perf_usable() or '')
def test_native_profile_smoke(tmp_path):
  """Runs and writes its file (tiny sizes; no timing assertion)."""
  import json  # pylint: disable=g-import-not-at-top
  try:
    assert native_profile.main([
        f'--out_dir={tmp_path}', '--algorithms=fedavg', '--model=linear', '--clients=2',
        '--local_steps=2', '--batch=4', '--rounds=1', '--frequency=99']) == 0
  finally:
    # main() stops its workers, the current context's included: later tests
    # in this module need a live one.
    runtime.use_local_cpp_context()
  with open(tmp_path / 'native_profile.json') as f:
    data = json.load(f)
  assert set(data['profiles']) == {'raw', 'fedavg'}
  for row in data['profiles'].values():
    assert row['cpu_s_per_round'] >= 0 and row['wall_s_per_round'] > 0
    assert isinstance(row['categories_percent'], dict)
  assert 'native_profile' in (tmp_path / 'README.md').read_text()


def test_in_place_serialization_gives_tffs_protos():
  from tensorflow_federated.python.core.impl.executors import value_serialization as vs  # pylint: disable=g-import-not-at-top
  import collections  # pylint: disable=g-import-not-at-top
  from workflow.training import algorithm_builders as registry  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top
  task = types.SimpleNamespace(name='t', model_fn=_model_fn, keras_model_fn=_keras_model)
  from workflow.flags import config  # pylint: disable=g-import-not-at-top
  process = registry.build(task, config.from_flags({
      'algorithm': 'fedgbo', 'client_learning_rate': 0.1, 'local_steps': 2,
      'client_optimizer': 'adam', 'execution': 'per_client'}))
  state = process.initialize()
  f32 = np.float32
  clients_type = tff.FederatedType(
      tff.StructType([('a', tff.TensorType(f32, [2])), ('b', tff.StructType([])),
                      (None, tff.TensorType(np.int32))]), tff.CLIENTS)
  clients_value = [collections.OrderedDict(a=np.array([1, 2], f32), b=(), c=np.int32(3)),
                   collections.OrderedDict(a=np.array([4, 5], f32), b=(), c=np.int32(6))]
  dataset = tf.data.Dataset.range(3)
  cases = [
      (state, process.next.type_signature.parameter[0]),  # server state, 3 levels deep
      (clients_value, clients_type),
      ((dataset, np.float32(1.5)), tff.StructType([tff.SequenceType(np.int64),
                                                   tff.TensorType(np.float32)])),
      ((), tff.StructType([])),
  ]
  for value, type_spec in cases:
    fast, fast_type = vs.serialize_value(value, type_spec)
    with tff_patches.shipped_value_serialization():
      shipped, shipped_type = vs.serialize_value(value, type_spec)
    assert fast_type == shipped_type
    if isinstance(value, tuple) and value and isinstance(value[0], tf.data.Dataset):
      # A dataset's graph serialises differently on every call: compare what it holds.
      datasets = [vs.deserialize_value(p)[0][0] for p in (fast, shipped)]
      assert [list(d.as_numpy_iterator()) for d in datasets] == [[0, 1, 2]] * 2
      for p in (fast, shipped):
        p.struct.element[0].value.sequence.ClearField('serialized_graph_def')
    assert fast == shipped, type_spec
  # A malformed struct still gets TFF's error.
  with pytest.raises(TypeError, match='requiring 2 elements'):
    vs.serialize_value((np.float32(1.0),), tff.StructType([np.float32, np.float32]))
