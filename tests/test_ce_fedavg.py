"""CE-FedAvg and compressed uploads at the TFF level (thesis ch. 3, docs/algorithms.md#ce-fedavg).

The NumPy codec (Golomb, UniQ, ExpQ, top-k, bit counts, corrupted or
truncated bitstrings) is unit-tested in test_compression.py; here the codec
runs inside `SharedIndexCompressionFactory` (a `tff.aggregators` factory) and
inside learning processes:
  * Δm and Δv are zero exactly where Δω was dropped, on what the server
    decodes;
  * compressed FedAvg with s = 0 and no quantisation is FedAvg (and CE-FedAvg
    is MFL-Adam);
  * the bits the aggregator measures on the FedGBO paper's CIFAR100 CNN (1.25M
    parameters) are within a few percent of eqs. 3.1/3.2 and of the nominal
    ratios 7.62/9.06 (s = 0.6) and 25.09/33.38 (s = 0.9);
  * bad flags exit 2 naming the flag.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import algorithm_testing as at
import train_config  # pylint: disable=g-bad-import-order
from tasks.models import paper_cnns
from workflow import errors
from workflow.flags import config
from workflow.flags import validation
from tff_adaptive.aggregators import compression
from tff_adaptive.algorithms import ce_fedavg
from tff_adaptive.algorithms import fedopt
from tff_adaptive.algorithms import mfl
from workflow.flags import algorithms
from workflow.flags import config
from workflow.training import algorithm_builders as registry
from tff_adaptive.compression import codec
from tff_adaptive.compression import sparsify

K = 3
SIZES = (7, 12, 5)
LR = 0.05
# conv 3×3×1×8, its bias, dense 72×20, its bias, dense 20×10: rank-1 tensors are sent dense.
SHAPES = [(3, 3, 1, 8), (8,), (72, 20), (20,), (20, 10)]


# TFF's local C++ context for the module, its worker stopped after (conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('local_cpp_context')]


def _list_type(shapes):
  return tff.StructWithPythonType([tff.TensorType(np.float32, s) for s in shapes], list)


def _joint_type(shapes):
  """The composer's upload: OrderedDict(delta=Δω, extra=MFL-Adam's state deltas)."""
  state = tff.StructWithPythonType(
      [('m', _list_type(shapes)), ('v', _list_type(shapes)), ('step', tff.TensorType(np.float32))],
      collections.OrderedDict)
  return tff.StructWithPythonType([('delta', _list_type(shapes)), ('extra', state)],
                                  collections.OrderedDict)


def _aggregate(factory, value_type, client_values, weights=None):
  process = factory.create(value_type, tff.TensorType(np.float32))
  weights = weights or [1.0] * len(client_values)
  return process.next(process.initialize(), client_values, weights)


def _random_upload(shapes, seed):
  rng = np.random.default_rng(seed)
  delta = [(rng.normal(size=s) * 1e-2).astype(np.float32) for s in shapes]
  # Independent of Δω, so that their own top-k would pick other positions.
  m = [(rng.normal(size=s) * 1e-3).astype(np.float32) for s in shapes]
  v = [(rng.choice([-1.0, 1.0], size=s) * 10.0**rng.uniform(-10, -4, size=s)).astype(np.float32)
       for s in shapes]
  return collections.OrderedDict(
      delta=delta, extra=collections.OrderedDict(m=m, v=v, step=np.float32(3.0)))


@pytest.mark.parametrize('quantize', [False, True])
def test_decoded_state_deltas_are_zero_exactly_where_weights_were_dropped(quantize):
  s = 0.9
  upload = _random_upload(SHAPES, seed=0)
  out = _aggregate(compression.SharedIndexCompressionFactory(s, quantize), _joint_type(SHAPES),
                   [upload])
  decoded = out.result
  for i, shape in enumerate(SHAPES):
    w = upload['delta'][i]
    w_hat = np.asarray(decoded['delta'][i])
    m_hat = np.asarray(decoded['extra']['m'][i])
    v_hat = np.asarray(decoded['extra']['v'][i])
    kept = w_hat != 0
    if len(shape) >= 2:
      assert kept.sum() == sparsify.num_kept(w.size, s)
      # The kept positions are Δω's top-(1 − s) by magnitude …
      assert np.abs(w[kept]).min() >= np.abs(w[~kept]).max()
      # … and not Δm's own (which an independent top-k would have kept).
      m = upload['extra']['m'][i]
      assert np.abs(m[~kept]).max() > np.abs(m[kept]).min()
    else:
      assert kept.all()  # rank 1: dense
    np.testing.assert_array_equal(m_hat[~kept], 0.0)
    np.testing.assert_array_equal(v_hat[~kept], 0.0)
    assert np.all(m_hat[kept] != 0) and np.all(v_hat[kept] != 0)
    if not quantize:
      np.testing.assert_array_equal(w_hat[kept], w[kept])
      np.testing.assert_array_equal(m_hat[kept], upload['extra']['m'][i][kept])
  assert float(decoded['extra']['step']) == 3.0  # sent dense
  # The measured bits are the NumPy codec's message plus the 32-bit step counter.
  msg = codec.encode_upload(upload['delta'], s, quantize,
                            [upload['extra']['m'], upload['extra']['v']])
  assert out.measurements['upload_bits_per_client'] == msg.num_bits + 32
  for got, want in zip(decoded['delta'], codec.decode_upload(msg)):
    np.testing.assert_array_equal(np.asarray(got), want)


def test_server_mean_of_two_clients_keeps_state_on_the_union_of_their_indices():
  s = 0.8
  uploads = [_random_upload(SHAPES, seed=1), _random_upload(SHAPES, seed=2)]
  factory = compression.SharedIndexCompressionFactory(s, quantize=False)
  out = _aggregate(factory, _joint_type(SHAPES), uploads, weights=[1.0, 3.0])
  for i, shape in enumerate(SHAPES):
    if len(shape) < 2:
      continue
    masks = []
    for u in uploads:
      idx = sparsify.top_k_indices(u['delta'][i], sparsify.num_kept(u['delta'][i].size, s))
      mask = np.zeros(u['delta'][i].size, bool)
      mask[idx] = True
      masks.append(mask.reshape(shape))
    want_m = sum(w * np.where(mk, u['extra']['m'][i], 0.0)
                 for w, mk, u in zip((0.25, 0.75), masks, uploads))
    np.testing.assert_allclose(np.asarray(out.result['extra']['m'][i]), want_m, rtol=1e-6,
                               atol=1e-12)
    outside = ~(masks[0] | masks[1])
    assert outside.any()
    np.testing.assert_array_equal(np.asarray(out.result['extra']['v'][i])[outside], 0.0)


# ---- s → 0, no quantisation: compression is the identity ----


def _adam():
  return tff.learning.optimizers.build_adam(LR, beta_1=0.9, beta_2=0.999, epsilon=1e-8)


def _run(process, data, rounds=2):
  state = process.initialize()
  trajectory, costs = [], []
  for _ in range(rounds):
    output = process.next(state, data)
    state = output.state
    trajectory.append(at.trainable(process, state))
    costs.append(output.metrics['cost'])
  return trajectory, costs


def test_compressed_fedavg_with_zero_sparsity_and_no_quantisation_is_fedavg():
  # s = 0 keeps every entry (k = n); test_compression checks a tiny s > 0 is sent dense too.
  sparsity = 0.0
  data = at.datasets(at.make_clients(SIZES, seed=3))
  build = lambda upload_compression: fedopt.build_fedopt(
      at.model_fn, tff.learning.optimizers.build_sgdm(LR), tff.learning.optimizers.build_sgdm(1.0),
      local_steps=K, upload_compression=upload_compression)
  plain, plain_costs = _run(build(None), data)
  compressed, costs = _run(build(compression.SharedIndexCompressionFactory(sparsity, False)),
                           data)
  for a, b in zip(plain, compressed):
    at.assert_close(b, a, rtol=1e-6, atol=1e-8)
  assert at.max_abs_diff(plain[0], plain[1]) > 1e-3  # the model did move
  num_params = at.D * at.C + at.C
  for c, p in zip(costs, plain_costs):
    assert c['upload_bits_per_client'] == p['upload_bits_per_client'] == 32 * num_params


def test_ce_fedavg_with_zero_sparsity_and_no_quantisation_is_mfl_adam():
  data = at.datasets(at.make_clients(SIZES, seed=4))
  ce = ce_fedavg.build_ce_fedavg(at.model_fn, _adam(), sparsity=0.0, quantize=False,
                                 local_steps=K)
  plain = mfl.build_mfl(at.model_fn, _adam(), bias_correction=True, local_steps=K)
  got, costs = _run(ce, data)
  want, plain_costs = _run(plain, data)
  for a, b in zip(got, want):
    at.assert_close(a, b, rtol=1e-5, atol=1e-7)
  num_params = at.D * at.C + at.C
  # Δω, Δm, Δv at 32 bits each plus Adam's step counter: what MFL-Adam sends uncompressed.
  assert costs[0]['upload_bits_per_client'] == 96 * num_params + 32
  assert plain_costs[0]['upload_bits_per_client'] == 96 * num_params + 32


def test_ce_fedavg_process_measures_compressed_uploads():
  data = at.datasets(at.make_clients(SIZES, seed=5))
  ce = ce_fedavg.build_ce_fedavg(at.model_fn, _adam(), sparsity=0.6, local_steps=K)
  _, costs = _run(ce, data, rounds=1)
  # Kernel 5×3: k = 6 of 15 kept (Golomb gaps with b* = 0: 1 to 15 bits in all, plus 32 for b*),
  # 8-bit values for Δω, Δm, Δv + UniQ's 4 floats + 2 ExpQ bases; bias 3 values dense, the
  # same side information; the step counter 32 bits.
  side = 32 * (4 + 1 + 1)
  low = 32 + 6 + 6 * 24 + side + 3 * 24 + side + 32
  assert low <= costs[0]['upload_bits_per_client'] <= low + 15 - 6
  assert costs[0]['upload_bits_per_client'] < 96 * 18 / 2


# ---- measured vs analytic and nominal ratios on a real model ----


@pytest.fixture(scope='module')
def cifar_cnn_shapes():
  model = paper_cnns.create_cifar100_cnn()
  shapes = [tuple(w.shape) for w in model.trainable_weights]
  assert sum(int(np.prod(s)) for s in shapes) == 1_250_852
  return shapes


@pytest.mark.parametrize('s', [0.6, 0.9])
def test_measured_ratios_on_cifar100_cnn_match_eq_3_1_3_2_and_nominal(cifar_cnn_shapes, s):
  shapes = cifar_cnn_shapes
  num_params = sum(int(np.prod(x)) for x in shapes)
  upload = _random_upload(shapes, seed=7)
  factory = compression.SharedIndexCompressionFactory(s, quantize=True)
  fedavg_bits = float(_aggregate(factory, _list_type(shapes), [upload['delta']])
                      .measurements['upload_bits_per_client'])
  ce_bits = float(_aggregate(factory, _joint_type(shapes), [upload])
                  .measurements['upload_bits_per_client'])
  # Eqs. 3.1/3.2 count every tensor as sparsified; the codec sends the 4 biases dense.
  assert fedavg_bits == pytest.approx(
      codec.analytic_bits_fedavg(num_params, len(shapes), s), rel=0.02)
  assert ce_bits == pytest.approx(codec.analytic_bits_ce_fedavg(num_params, len(shapes), s),
                                  rel=0.02)
  nominal = {0.6: (7.62, 9.06), 0.9: (25.09, 33.38)}[s]
  assert 32 * num_params / fedavg_bits == pytest.approx(nominal[0], rel=0.03)
  assert (96 * num_params + 32) / ce_bits == pytest.approx(nominal[1], rel=0.03)


# ---- bad input ----


@pytest.mark.parametrize('args, flag', [
    (['--algorithm=fedavg', '--upload_compression=topk', '--sparsity=1.0'], '--sparsity'),
    (['--algorithm=ce_fedavg', '--client_optimizer=adam', '--upload_compression=topk_uniq',
      '--sparsity=-0.1'], '--sparsity'),
    (['--algorithm=mimelite', '--upload_compression=topk'], '--upload_compression'),
    (['--algorithm=scaffold', '--upload_compression=topk_uniq'], '--upload_compression'),
])
def test_validate_names_the_flag(args, flag):
  cfg = dict(task='digits', algorithm='fedavg', client_optimizer='sgd', clients_per_round=10,
             client_learning_rate=0.1, server_learning_rate=1.0, local_steps=0, sparsity=0.9)
  for arg in args:
    name, value = arg[2:].split('=')
    cfg[name] = float(value) if name == 'sparsity' else value
  with pytest.raises(errors.UsageError, match=flag):
    validation.validate(config.from_flags(cfg))


def test_builders_name_the_argument_and_the_registry_the_flag():
  for s in (1.0, -0.1, 1.5):
    with pytest.raises(ValueError, match=r'SharedIndexCompressionFactory: sparsity must be in'):
      compression.SharedIndexCompressionFactory(s)
  with pytest.raises(algorithms.ConfigError, match='--upload_compression'):
    registry.build(None, config.from_flags(dict(algorithm='ce_fedavg', client_optimizer='adam',
                                                upload_compression='none')))
  with pytest.raises(algorithms.ConfigError, match='--upload_compression'):
    registry.build(None, config.from_flags(dict(algorithm='mimelite', upload_compression='topk')))


def test_bin_train_bad_input_exits_2_with_one_line(tmp_path):
  cases = [(['--algorithm=ce_fedavg', '--client_optimizer=adam', '--upload_compression=topk',
             '--sparsity=1.0'], '--sparsity'),
           (['--algorithm=mimelite', '--upload_compression=topk_uniq'], '--upload_compression')]

  for (args, flag), (result, out) in zip(
      cases, train_config.refused_runs(tmp_path, [args for args, _ in cases])):
    train_config.assert_refused(result, out, flag, args)
