"""Per-round costs measured by the learning processes themselves (issue 3: FLOPs, bits).

The processes are built the way bin/train builds them (the algorithm registry,
on the digits task with its MLP), run for one round, and their `cost/...`
measurements are checked against numbers derived independently: bits from the
parameter count |x| of the Keras model, FLOPs from `flops.client_flops`
(SPEC §8, eq. 22 of seed 000).

What the download counts (the composer's processes): the model weights, the
broadcast optimiser state, and the round's hyperparameters η (float32) and K
(int32), i.e. 64 bits on top of the floats. TFF's Mimelite broadcasts its
whole base-optimiser state, hyperparameter scalars included.
"""

import numpy as np
import pytest

from tasks import digits
from workflow import program
from tff_adaptive.execution import runtime
from tff_adaptive.accounting import flops
from workflow import algorithms as registry

K, B = 3, 10
NUM_CLIENTS = 2
HPARAM_BITS = 32 + 32  # η (float32) and K (int32), broadcast every round


@pytest.fixture(scope='module', autouse=True)
def _tff_context():
  runtime.use_local_cpp_context()
  yield
  runtime.shutdown_workers()


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
}


@pytest.fixture(scope='module')
def round_costs(task):
  """One round of each algorithm on the same two clients → its `cost` metrics."""
  ids = list(task.train_data.client_ids)[:NUM_CLIENTS]
  costs = {}
  for key, cfg in CONFIGS.items():
    cfg = dict(cfg, client_learning_rate=0.05, local_steps=K)
    process = registry.build(cfg['algorithm'], task, cfg)
    state = process.initialize()
    # Composer processes run K steps themselves; TFF's Mimelite gets the K
    # batches as its data (what program.run does).
    steps = None if isinstance(state, dict) and 'hparams' in state else K
    output = process.next(state, program.client_datasets(task, ids, steps))
    costs[key] = output.metrics['cost']
    assert output.metrics['client_work']['train']['num_examples'] == NUM_CLIENTS * K * B
  return costs


@pytest.mark.parametrize('key, algorithm, optimizer', [
    ('fedavg', 'fedavg', None), ('fedgbo_adam', 'fedgbo', 'adam'), ('mfl_adam', 'mfl', 'adam'),
    ('mimelite_sgdm', 'mimelite', 'sgdm')])
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
  assert cost['upload_bits_per_client'] == 32 * 2 * num_params
  # Down: x and TFF's SGDm state as TFF broadcasts it: the momentum buffer
  # (|x|) and its learning_rate and momentum scalars (float32).
  assert cost['download_bits_per_client'] == 32 * (2 * num_params + 2)
  assert cost['client_optimizer_state_floats'] == num_params


def test_download_counts_non_trainable_weights():
  """The whole ModelWeights is broadcast: BatchNorm's moving statistics are downloaded too."""
  task = digits.create_task(partition='iid', num_clients=6, model='cnn_bn', batch_size=B)
  model = task.keras_model_fn()
  trainable = int(sum(np.prod(w.shape) for w in model.trainable_weights))
  non_trainable = int(sum(np.prod(w.shape) for w in model.non_trainable_weights))
  assert non_trainable == 2 * (16 + 64)  # moving mean and variance of two BatchNorms
  cfg = dict(algorithm='fedavg', client_optimizer='sgd', client_learning_rate=0.05, local_steps=1)
  process = registry.build('fedavg', task, cfg)
  ids = list(task.train_data.client_ids)[:1]
  cost = process.next(process.initialize(), program.client_datasets(task, ids, None)).metrics['cost']
  assert cost['download_bits_per_client'] == 32 * (trainable + non_trainable) + HPARAM_BITS
  assert cost['upload_bits_per_client'] == 32 * trainable
