"""The cohort program runs TFF's robust aggregator as the per-client round does.

`aggregators.robust.robust_aggregator` (TFF's `tff.learning.robust_aggregator`,
with its norms known): adaptive zeroing (inf norm) around adaptive clipping (L2)
around the (un)weighted mean. 3 rounds on clients of unequal sizes with
partial batches, a softmax regression (a tanh layer would saturate and bound
Δ), one client's features scaled x10 (clipped) and one x3000 (zeroed):
weights within 1e-5, both norm estimates (the state), the norms used and the
zeroed / clipped counts (the measurements) equal, the counts nonzero; zeroing
and clipping each alone, neither, weighted and uniform, vectorised (shards of
one and two clients) and in sequence, through TFF's executor and on two TFF
workers (mergeable context), XLA-compiled.
The state is the per-client process's, so checkpoints carry over.
"""

import collections
import warnings

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl

# pylint: disable=g-bad-import-order
import test_cohort as tc
from test_workers import live_pool, pool  # pylint: disable=unused-import
from tff_adaptive.aggregators import robust
from tff_adaptive.aggregators import secure
from tff_adaptive.algorithms import fedopt
from tff_adaptive.execution import remote_context
from tff_adaptive.rounds import cohort
from tff_adaptive.rounds import cohort_aggregation

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('local_cpp_context')]

SCALES = (1.0, 10.0, 1.0, 3000.0)  # client 1 is clipped, client 3 zeroed


def linear_model_fn():
  keras_model = tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(tc.D,)),
      tf.keras.layers.Dense(tc.C, kernel_initializer=tf.keras.initializers.RandomNormal(
          stddev=0.5, seed=1))])
  return tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=tc._SPEC, metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])


def fedavg(**kwargs):
  return fedopt.build_fedavg(linear_model_fn, tc.sgd(), local_steps=2, **kwargs)


def robust_datasets():
  scale = lambda s: lambda b: collections.OrderedDict(x=b['x'] * s, y=b['y'])
  return [ds.map(scale(s)) for ds, s in zip(tc.client_datasets(), SCALES)]


def _counts(measurements, zeroing, clipping):
  """(zeroed, clipped) counts of one round's aggregator measurements."""
  if zeroing:
    zeroed, measurements = int(measurements['zeroed_count']), measurements['zeroing']
  else:
    zeroed = 0
  return zeroed, int(measurements['clipped_count']) if clipping else 0


_REFERENCES = {}


def _per_client_rounds(zeroing, clipping, weighted, rounds):
  """(initial state, the per-client process's first `rounds` outputs from it), made
  once per module for each aggregator (the executions compared with it share them)."""
  key = (zeroing, clipping, weighted)
  if key not in _REFERENCES or len(_REFERENCES[key][1]) < rounds:
    per_client = fedavg(model_aggregator=robust.robust_aggregator(
        zeroing=zeroing, clipping=clipping, weighted=weighted))
    initial = state = per_client.initialize()
    outputs = []
    for _ in range(rounds):
      outputs.append(per_client.next(state, robust_datasets()))
      state = outputs[-1].state
    _REFERENCES[key] = (initial, outputs)
  initial, outputs = _REFERENCES[key]
  return initial, outputs[:rounds]


def _compare_robust(execution, zeroing=True, clipping=True, weighted=True, rounds=3):
  factory = robust.robust_aggregator(zeroing=zeroing, clipping=clipping, weighted=weighted)
  datasets = robust_datasets()
  with warnings.catch_warnings():
    warnings.simplefilter('error')  # the cohort must not fall back to per client
    fast = fedavg(model_aggregator=factory, execution=execution)
  assert isinstance(fast, cohort.CohortProcess)
  state, references = _per_client_rounds(zeroing, clipping, weighted, rounds)
  tf.nest.assert_same_structure(state, fast.initialize(), check_types=True)
  fast_state, zeroed, clipped = state, 0, 0
  for r, expected in enumerate(references):
    actual = fast.next(fast_state, tc._shards(fast, datasets, 2))
    tc._assert_outputs_equal(expected, actual, f'robust round {r + 1}')
    tf.nest.assert_same_structure(expected.state, actual.state, check_types=True)
    tf.nest.assert_same_structure(expected.metrics['aggregator'], actual.metrics['aggregator'],
                                  check_types=True)
    counts = _counts(actual.metrics['aggregator'], zeroing, clipping)
    zeroed, clipped = zeroed + counts[0], clipped + counts[1]
    state, fast_state = expected.state, actual.state
  # Both mechanisms acted (else the comparison proves little).
  assert (zeroed > 0) == zeroing and (clipped > 0) == clipping, (zeroed, clipped)
  return state


# (3 shards of 4 clients: vectorised shards of one client, where tf.norm's squeeze
# would drop the client axis, and of two)
@pytest.mark.parametrize('zeroing,clipping,weighted,execution', [
    (True, True, True, dict(mode='vectorized', num_shards=3)),
    (True, True, False, dict(mode='sequential')), (True, False, True, dict(mode='sequential')),
    (False, True, False, dict(mode='vectorized')),
    (False, False, True, dict(mode='vectorized'))])  # neither: TFF's plain MeanFactory
def test_robust_equals_per_client(zeroing, clipping, weighted, execution):
  state = _compare_robust(cohort.CohortExecution(**execution), zeroing, clipping, weighted)
  # The norms moved from their initial estimates (10, 1).
  estimates = robust.robust_aggregator(
      zeroing=zeroing, clipping=clipping, weighted=weighted).query_states(state.aggregator)
  initial = [n.initial_estimate for n in robust.robust_aggregator(
      zeroing=zeroing, clipping=clipping).norms]
  assert all(float(s.current_estimate) != i for s, i in zip(estimates, initial))


def test_robust_through_tff_executor_on_two_shards():
  _compare_robust(cohort.CohortExecution(in_process=False, num_shards=2))


def test_robust_on_two_tff_workers(live_pool):
  # TFF's mergeable context: the norms go down with the model, each worker
  # returns its shard's sums (records and counts included), merged once.
  datasets = robust_datasets()
  on_workers = fedavg(model_aggregator=robust.robust_aggregator(),
                      execution=cohort.CohortExecution(in_process=False, num_shards=2))
  context = remote_context.create_workers_context([w.address for w in live_pool])
  remote_state, references = _per_client_rounds(True, True, True, 2)
  for r, expected in enumerate(references):
    shards = tc._shards(on_workers, datasets, 2)
    with context_stack_impl.context_stack.install(context):
      remote = on_workers.next(remote_state, shards)
    tc._assert_outputs_equal(expected, remote, f'robust on 2 workers, round {r + 1}')
    assert _counts(remote.metrics['aggregator'], True, True) == (1, 1)
    remote_state = remote.state


# (bin/train's --cohort_jit_compile=auto compiles fixed-K feed-forward rounds so, vectorised)
@pytest.mark.parametrize('weighted,execution', [
    (False, dict(mode='sequential')), (True, dict(mode='vectorized', num_shards=3))])
def test_robust_in_an_xla_compiled_shard_program(weighted, execution):
  _compare_robust(cohort.CohortExecution(jit_compile='program', **execution), weighted=weighted)


def test_a_per_client_checkpoint_continues_under_the_cohort():
  fast = fedavg(model_aggregator=robust.robust_aggregator(), execution='cohort')
  _, (one, reference) = _per_client_rounds(True, True, True, 2)
  switched = fast.next(one.state, tc._shards(fast, robust_datasets(), 2))
  tc._assert_outputs_equal(reference, switched, 'per-client round 1, cohort round 2')
  tf.nest.assert_same_structure(reference.state, switched.state, check_types=True)
  assert type(switched.state.aggregator['zeroing_norm'][0]).__name__ == '_GlobalState'


def test_the_factory_is_tffs_robust_aggregator():
  for weighted in (True, False):
    ours = robust.robust_aggregator(zeroing=True, clipping=False, weighted=weighted)
    theirs = tff.learning.robust_aggregator(zeroing=True, clipping=False, weighted=weighted)
    assert isinstance(ours, tff.aggregators.WeightedAggregationFactory) == weighted
    assert type(ours.tff_factory).__qualname__ == type(theirs).__qualname__  # a local class
    value = tff.TensorType(np.float32, [3])
    types = (value, tff.TensorType(np.float32)) if weighted else (value,)
    assert (ours.create(*types).next.type_signature ==
            theirs.create(*types).next.type_signature)


@pytest.mark.parametrize('make', [
    lambda: tff.learning.robust_aggregator(), lambda: tff.learning.secure_aggregator()])
def test_tffs_own_robust_and_secure_aggregators_run_per_client(make):
  aggregator = make()
  reason = cohort_aggregation.supported(
      cohort.options_lib.RoundOptions(model_aggregator=aggregator))
  assert reason == f'the aggregator {type(aggregator).__name__} runs per client'


def test_the_package_secure_aggregator_is_tffs_and_runs_per_client():
  for weighted in (True, False):
    ours = secure.secure_aggregator(zeroing=False, clipping=False, weighted=weighted)
    theirs = tff.learning.secure_aggregator(zeroing=False, clipping=False, weighted=weighted)
    assert isinstance(ours, tff.aggregators.WeightedAggregationFactory) == weighted
    assert type(ours.tff_factory) is type(theirs)
    reason = cohort_aggregation.supported(
        cohort.options_lib.RoundOptions(model_aggregator=ours))
    assert reason == (f'the aggregator secure_aggregator(zeroing=False, clipping=False, '
                      f'weighted={weighted}) runs per client')


def test_an_aggregator_in_another_role_runs_per_client():
  # The robust aggregator aggregates Δ; as an upload compression it aggregates
  # (Δ, extra) together, which only its TFF factory does, per client.
  reason = cohort_aggregation.supported(
      cohort.options_lib.RoundOptions(upload_compression=robust.robust_aggregator()))
  assert reason == 'the upload compression WeightedRobustFactory runs per client'
