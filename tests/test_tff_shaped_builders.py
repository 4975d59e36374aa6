"""Builders shaped like TFF's, TFF's state/metrics layout, hparams.

Equalities are checked against the package's own recipes driven with the
docs/algorithms.md#fedgbo optimisers (what the builders computed before they took TFF
optimisers), against TFF's FedAvg, and between the FunctionalModel and
VariableModel paths, on the linear-softmax model of `algorithm_testing`.
"""

import asyncio
import collections
import warnings

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import algorithm_testing as at
from tff_adaptive.accounting import flops
from tff_adaptive.algorithms import ce_fedavg
from tff_adaptive.algorithms import composer
from tff_adaptive.algorithms import fedada2
from tff_adaptive.algorithms import fedgbo
from tff_adaptive.algorithms import fedopt
from tff_adaptive.algorithms import mfl
from tff_adaptive.algorithms import mimexlite
from tff_adaptive.optimizers import biased
from tff_adaptive.optimizers import paper_fedopt
from tff_adaptive.optimizers import sm3
from tff_adaptive.rounds import layout
from workflow.training import run_files

K = 3
LR = 0.05
SIZES = (7, 12, 5)
B1, B2, EPS = 0.8, 0.9, 1e-3
opts = tff.learning.optimizers


# TFF's local C++ context for the module, its worker stopped after (conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('local_cpp_context')]


@pytest.fixture(scope='module')
def data():
  return at.datasets(at.make_clients(SIZES, seed=6))


def _run(process, data, rounds=2, state=None):
  state = process.initialize() if state is None else state
  for _ in range(rounds):
    output = process.next(state, data)
    state = output.state
  return at.trainable(process, state), state, output.metrics


def _functional_model():
  return tff.learning.models.functional_model_from_keras(
      at.keras_model(), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=(at._SPEC['x'], at._SPEC['y']))  # pylint: disable=protected-access


def _tuple_datasets(data):
  return [ds.map(lambda b: (b['x'], b['y'])) for ds in data]


# ---- FunctionalModel ----


def test_functional_model_gives_the_variable_model_weights(data):
  variable = fedgbo.build_fedgbo(at.model_fn, opts.build_adam(LR, beta_1=B1, beta_2=B2,
                                                               epsilon=EPS), local_steps=K)
  functional = fedgbo.build_fedgbo(_functional_model(), opts.build_adam(
      LR, beta_1=B1, beta_2=B2, epsilon=EPS), local_steps=K, fb_flops_per_example=0.0)
  want, _, _ = _run(variable, data)
  got, state, metrics = _run(functional, _tuple_datasets(data))
  at.assert_close(got, want, rtol=1e-5, atol=1e-6)
  assert at.max_abs_diff(want, at.trainable(variable, variable.initialize())) > 1e-2
  assert isinstance(state, tff.learning.templates.LearningAlgorithmState)
  assert 'loss' in metrics['client_work']['train']  # TFF's model_from_functional metrics
  assert metrics['cost']['client_steps'] == K * len(SIZES)


# ---- TFF optimisers read by FedGBO / MFL: equal to the docs/algorithms.md#fedgbo recipes ----


@pytest.mark.parametrize('optimizer, biased_opt', [
    (opts.build_adam(LR, beta_1=B1, beta_2=B2, epsilon=EPS),
     biased.BiasedOptimizer('adam', beta_1=B1, beta_2=B2, epsilon=EPS)),
    (paper_fedopt.build_paper_client_adam(LR, beta_1=B1, beta_2=B2, epsilon=EPS),
     biased.BiasedOptimizer('adam', beta_1=B1, beta_2=B2, epsilon=EPS)),
    (opts.build_rmsprop(LR, decay=B1, epsilon=EPS),
     biased.BiasedOptimizer('rmsprop', beta_1=B1, epsilon=EPS)),
    (opts.build_sgdm(LR, momentum=B1), biased.BiasedOptimizer('sgdm', beta_1=B1)),
], ids=['tff_adam', 'paper_adam', 'tff_rmsprop', 'tff_sgdm'])
def test_fedgbo_reads_the_tff_optimizer(data, optimizer, biased_opt):
  ours = fedgbo.build_fedgbo(at.model_fn, optimizer, local_steps=K)
  recipe = composer.build_process(at.model_fn, fedgbo.fedgbo_recipe(biased_opt),
                                  client_learning_rate=LR, local_steps=K)
  got, state, _ = _run(ours, data)
  want, want_state, _ = _run(recipe, data)
  at.assert_close(got, want, rtol=0, atol=0)
  at.assert_close(at.flat(state.finalizer), at.flat(want_state.finalizer), rtol=0, atol=0)
  assert float(state.client_work['learning_rate']) == np.float32(LR)


def test_mfl_reads_the_tff_optimizer(data):
  ours = mfl.build_mfl(at.model_fn, opts.build_adam(LR, beta_1=B1, beta_2=B2, epsilon=EPS),
                       bias_correction=True)
  recipe = composer.build_process(
      at.model_fn, mfl.mfl_recipe(biased.BiasedOptimizer('adam', beta_1=B1, beta_2=B2,
                                                         epsilon=EPS, bias_correction=True)),
      client_learning_rate=LR, local_steps=0)
  got, _, _ = _run(ours, data)
  want, _, _ = _run(recipe, data)
  at.assert_close(got, want, rtol=0, atol=0)


def test_fedopt_with_an_adam_client_equals_tffs_fed_avg(data):
  """A client optimiser with state (restarted each round), as TFF's FedAvg runs it."""
  client = lambda: opts.build_adam(LR, beta_1=B1, beta_2=B2, epsilon=EPS)
  server = lambda: opts.build_sgdm(1.0, momentum=0.5)
  ours = fedopt.build_fedopt(at.model_fn, client(), server())
  reference = tff.learning.algorithms.build_weighted_fed_avg(at.model_fn, client(), server())
  got, _, metrics = _run(ours, data)
  want, _, ref_metrics = _run(reference, data)
  at.assert_close(got, want, rtol=1e-5, atol=1e-6)
  assert metrics['client_work']['train'] == pytest.approx(ref_metrics['client_work']['train'])
  # FedAda2 without preconditioner communication is that same round.
  ada = fedada2.build_fedada2(at.model_fn, client(), server())
  at.assert_close(_run(ada, data)[0], got, rtol=1e-6, atol=1e-7)


def test_mimexlite_takes_tff_adam_and_sm3(data):
  for optimizer in (opts.build_adam(LR), sm3.build_sm3_adam(LR)):
    process = mimexlite.build_mimexlite(at.model_fn, optimizer, local_steps=K)
    assert float(process.initialize().client_work['learning_rate']) == np.float32(LR)
    got, _, _ = _run(process, data, rounds=1)
    assert at.max_abs_diff(got, at.trainable(process, process.initialize())) > 1e-3


# ---- FedAda2's client learning rate is its optimiser's ----


def test_fedada2_uses_the_learning_rate_of_its_client_optimizer(data):
  server = opts.build_sgdm(1.0)

  def final(lr):
    process = fedada2.build_fedada2(at.model_fn, sm3.build_sm3_adam(lr), server, local_steps=K)
    assert float(process.initialize().client_work['learning_rate']) == np.float32(lr)
    return _run(process, data, rounds=1)[0], process

  still, process = final(0.0)
  at.assert_close(still, at.trainable(process, process.initialize()), rtol=0, atol=0)
  small, _ = final(0.01)
  large, _ = final(1.0)
  assert at.max_abs_diff(small, still) > 1e-3
  # SM3 moves each coordinate by at most η per step (docs/algorithms.md#fedada2): η = 1 moves further.
  assert at.max_abs_diff(large, still) > 10 * at.max_abs_diff(small, still)


# ---- hparams ----


def test_get_and_set_hparams_round_trip(data):
  process = fedopt.build_fedadam(at.model_fn, opts.build_sgdm(LR), 0.1, semantics='paper',
                                 local_steps=K)
  state = process.initialize()
  hparams = process.get_hparams(state)
  assert hparams['client_work'] == collections.OrderedDict(
      learning_rate=np.float32(LR), local_steps=np.int32(K))
  assert float(hparams['finalizer']['learning_rate']) == pytest.approx(0.1)
  changed = tf.nest.map_structure(lambda x: x, hparams)
  changed['client_work']['learning_rate'] = np.float32(0.02)
  changed['client_work']['local_steps'] = np.int32(1)
  changed['finalizer']['learning_rate'] = np.float32(0.3)
  new_state = process.set_hparams(state, changed)
  again = process.get_hparams(new_state)
  assert float(again['client_work']['learning_rate']) == np.float32(0.02)
  assert int(again['client_work']['local_steps']) == 1
  assert float(again['finalizer']['learning_rate']) == np.float32(0.3)
  assert float(new_state.finalizer['learning_rate']) == np.float32(0.3)
  # The round runs what the hparams say: the same as the schedules' direct write.
  direct = layout.set_round_hparams(state, client_learning_rate=0.02, local_steps=1)
  direct = direct._replace(finalizer=collections.OrderedDict(
      direct.finalizer, learning_rate=np.float32(0.3)))
  at.assert_close(_run(process, data, 1, new_state)[0], _run(process, data, 1, direct)[0],
                  rtol=0, atol=0)
  _, _, metrics = _run(process, data, 1, new_state)
  assert metrics['cost']['client_steps'] == len(SIZES)  # K = 1 from the hparams


# ---- metrics_aggregator, loop_implementation, model_distributor ----


def test_metrics_aggregator_and_loop_implementation_keep_the_round(data):
  plain = fedopt.build_fedopt(at.model_fn, opts.build_sgdm(LR), local_steps=K)
  other = fedopt.build_fedopt(
      at.model_fn, opts.build_sgdm(LR), local_steps=K,
      metrics_aggregator=lambda fins, t: tff.learning.metrics.sum_then_finalize(fins, t),
      loop_implementation=tff.learning.LoopImplementation.DATASET_REDUCE)
  want, _, want_metrics = _run(plain, data)
  got, _, metrics = _run(other, data)
  at.assert_close(got, want, rtol=1e-6, atol=1e-7)
  assert metrics['client_work']['train'] == pytest.approx(want_metrics['client_work']['train'])


# ---- rejections ----


def test_optimizers_an_algorithm_cannot_take_are_named():
  with pytest.raises(ValueError, match=r'fedgbo cannot take an AdaGrad with momentum'):
    fedgbo.build_fedgbo(at.model_fn, paper_fedopt.build_paper_adagrad(0.1), local_steps=K)
  with pytest.raises(ValueError, match=r'mfl cannot take .*sm3_adam.*build_rmsprop'):
    mfl.build_mfl(at.model_fn, sm3.build_sm3_adam(0.1))
  with pytest.raises(ValueError, match=r'fedgbo cannot take .*yogi'):
    fedgbo.build_fedgbo(at.model_fn, opts.build_yogi(0.1), local_steps=K)
  with pytest.raises(ValueError, match=r'ce_fedavg runs Adam clients.*sgd'):
    ce_fedavg.build_ce_fedavg(at.model_fn, opts.build_sgdm(0.1), sparsity=0.5)
  with pytest.raises(TypeError, match=r'fedgbo: client_optimizer_fn must be a '
                                      r'tff.learning.optimizers.Optimizer.*pass its result'):
    fedgbo.build_fedgbo(at.model_fn, opts.build_adam, local_steps=K)
  with pytest.raises(TypeError, match=r'fedopt: server_optimizer_fn must be'):
    fedopt.build_fedopt(at.model_fn, opts.build_sgdm(0.1), 'adam')
  with pytest.raises(TypeError, match=r'fedada2: model_fn must be a no-arg callable'):
    fedada2.build_fedada2(at.model_fn(), opts.build_adam(0.1), opts.build_sgdm(1.0))
  with pytest.raises(ValueError, match=r'fedgbo: model_distributor is not supported'):
    fedgbo.build_fedgbo(at.model_fn, opts.build_adam(0.1), local_steps=K,
                        model_distributor=tff.learning.templates.build_broadcast_process(
                            tff.learning.models.weights_type_from_model(at.model_fn)))
  with pytest.raises(ValueError, match=r"preconditioner='dja' needs a dense"):
    fedada2.build_fedada2(at.model_fn, sm3.build_sm3_adam(0.1), opts.build_adam(1.0),
                          preconditioner='dja')


# ---- FLOPs ----


def test_flops_are_counted_from_the_model_by_default(data):
  process = fedopt.build_fedopt(at.model_fn, opts.build_sgdm(LR), local_steps=K)
  _, _, metrics = _run(process, data, rounds=1)
  fb = flops.model_counts(at.keras_model()).fb_flops
  assert fb > 0
  examples = sum(sum(len(y) for _, y in at.np_batches(c, K))
                 for c in at.make_clients(SIZES, seed=6))
  num_params = at.D * at.C + at.C
  assert metrics['cost']['client_flops'] == pytest.approx(
      examples * fb + K * len(SIZES) * 2 * num_params)


def test_flops_of_a_model_that_cannot_be_counted_are_left_out_with_a_warning(data):
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    process = fedopt.build_fedopt(_functional_model(), opts.build_sgdm(LR), local_steps=K)
  assert any('client FLOPs are not measured' in str(w.message) for w in caught)
  _, _, metrics = _run(process, _tuple_datasets(data), rounds=1)
  assert 'client_flops' not in metrics['cost'] and 'client_steps' in metrics['cost']


# ---- checkpoints of the old OrderedDict layout ----


def test_checkpoint_of_the_old_state_layout_fails_in_one_line(tmp_path):
  process = fedgbo.build_fedgbo(at.model_fn, opts.build_adam(LR), local_steps=K)
  state = process.initialize()
  # What the loop saved before: (weights, stats, aggregator, extra_aggregator,
  # hparams, round_num) in the program state.
  old = collections.OrderedDict(
      global_model_weights=state.global_model_weights, stats=state.finalizer,
      aggregator=state.aggregator,
      extra_aggregator=collections.OrderedDict(value_sum_process=(), weight_sum_process=()),
      hparams=collections.OrderedDict(client_learning_rate=np.float32(LR),
                                      local_steps=np.int32(K)),
      round_num=np.int32(4))
  manager = tff.program.FileProgramStateManager(str(tmp_path / 'checkpoints'))
  asyncio.run(manager.save({'state': old, 'totals': '{}', 'schedules': ''}, 4))
  wanted = {'state': state, 'totals': '{}', 'schedules': ''}
  with pytest.raises(run_files.IncompatibleCheckpoint) as error:
    asyncio.run(run_files._load_checkpoint(manager, str(tmp_path), 4, wanted))  # pylint: disable=protected-access
  assert 'another version of tff_adaptive' in str(error.value)
  assert '\n' not in str(error.value)
