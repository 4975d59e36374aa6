"""The state after a round has exactly the structure `initialize` returns.

A checkpoint is restored into the structure of `initialize()`'s state
(containers included: list vs tuple, dict vs OrderedDict). MFL-Adam once
returned tuples where `initialize` had lists, so a run resumed from a
checkpoint failed; this checks every round-composer and TFF-wrapped algorithm.
"""

import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import digits
from workflow.training import program
from tff_adaptive.execution import runtime
from workflow.flags import config
from workflow.training import algorithm_builders as registry

# (algorithm, extra flags): one client optimiser with state for each.
CASES = [
    ('fedavg', {}), ('fedavgm', {}), ('fedadagrad', {}), ('fedadam', {}), ('fedyogi', {}),
    ('fedgbo', {'client_optimizer': 'adam'}), ('fedgbo', {'client_optimizer': 'rmsprop'}),
    ('mfl', {'client_optimizer': 'adam'}), ('mfl', {'client_optimizer': 'sgdm'}),
    ('mimelite', {'client_optimizer': 'adam'}), ('mimexlite', {'client_optimizer': 'adam'}),
    ('fedprox', {}), ('fedmax', {}),
    ('ce_fedavg', {'client_optimizer': 'adam', 'upload_compression': 'topk_uniq',
                   'sparsity': 0.5}),
    ('fedada2', {'client_optimizer': 'sm3_adam', 'server_optimizer': 'adam'}),
    ('fedada2', {'client_optimizer': 'adam', 'server_optimizer': 'adagrad',
                 'preconditioner': 'dja'}),
]


@pytest.fixture(scope='module')
def task():
  runtime.use_local_cpp_context()
  return digits.create_task(num_clients=4)


def _exact_types(structure):
  """Container types along the structure (tf.nest ignores list vs tuple)."""
  if isinstance(structure, (list, tuple)):
    return (type(structure).__name__, tuple(_exact_types(x) for x in structure))
  if isinstance(structure, dict):
    return (type(structure).__name__, tuple((k, _exact_types(v)) for k, v in structure.items()))
  if hasattr(structure, '_fields'):  # namedtuples such as ModelWeights
    return (type(structure).__name__, tuple(_exact_types(x) for x in structure))
  return 'leaf'


@pytest.mark.parametrize('algorithm, extra', CASES,
                         ids=[f'{a}-{e.get("client_optimizer", "sgd")}' for a, e in CASES])
def test_state_after_a_round_has_the_initial_structure(task, algorithm, extra):
  settings = config.from_flags(dict(algorithm=algorithm, execution='per_client',
                                    client_learning_rate=0.05, local_steps=2,
                                    server_learning_rate=0.1, **extra))
  process = registry.build(task, settings)
  initial = process.initialize()
  ids = list(task.train_data.client_ids)[:2]
  output = process.next(initial, program.client_datasets(task, ids, None))
  after = output.state
  tf.nest.assert_same_structure(initial, after, check_types=True)
  assert _exact_types(after) == _exact_types(initial)
  # TFF's layout for every algorithm: state and metrics keys, model weights
  # and hparams through the process.
  assert isinstance(after, tff.learning.templates.LearningAlgorithmState)
  assert list(output.metrics)[:4] == ['distributor', 'client_work', 'aggregator', 'finalizer']
  assert set(output.metrics) == {'distributor', 'client_work', 'aggregator', 'finalizer', 'cost'}
  assert 'train' in output.metrics['client_work']
  weights = process.get_model_weights(after)
  assert isinstance(weights, tff.learning.models.ModelWeights)
  assert process.set_model_weights(after, weights) is not None
  hparams = process.get_hparams(after)
  assert set(hparams) == {'client_work', 'finalizer'}
  restored = process.set_hparams(after, hparams)
  tf.nest.assert_same_structure(restored, after)
