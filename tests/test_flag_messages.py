"""bin/train names the flags: the library's argument errors mapped to the flag that sets
each argument (the scans that keep the table complete: tests/test_library_messages.py)."""

import ast
import os
import pickle
import re
import types
from typing import Optional

import pytest
import tensorflow as tf
import tensorflow_federated as tff

import algorithm_testing as at
from tff_adaptive import errors as library_errors
from tff_adaptive.aggregators import compression
from tff_adaptive.aggregators import dp
from tff_adaptive.algorithms import fedada2
from tff_adaptive.algorithms import fedgbo
from tff_adaptive.algorithms import fedmax
from tff_adaptive.algorithms import fedopt
from tff_adaptive.algorithms import fedprox
from tff_adaptive.algorithms import mimexlite
from tff_adaptive.algorithms import mtfl
from tff_adaptive.algorithms import perfedavg
from tff_adaptive.algorithms import pfedme
from tff_adaptive.execution import data_on_workers
from tff_adaptive.execution import worker_process
from tff_adaptive.optimizers import biased as biased_optimizers
from tff_adaptive.optimizers import sm3
from tff_adaptive.rounds import cohort
from tff_adaptive.schedules import driver as round_schedules
from workflow.flags import config
from workflow.flags import library_flags
from workflow.flags import train_flags



# ---- bin/train names the flags: the library's messages mapped ----

def _sgd():
  return tff.learning.optimizers.build_sgdm(0.1)


def _no_batch_norm():
  return tf.keras.Sequential([tf.keras.Input([3]), tf.keras.layers.Dense(2)], name='dense_only')


# (what raises, the start of the library's message, the flag bin/train names).
LIBRARY_ERRORS = [
    (lambda: biased_optimizers.BiasedOptimizer('sgd'), 'BiasedOptimizer: name', '--client_optimizer'),
    (lambda: biased_optimizers.BiasedOptimizer('adam', beta_1=1.0), 'BiasedOptimizer: beta_1',
     '--client_beta_1'),
    (lambda: biased_optimizers.BiasedOptimizer('adam', beta_2=-0.1), 'BiasedOptimizer: beta_2',
     '--client_beta_2'),
    (lambda: biased_optimizers.BiasedOptimizer('adam', epsilon=0.0), 'BiasedOptimizer: epsilon',
     '--client_epsilon'),
    (lambda: dp.dp_aggregator(-1.0, 1.0, 10), 'dp_aggregator: noise_multiplier',
     '--dp_noise_multiplier'),
    (lambda: dp.dp_aggregator(1.0, 0.0, 10), 'dp_aggregator: clip_norm', '--dp_clip_norm'),
    (lambda: compression.SharedIndexCompressionFactory(1.0),
     'SharedIndexCompressionFactory: sparsity', '--sparsity'),
    (lambda: fedopt.build_server_optimizer('adam', 0.1, semantics='nope'),
     'fedopt.build_server_optimizer: semantics', '--server_optimizer_semantics'),
    (lambda: fedopt.build_server_optimizer('lamb', 0.1), 'fedopt.build_server_optimizer: name',
     '--server_optimizer'),
    (lambda: fedada2.build_client_optimizer('sgd', 0.1), 'fedada2.build_client_optimizer: name',
     '--client_optimizer'),
    (lambda: fedada2.build_client_optimizer('sm3_adagrad', 0.1, delay=0),
     'fedada2.build_client_optimizer: delay', '--sm3_delay'),
    (lambda: fedada2.build_server_optimizer('yogi', 0.1), 'fedada2.build_server_optimizer: name',
     '--server_optimizer'),
    (lambda: fedada2.fedada2_recipe(sm3.build_sm3_adam(0.1), fedada2.build_server_optimizer(
        'adam', 0.1), preconditioner='diag'), 'fedada2: preconditioner', '--preconditioner'),
    (lambda: fedada2.fedada2_recipe(sm3.build_sm3_adam(0.1), fedada2.build_server_optimizer(
        'adam', 0.1), preconditioner='dja'), "fedada2: preconditioner='dja'",
     '--preconditioner=dja needs a dense'),
    (lambda: fedgbo.build_fedgbo(at.model_fn, _sgd(), local_steps=0), 'fedgbo: local_steps',
     '--local_steps must be an integer ≥ 1'),
    (lambda: fedgbo.fedgbo_recipe(biased_optimizers.BiasedOptimizer('adam'), upload='both'),
     'fedgbo: upload', '--fedgbo_upload'),
    (lambda: mimexlite.build_mimexlite(at.model_fn, _sgd(), local_steps=0),
     'mimexlite: local_steps', '--local_steps'),
    (lambda: fedprox.build_fedprox(at.model_fn, _sgd(), proximal_strength=-1.0),
     'fedprox: proximal_strength', '--fedprox_mu'),
    (lambda: fedmax.fedmax_model_fn(at.keras_model, -1.0, None), 'fedmax: beta', '--fedmax_beta'),
    (lambda: perfedavg.perfedavg_recipe(0.0), 'perfedavg: beta', '--perfedavg_beta'),
    (lambda: pfedme.pfedme_recipe(0.0, 0.1), 'pfedme: lam', '--pfedme_lambda'),
    (lambda: pfedme.pfedme_recipe(1.0, 0.0), 'pfedme: personal_learning_rate',
     '--pfedme_personal_learning_rate'),
    (lambda: pfedme.pfedme_recipe(1.0, 0.1, inner_steps=0), 'pfedme: inner_steps',
     '--pfedme_inner_steps'),
    (lambda: pfedme.build_pfedme(at.model_fn, _sgd(), beta=0.0), 'pfedme: beta', '--pfedme_beta'),
    (lambda: mtfl.patch_layout(_no_batch_norm(), 'everything'), 'patch_layout: private',
     '--private must be one of'),
    (lambda: mtfl.patch_layout(_no_batch_norm(), 'all'), "patch_layout: private='all'",
     '--private=all needs a model with BatchNormalization'),
    (lambda: mtfl.build_mtfl(at.model_fn, at.keras_model, _sgd(), strategy='fedsgd'),
     'mtfl: strategy', '--mtfl_strategy'),
    (lambda: mtfl.build_mtfl(at.model_fn, at.keras_model, tff.learning.optimizers.build_adam(0.1),
                             private='none', strategy='fedavg'),
     "mtfl: strategy='fedavg'", "--mtfl_strategy=fedavg trains clients with SGD; an adaptive "
     "client optimiser is only used by --mtfl_strategy=fedavg_adam"),
    (lambda: worker_process.parse_addresses('localhost'), 'parse_addresses:', '--workers:'),
    (lambda: worker_process.parse_addresses('h:1,h:1'), 'parse_addresses:', '--workers:'),
    (lambda: data_on_workers.compose_data_on_workers(
        None, types.SimpleNamespace(name='plain', train_data=object())),
     'compose_data_on_workers:', '--data_on_workers: task plain'),
    (lambda: data_on_workers.compose_cohort_data_on_workers(
        types.SimpleNamespace(execution=cohort.CohortExecution(in_process=False)),
        types.SimpleNamespace(name='plain', train_data=object())),
     'compose_cohort_data_on_workers:', '--data_on_workers: task plain'),
]


@pytest.mark.parametrize('raise_it, library_text, flag_text', LIBRARY_ERRORS,
                         ids=[f'{i}-{case[1]}' for i, case in enumerate(LIBRARY_ERRORS)])
def test_library_errors_name_the_argument_and_bin_train_the_flag(raise_it, library_text,
                                                                  flag_text):
  with pytest.raises(library_errors.ArgumentError) as raised:
    raise_it()
  message = str(raised.value)
  assert message.startswith(library_text) and '--' not in message, message
  assert '\n' not in message
  assert raised.value.owner == library_text.split(':')[0]
  flagged = library_flags.flag_message(raised.value)
  assert flagged.startswith(flag_text), (message, flagged)
  assert library_text.split(': ')[0] + ':' not in flagged


def test_an_argument_error_survives_pickling_with_its_parts():
  error = _raised(lambda: mtfl.patch_layout(_no_batch_norm(), 'all'))
  copy = pickle.loads(pickle.dumps(error))
  assert (type(copy), str(copy), copy.owner, copy.argument, copy.value) == (
      type(error), str(error), 'patch_layout', 'private', 'all')
  assert library_flags.flag_message(copy) == library_flags.flag_message(error)


def test_the_flag_messages_leave_other_messages_alone():
  for message in ('fedgbo: model_fn must return a tff.learning.models.VariableModel',
                  '--local_steps must be >= 1', 'error schedule: observe(3) out of order',
                  'mtfl: local_steps must be >= 0'):  # text alone names no flag
    assert library_flags.flag_message(ValueError(message)) == message
  # An ArgumentError of an argument no flag sets keeps its message too.
  unset = library_errors.ArgumentError('mtfl', 'client_weighting', 'must be a ClientWeighting')
  assert library_flags.flag_message(unset) == 'mtfl: client_weighting must be a ClientWeighting'
  # local_steps is the flag's whoever refuses it.
  anyone = library_errors.ArgumentError('mtfl_fedavg', 'local_steps', 'must be >= 0; got -1')
  assert library_flags.flag_message(anyone) == '--local_steps must be >= 0; got -1'


def test_the_task_model_flag_is_named_where_the_library_cannot():
  error = _raised(lambda: mtfl.patch_layout(_no_batch_norm(), 'gamma_beta'))
  digits = config.from_flags({'task': 'digits'})
  assert library_flags.flag_message(error, digits).endswith(
      "--private=none (plain FL); --digits_model=cnn_bn has batch norm")
  emnist = config.from_flags({'task': 'emnist'})
  assert library_flags.flag_message(error, emnist).endswith('--private=none (plain FL)')
  # Only the refusal of a model without batch norm gets the hint.
  unknown = _raised(lambda: mtfl.patch_layout(_no_batch_norm(), 'everything'))
  assert 'has batch norm' not in library_flags.flag_message(unknown, digits)


def test_named_by_flags_raises_the_given_error_from_the_library_one():

  class Refused(ValueError):
    pass

  with pytest.raises(Refused, match='^--client_beta_1 must be in') as raised:
    with library_flags.named_by_flags(config.from_flags({}), Refused):
      biased_optimizers.BiasedOptimizer('adam', beta_1=1.0)
  assert isinstance(raised.value.__cause__, library_errors.ArgumentError)
  for unrelated in (ValueError('unrelated'),
                    library_errors.ArgumentError('nobody', 'unrelated', 'is no flag\'s')):
    with pytest.raises(ValueError) as raised:  # not a flag's library argument
      with library_flags.named_by_flags(config.from_flags({}), Refused):
        raise unrelated
    assert raised.value is unrelated


def _raised(function):
  with pytest.raises(library_errors.ArgumentError) as raised:
    function()
  return raised.value


def test_schedule_errors_name_the_schedule_flags():
  """The driver's ScheduleError opens with RoundSchedules' argument (no owner) and may name
  check_process's data_on_workers again; bin/train says both as flags."""
  error = round_schedules.ScheduleError(
      'local_steps', ': with ', library_errors.Given(argument='data_on_workers'),
      ' this algorithm gets a K fixed; drop ', library_errors.Given(argument='data_on_workers'),
      value='exp')
  assert str(error) == ('local_steps=exp: with data_on_workers this algorithm gets a K fixed; '
                        'drop data_on_workers')
  assert library_flags.flag_message(error) == (
      '--local_steps_schedule=exp: with --data_on_workers this algorithm gets a K fixed; drop '
      '--data_on_workers')
  error = round_schedules.ScheduleError('server_lr', ': this algorithm has no server learning rate')
  assert library_flags.flag_message(error) == (
      '--server_lr_schedule: this algorithm has no server learning rate')
  copy = pickle.loads(pickle.dumps(error))
  assert type(copy) is round_schedules.ScheduleError and str(copy) == str(error)
