"""Per-round costs measured by the learning processes themselves (FLOPs, bits).

The processes are built the way bin/train builds them (the algorithm registry,
on the digits task with its MLP), run for one round, and their `cost/...`
measurements are checked against numbers derived independently: bits from the
parameter count |x| of the Keras model, FLOPs from `flops.client_flops`
(docs/algorithms.md#costs, eq. 22 of the FedGBO paper).

What the download counts (the composer's processes): the model weights, the
broadcast optimiser state, and the round's hyperparameters η (float32) and K
(int32), i.e. 64 bits on top of the floats, and a recipe's client hyperparameters
(FedProx's μ, float32). Mimelite broadcasts its whole
base-optimiser state, hyperparameter scalars included.

`costs.measure_upload` measures the upload of a process built by TFF's own
builders from the TFF types of the client values its `next` computation
aggregates; checked here on TFF's Mime Lite and FedProx: 32·|x|·multiplier
with |x| counted on the Keras model and the multiplier the number of
model-sized values the algorithm's definition sends (Mimelite: Δ and ∇f;
FedProx: Δ).
"""

import numpy as np
import pytest
import tensorflow_federated as tff

from tasks import digits
from workflow.training import program
from tff_adaptive.accounting import costs
from tff_adaptive.accounting import flops
from tff_adaptive.rounds import layout
from workflow.flags import config
from workflow.training import algorithm_builders as registry

K, B = 3, 10
NUM_CLIENTS = 2
HPARAM_BITS = 32 + 32  # η (float32) and K (int32), broadcast every round


# TFF's local C++ context for the module, its worker stopped after (conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('local_cpp_context')]


@pytest.fixture(scope='module')
def task():
  # IID: every client has ~240 examples ≥ K·B, so all K batches are full (the
  # eq. 22 formula assumes K batches of B).
  return digits.create_task(partition='iid', num_clients=6, model='mlp', batch_size=B)


@pytest.fixture(scope='module')
def num_params(task):
  model = task.keras_model_fn()
  assert not model.non_trainable_weights
  return int(sum(np.prod(w.shape) for w in model.trainable_weights))  # 64·64+64 + 64·10+10


CONFIGS = {
    'fedavg': dict(algorithm='fedavg', client_optimizer='sgd'),
    'fedgbo_adam': dict(algorithm='fedgbo', client_optimizer='adam'),
    'mfl_adam': dict(algorithm='mfl', client_optimizer='adam'),
    'mimelite_sgdm': dict(algorithm='mimelite', client_optimizer='sgdm'),
    'fedprox': dict(algorithm='fedprox', client_optimizer='sgd'),
}


@pytest.fixture(scope='module')
def round_costs(task):
  """One round of each algorithm on the same two clients → its `cost` metrics."""
  ids = list(task.train_data.client_ids)[:NUM_CLIENTS]
  round_costs = {}
  for key, cfg in CONFIGS.items():
    cfg = dict(cfg, client_learning_rate=0.05, local_steps=K, execution='per_client')
    process = registry.build(task, config.from_flags(cfg))
    state = process.initialize()
    assert layout.runs_local_steps(state)  # K steps, not K batches as the data
    output = process.next(state, program.client_datasets(task, ids, None))
    round_costs[key] = output.metrics['cost']
    assert output.metrics['client_work']['train']['num_examples'] == NUM_CLIENTS * K * B
  return round_costs


@pytest.mark.parametrize('key, algorithm, optimizer', [
    ('fedavg', 'fedavg', None), ('fedgbo_adam', 'fedgbo', 'adam'), ('mfl_adam', 'mfl', 'adam'),
    ('mimelite_sgdm', 'mimelite', 'sgdm'), ('fedprox', 'fedprox', None)])
def test_measured_client_flops_match_eq22(task, round_costs, key, algorithm, optimizer):
  # Mimelite's full-gradient pass runs over the client's data as given: with
  # K steps, the round's K batches (n_i = K·B).
  n_i = K * B if algorithm == 'mimelite' else None
  expected = flops.client_flops(algorithm, optimizer, task.keras_model_fn(), K=K, B=B, n_i=n_i)
  cost = round_costs[key]
  assert cost['client_flops_per_client'] == pytest.approx(expected, rel=1e-12)
  assert cost['client_flops'] == pytest.approx(NUM_CLIENTS * expected, rel=1e-12)
  assert cost['client_steps'] == NUM_CLIENTS * K


def test_flops_differ_by_optimizer_ops(round_costs, num_params):
  # Same data, same K·B examples: the difference is C·|x| per step (SGD 2,
  # FedGBO-Adam C_fixed = 8, MFL-Adam C_moving = 11).
  per = {k: round_costs[k]['client_flops_per_client'] for k in round_costs}
  assert per['fedprox'] - per['fedavg'] == pytest.approx(K * (5 - 2) * num_params)
  assert per['fedgbo_adam'] - per['fedavg'] == pytest.approx(K * (8 - 2) * num_params)
  assert per['mfl_adam'] - per['fedavg'] == pytest.approx(K * (11 - 2) * num_params)


def test_fedavg_bits(round_costs, num_params):
  cost = round_costs['fedavg']
  assert cost['upload_bits_per_client'] == 32 * num_params  # Δ
  assert cost['download_bits_per_client'] == 32 * num_params + HPARAM_BITS  # x, (η, K)
  assert cost['upload_bits'] == NUM_CLIENTS * 32 * num_params
  assert cost['client_optimizer_state_floats'] == 0


def test_fedgbo_adam_bits(round_costs, num_params):
  cost = round_costs['fedgbo_adam']
  # Down: x, the global m and v (3|x| floats), Adam's float32 step counter, (η, K).
  assert cost['download_bits_per_client'] == 32 * (3 * num_params + 1) + HPARAM_BITS
  # Up: only the model delta.
  assert cost['upload_bits_per_client'] == 32 * num_params


def test_mfl_adam_bits(round_costs, num_params):
  cost = round_costs['mfl_adam']
  # Up: Δ, the client's moved m and v (3|x|) and its step counter (one float).
  assert cost['upload_bits_per_client'] == 32 * (3 * num_params + 1)
  assert cost['download_bits_per_client'] == 32 * (3 * num_params + 1) + HPARAM_BITS


def test_mimelite_bits(round_costs, num_params):
  cost = round_costs['mimelite_sgdm']
  # Up: Δ and the full gradient at x_t.
  assert cost['upload_bits_per_client'] == 32 * num_params * 2
  # Down: x and the SGDm state as TFF's optimiser holds it: the momentum buffer
  # (|x|) and its learning_rate and momentum scalars (float32), and (η, K).
  assert cost['download_bits_per_client'] == 32 * (2 * num_params + 2) + HPARAM_BITS
  assert cost['client_optimizer_state_floats'] == num_params


def test_fedprox_bits(round_costs, num_params):
  cost = round_costs['fedprox']
  assert cost['upload_bits_per_client'] == 32 * num_params * 1  # Δ
  # x, (η, K) and μ
  assert cost['download_bits_per_client'] == 32 * num_params + HPARAM_BITS + 32
  # x_t, which the proximal term reads at every step (plain SGD keeps no state).
  assert cost['client_optimizer_state_floats'] == num_params


def _tff_process(task, algorithm):
  sgd = tff.learning.optimizers.build_sgdm
  if algorithm == 'fedprox':
    return tff.learning.algorithms.build_weighted_fed_prox(task.model_fn, 0.01, sgd(0.05), sgd(1.0))
  return tff.learning.algorithms.build_weighted_mime_lite(
      task.model_fn, sgd(0.05, momentum=0.9), sgd(1.0))


@pytest.mark.parametrize('algorithm, multiplier', [('mimelite_sgdm', 2), ('fedprox', 1)])
def test_measure_upload_reads_the_aggregated_types(task, num_params, algorithm, multiplier):
  """The measurement behind the numbers above: the model-sized client values aggregated."""
  measured = costs.measure_upload(_tff_process(task, algorithm))
  assert measured.num_params == num_params
  assert measured.multiplier == multiplier
  assert measured.bits == 32 * num_params * multiplier
  for a in measured.model_sized:
    assert a.intrinsic == 'federated_sum'  # TFF's MeanFactory: Σ w·value and Σ w
    assert a.bits == 32 * num_params
  # The rest is scalars: one float32 weight per weighted mean, the training
  # metrics' sums (accuracy and loss as (total, count), num_examples, num_batches).
  weights = [a for a in measured.others if a.bits == 32 and a.value_type.dtype == np.float32]
  assert len(weights) == multiplier
  assert measured.other_bits == 32 * multiplier + (4 * 32 + 2 * 64)


def test_measure_upload_counts_what_a_computation_aggregates():
  """On a hand-written computation: three model-sized values, one weighted mean, one metric."""
  model_type = tff.StructType([tff.TensorType(np.float32, [3, 2]), tff.TensorType(np.float32, [2])])

  @tff.federated_computation(tff.FederatedType(model_type, tff.CLIENTS),
                             tff.FederatedType(np.float32, tff.CLIENTS),
                             tff.FederatedType(np.int64, tff.CLIENTS))
  def next_fn(value, weight, count):
    return (tff.federated_sum(value), tff.federated_mean(value),
            tff.federated_mean(value, weight), tff.federated_sum(count))

  class FakeProcess:
    next = next_fn
    get_model_weights = tff.tensorflow.computation(
        lambda: tff.learning.models.ModelWeights(
            trainable=[np.zeros([3, 2], np.float32), np.zeros([2], np.float32)],
            non_trainable=[]))

  measured = costs.measure_upload(FakeProcess())
  assert measured.multiplier == 3 and measured.bits == 3 * 32 * 8
  assert [a.intrinsic for a in measured.model_sized] == [
      'federated_sum', 'federated_mean', 'federated_weighted_mean']
  assert measured.model_sized[2].weight_type == tff.TensorType(np.float32)
  assert measured.other_bits == 64  # the int64 count


def test_measure_upload_refuses_a_process_without_model_sized_uploads():
  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def next_fn(x):
    return tff.federated_sum(x)

  class FakeProcess:
    next = next_fn
    get_model_weights = tff.tensorflow.computation(
        lambda: tff.learning.models.ModelWeights(trainable=[np.zeros([4], np.float32)],
                                                 non_trainable=[]))

  with pytest.raises(ValueError, match='trainable weights'):
    costs.measure_upload(FakeProcess())


def test_download_counts_non_trainable_weights():
  """The whole ModelWeights is broadcast: BatchNorm's moving statistics are downloaded too."""
  task = digits.create_task(partition='iid', num_clients=6, model='cnn_bn', batch_size=B)
  model = task.keras_model_fn()
  trainable = int(sum(np.prod(w.shape) for w in model.trainable_weights))
  non_trainable = int(sum(np.prod(w.shape) for w in model.non_trainable_weights))
  assert non_trainable == 2 * (16 + 64)  # moving mean and variance of two BatchNorms
  process = registry.build(task, config.from_flags(dict(
      algorithm='fedavg', client_optimizer='sgd', client_learning_rate=0.05, local_steps=1,
      execution='per_client')))
  ids = list(task.train_data.client_ids)[:1]
  cost = process.next(process.initialize(), program.client_datasets(task, ids, None)).metrics['cost']
  assert cost['download_bits_per_client'] == 32 * (trainable + non_trainable) + HPARAM_BITS
  assert cost['upload_bits_per_client'] == 32 * trainable
