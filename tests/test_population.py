"""A population of runs (rounds/population.py) equals its members run alone.

Each population is a 2 × 2 × 2 grid (client η × server η × seed; FedGBO, which
has no server rate: client η × β-free × seed, i.e. 2 × 2 seeds), on the
linear-softmax model of `algorithm_testing`; a seed decides a member's initial
weights and the clients it samples each round. After 3 rounds every member's
weights and train metrics equal the same member's own cohort process run
(within 1e-5 relative), and, for FedAdam, its per-client process run. MFL,
Mime Lite, MimeXlite and FedAdA² run as 2 members (client η × seed).
"""

import itertools

import numpy as np
import pytest
import tensorflow_federated as tff

import algorithm_testing as at
from tff_adaptive.aggregators import dp
from tff_adaptive.algorithms import fedada2
from tff_adaptive.algorithms import fedgbo
from tff_adaptive.algorithms import fedopt
from tff_adaptive.algorithms import fedprox
from tff_adaptive.algorithms import mfl
from tff_adaptive.algorithms import mimelite
from tff_adaptive.algorithms import mimexlite
from tff_adaptive.rounds import cohort
from tff_adaptive.rounds import population

SIZES = (7, 12, 5, 9, 4, 6)
CLIENTS_PER_ROUND = 3
ROUNDS = 3
SEEDS = (0, 1)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('local_cpp_context')]


@pytest.fixture(scope='module')
def datasets():
  return at.datasets(at.make_clients(SIZES, seed=5))


def _sgd():
  return tff.learning.optimizers.build_sgdm(0.1)


BUILDERS = {
    'fedavg': lambda execution: fedopt.build_fedavg(
        at.model_fn, _sgd(), local_steps=3, execution=execution),
    'fedadam': lambda execution: fedopt.build_fedadam(
        at.model_fn, _sgd(), 0.01, local_steps=3, execution=execution),
    'fedadam_paper': lambda execution: fedopt.build_fedadam(
        at.model_fn, _sgd(), 0.01, semantics='paper', local_steps=0, execution=execution),
    'fedprox': lambda execution: fedprox.build_fedprox(
        at.model_fn, _sgd(), tff.learning.optimizers.build_sgdm(1.0), proximal_strength=0.1,
        local_steps=3, execution=execution),
    'fedgbo': lambda execution: fedgbo.build_fedgbo(
        at.model_fn, tff.learning.optimizers.build_sgdm(0.1, momentum=0.9), local_steps=3,
        execution=execution),
}
# Two members each (client η × seed): the other algorithms of the registry whose
# state differs from the above (MFL's and Mime Lite's server statistics from
# full-batch gradients, MimeXlite, FedAdA²'s client preconditioners).
PAIRS = {
    'mfl': lambda execution: mfl.build_mfl(
        at.model_fn, tff.learning.optimizers.build_adam(0.01), local_steps=3,
        execution=execution),
    'mimelite': lambda execution: mimelite.build_mimelite(
        at.model_fn, tff.learning.optimizers.build_sgdm(0.1, momentum=0.9), local_steps=3,
        execution=execution),
    'mimexlite': lambda execution: mimexlite.build_mimexlite(
        at.model_fn, _sgd(), tff.learning.optimizers.build_sgdm(1.0, momentum=0.9),
        local_steps=3, execution=execution),
    'fedada2': lambda execution: fedada2.build_fedada2(
        at.model_fn, fedada2.build_client_optimizer('adam', 0.05),
        fedada2.build_server_optimizer('adam', 0.05), local_steps=3, execution=execution),
}
CLIENT_RATES = (0.05, 0.2)
SERVER_RATES = {'fedavg': (1.0, 0.5), 'fedadam': (0.01, 0.03), 'fedadam_paper': (0.01, 0.03),
                'fedprox': (1.0, 0.7), 'fedgbo': (None,)}


# FedProx's members differ in μ too (a client hyperparameter of its state); 0: no term.
MUS = (0.1, 0.0, 1.0)


def _member_state(process, client_lr, server_lr, seed, index=0):
  """The process's initial state with this member's rates and seed's weights."""
  state = process.initialize()
  hparams = process.get_hparams(state)
  hparams['client_work']['learning_rate'] = np.float32(client_lr)
  if 'proximal_strength' in hparams['client_work']:
    hparams['client_work']['proximal_strength'] = np.float32(MUS[index % len(MUS)])
  if server_lr is not None:
    hparams['finalizer']['learning_rate'] = np.float32(server_lr)
  state = process.set_hparams(state, hparams)
  weights = process.get_model_weights(state)
  rng = np.random.default_rng(seed)
  trainable = [w + rng.normal(scale=0.3, size=np.shape(w)).astype(np.float32) * (seed > 0)
               for w in weights.trainable]
  return process.set_model_weights(
      state, tff.learning.models.ModelWeights(trainable, weights.non_trainable))


def _sampled(seed, round_num):
  rng = np.random.default_rng([seed, round_num])
  return [int(i) for i in rng.choice(len(SIZES), CLIENTS_PER_ROUND, replace=False)]


def _assert_member_equal(expected_state, expected_metrics, pop_state, pop_metrics, m, what):
  at.assert_close(at.flat(population.member(pop_state, m).global_model_weights.trainable),
                  at.flat(expected_state.global_model_weights.trainable), rtol=1e-5, atol=1e-7,
                  what=f'{what} weights')
  at.assert_close(at.flat(population.member(pop_state, m).finalizer),
                  at.flat(expected_state.finalizer), rtol=1e-5, atol=1e-7, what=f'{what} s_t')
  got = population.member_metrics(pop_metrics, m)['client_work']['train']
  want = expected_metrics['client_work']['train']
  for key in want:
    np.testing.assert_allclose(got[key], want[key], rtol=1e-5, err_msg=f'{what} {key}')


@pytest.mark.parametrize('name', sorted(BUILDERS) + sorted(PAIRS))
def test_every_member_equals_its_run_alone(name, datasets):
  if name in PAIRS:
    process = PAIRS[name](cohort.CohortExecution())
    grid = list(zip(CLIENT_RATES, (None, None), SEEDS))
  else:
    process = BUILDERS[name](cohort.CohortExecution())
    grid = list(itertools.product(CLIENT_RATES, SERVER_RATES[name], SEEDS))
  alone = [_member_state(process, *member, index=i) for i, member in enumerate(grid)]
  pop = population.build_population(process)
  state = pop.stack(alone)
  per_client = BUILDERS[name]('per_client') if name == 'fedadam' else None
  alone_per_client = list(alone) if per_client else None
  for round_num in range(ROUNDS):
    sampled = [[datasets[i] for i in _sampled(seed, round_num)] for *_, seed in grid]
    output = pop.next(state, sampled)
    state = output.state
    for m, clients in enumerate(sampled):
      own = process.next(alone[m], clients)
      alone[m] = own.state
      _assert_member_equal(own.state, own.metrics, state, output.metrics, m,
                           f'{name} member {grid[m]} round {round_num}')
      if per_client:
        own = per_client.next(alone_per_client[m], clients)
        alone_per_client[m] = own.state
        _assert_member_equal(own.state, own.metrics, state, output.metrics, m,
                             f'{name} per client member {grid[m]} round {round_num}')
  # The members differ: a grid that collapsed to one run would pass the above.
  finals = [at.flat(population.member(state, m).global_model_weights.trainable)[0]
            for m in range(len(grid))]
  assert len({f.tobytes() for f in finals}) == len(grid)


def test_a_member_is_an_ordinary_state_and_goes_back(datasets):
  process = BUILDERS['fedavg'](cohort.CohortExecution())
  pop = population.build_population(process)
  state = pop.initialize(3)
  assert population.size(state) == 3
  member = population.member(state, 1)
  moved = process.next(member, datasets[:2]).state
  state = population.with_member(state, 1, moved)
  at.assert_close(at.flat(pop.get_model_weights(state, 1).trainable),
                  at.flat(process.get_model_weights(moved).trainable), rtol=0, atol=0)
  at.assert_close(at.flat(pop.get_model_weights(state, 0).trainable),
                  at.flat(process.get_model_weights(process.initialize()).trainable),
                  rtol=0, atol=0)
  with pytest.raises(ValueError, match=r'member index must be in \[0, 3\); got 3'):
    population.member(state, 3)


def test_refusals_name_the_reason(datasets):
  with pytest.raises(TypeError, match='build_population takes a cohort process'):
    population.build_population(BUILDERS['fedavg']('per_client'))
  noisy = fedopt.build_fedavg(at.model_fn, _sgd(), local_steps=2,
                              model_aggregator=dp.dp_aggregator(0.0, 1.0, 2),
                              execution=cohort.CohortExecution())
  with pytest.raises(ValueError, match='fedavg: fixed-clip DP has no population form yet'):
    population.build_population(noisy)
  pop = population.build_population(BUILDERS['fedavg'](cohort.CohortExecution()))
  state = pop.initialize(2)
  with pytest.raises(ValueError, match=r'one list of client datasets per member \(2\)'):
    pop.next(state, [datasets[:2]])
  with pytest.raises(ValueError, match=r'same number of clients per round.*\[1, 2\]'):
    pop.next(state, [datasets[:2], datasets[:1]])
  state = pop.set_hparams(state, 1, {'client_work': {'learning_rate': np.float32(0.1),
                                                     'local_steps': np.int32(2)},
                                     'finalizer': pop.process.get_hparams(
                                         pop.member(state, 1))['finalizer']})
  with pytest.raises(ValueError, match=r'same local steps K.*\[2, 3\]'):
    pop.next(state, [datasets[:2], datasets[2:4]])


def test_a_recurrent_population_runs_its_lanes_with_the_lane_axis_on_the_weights():
  """The tiny masked GRU of test_recurrent_cohort: 2 client η × 2 seeds members
  of FedAdam, their lanes (member × client) one lane-axis program (lanes.py),
  equal to each member's own cohort run over 2 rounds of all 3 clients. One
  epoch of clients of 1, 4 and 2 batches: the lanes run longest first, so each
  lane's start (its member's weights) must follow it."""
  import test_recurrent_cohort as rc  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  process = fedopt.build_fedadam(rc._model_fn(tf.keras.layers.GRU), _sgd(), 0.01, local_steps=0,
                                 execution=cohort.CohortExecution())
  assert process.vectorized and process.round_parts.program.view.lane_model is not None
  grid = list(itertools.product(CLIENT_RATES, (0.01,), SEEDS))
  alone = [_member_state(process, *member) for member in grid]
  pop = population.build_population(process)
  state, clients = pop.stack(alone), rc._datasets((3, 13, 7))
  for round_num in range(2):
    output = pop.next(state, [clients] * len(grid))
    state = output.state
    for m in range(len(grid)):
      own = process.next(alone[m], clients)
      alone[m] = own.state
      _assert_member_equal(own.state, own.metrics, state, output.metrics, m,
                           f'gru member {grid[m]} round {round_num}')
