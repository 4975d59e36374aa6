"""The cohort execution equals the per-client one.

For every algorithm the cohort supports: 3 rounds on clients of unequal sizes
with partial batches, K-step and epoch-based rounds, vectorised and in
sequence, in-process and through TFF's executor; weights, server state and
metrics equal within 1e-5. Both executions start from and return the same
`LearningAlgorithmState` layout, so a round of one continues a run of the other.
"""

import collections
import concurrent.futures
import os
import subprocess
import sys
import threading
import types
import warnings

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_adaptive.aggregators import compression
from tff_adaptive.aggregators import dp
from tff_adaptive.algorithms import composer
from tff_adaptive.algorithms import fedada2
from tff_adaptive.algorithms import fedgbo
from tff_adaptive.algorithms import fedopt
from tff_adaptive.algorithms import fedprox
from tff_adaptive.algorithms import mfl
from tff_adaptive.algorithms import mimelite
from tff_adaptive.algorithms import mimexlite
from tff_adaptive.algorithms import scaffold
from tff_adaptive.rounds import cohort
from tff_adaptive.rounds import cohort_data

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('local_cpp_context')]

D, H, C, B = 5, 7, 3, 4
SIZES = (7, 13, 3, 10)  # partial batches everywhere (B = 4)
_SPEC = collections.OrderedDict(x=tf.TensorSpec([None, D], tf.float32),
                                y=tf.TensorSpec([None], tf.int32))


def model_fn():
  init = lambda seed: tf.keras.initializers.RandomNormal(stddev=0.5, seed=seed)
  keras_model = tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(D,)),
      tf.keras.layers.Dense(H, activation='tanh', kernel_initializer=init(1),
                            bias_initializer=init(2)),
      tf.keras.layers.Dense(C, kernel_initializer=init(3), bias_initializer=init(4))])
  return tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=_SPEC, metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])


def client_datasets(sizes=SIZES):
  rng = np.random.default_rng(0)
  return [tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=rng.normal(loc=0.3 * i, size=(n, D)).astype(np.float32),
      y=rng.integers(0, C, n).astype(np.int32))).batch(B) for i, n in enumerate(sizes)]


sgd = lambda: tff.learning.optimizers.build_sgdm(0.1)
adam = lambda: tff.learning.optimizers.build_adam(0.05, beta_1=0.9, beta_2=0.99, epsilon=1e-3)
BUILDERS = {
    'fedavg': lambda **kw: fedopt.build_fedavg(model_fn, sgd(), **kw),
    'fedadam': lambda **kw: fedopt.build_fedadam(model_fn, sgd(), 0.05, **kw),
    'fedyogi_paper': lambda **kw: fedopt.build_fedyogi(model_fn, sgd(), 0.05, semantics='paper',
                                                       **kw),
    'fedavg_adam_clients': lambda **kw: fedopt.build_fedavg(model_fn, adam(), **kw),
    'fedgbo': lambda **kw: fedgbo.build_fedgbo(model_fn, adam(), **kw),
    'mfl': lambda **kw: mfl.build_mfl(model_fn, adam(), **kw),
    'mimexlite': lambda **kw: mimexlite.build_mimexlite(
        model_fn, sgd(), tff.learning.optimizers.build_sgdm(1.0, momentum=0.9), **kw),
    'mimelite': lambda **kw: mimelite.build_mimelite(
        model_fn, tff.learning.optimizers.build_sgdm(0.1, momentum=0.9), **kw),
    'fedprox': lambda **kw: fedprox.build_fedprox(model_fn, sgd(), proximal_strength=0.5, **kw),
    'fedada2': lambda **kw: fedada2.build_fedada2(
        model_fn, fedada2.build_client_optimizer('adam', 0.05),
        fedada2.build_server_optimizer('adam', 0.05), **kw),
    'fedada2_dja': lambda **kw: fedada2.build_fedada2(
        model_fn, fedada2.build_client_optimizer('adam', 0.05),
        fedada2.build_server_optimizer('adam', 0.05), preconditioner='dja', **kw),
    'fedada2_none': lambda **kw: fedada2.build_fedada2(
        model_fn, tff.learning.optimizers.build_sgdm(0.05),
        fedada2.build_server_optimizer('adam', 0.05), preconditioner='none', **kw),
}


def _shards(process, datasets, local_steps):
  return process.make_shards([cohort_data.client_batches(ds, local_steps) for ds in datasets])


def _assert_outputs_equal(a, b, what):
  for name, x, y in (('state', a.state, b.state), ('metrics', a.metrics, b.metrics)):
    xs, ys = tf.nest.flatten(x), tf.nest.flatten(y)
    assert len(xs) == len(ys), f'{what}: {name} structures differ'
    for u, v in zip(xs, ys):
      if np.asarray(u).dtype.kind in 'OSU':  # e.g. the DP event's names in the DP state
        assert np.asarray(u) == np.asarray(v), f'{what}: {name}'
        continue
      np.testing.assert_allclose(np.asarray(v, np.float64), np.asarray(u, np.float64),
                                 rtol=1e-5, atol=1e-5, err_msg=f'{what}: {name}')


_REFERENCES = {}


def _per_client_rounds(name, local_steps, rounds, datasets, kwargs):
  """The per-client process and its first `rounds` outputs from `initialize()`;
  with the default clients and options, made once per module and shared by the
  executions compared with it (the reference is the same for all of them)."""
  key = (name, local_steps) if datasets is None and not kwargs else None
  if key in _REFERENCES and len(_REFERENCES[key][1]) >= rounds:
    return _REFERENCES[key][0], _REFERENCES[key][1][:rounds]
  process = BUILDERS[name](local_steps=local_steps, **kwargs)
  outputs, state = [], process.initialize()
  for _ in range(rounds):
    outputs.append(process.next(state, datasets or client_datasets()))
    state = outputs[-1].state
  if key is not None:
    _REFERENCES[key] = (process, outputs)
  return process, outputs


def _compare(name, local_steps, execution, rounds=3, datasets=None, **kwargs):
  per_client, expected = _per_client_rounds(name, local_steps, rounds, datasets, kwargs)
  datasets = datasets or client_datasets()
  with warnings.catch_warnings():
    warnings.simplefilter('error')  # the cohort must not fall back to per client
    fast = BUILDERS[name](local_steps=local_steps, execution=execution, **kwargs)
  assert isinstance(fast, cohort.CohortProcess)
  state = per_client.initialize()
  assert tf.nest.map_structure(lambda _: 0, state) == tf.nest.map_structure(
      lambda _: 0, fast.initialize()), 'the two executions must share the state layout'
  fast_state = state
  for r in range(rounds):
    actual = fast.next(fast_state, _shards(fast, datasets, local_steps))
    _assert_outputs_equal(expected[r], actual, f'{name} K={local_steps} round {r + 1}')
    fast_state = actual.state
  return fast


@pytest.mark.parametrize('name', sorted(BUILDERS))
def test_cohort_equals_per_client_k_steps(name):
  """What bin/train's --cohort_jit_compile=auto runs for a fixed-K MLP: clients
  vectorised, the whole shard program one XLA computation (pfor turns a
  per-client tf.cond into ops XLA cannot compile: MimeXlite's first gradient
  did, until the vectorised client loop selected instead)."""
  fast = _compare(name, 3, cohort.CohortExecution(mode='auto', jit_compile='program'))
  assert fast.vectorized  # an MLP: clients vectorised
  # The process names the Recipe it runs (bench/client_step_cost.py times its local_step).
  assert fast.recipe.name.split('_')[0] in name, (fast.recipe.name, name)


# The same program without XLA (the library's default) on the algorithms whose
# clients differ most: plain SGD, a client preconditioner with its own state,
# a full-gradient pass before the steps, a client hyperparameter in the step.
# The others' recipes run through the same program code, equal under XLA above.
@pytest.mark.parametrize('name', ['fedavg', 'fedada2', 'mimelite', 'fedprox'])
def test_cohort_without_xla_equals_per_client(name):
  _compare(name, 3, cohort.CohortExecution(mode='vectorized'))


@pytest.mark.parametrize('name', ['fedavg', 'fedadam', 'mfl', 'mimelite', 'fedprox'])
def test_cohort_equals_per_client_epochs_in_sequence(name):
  fast = _compare(name, 0, cohort.CohortExecution(mode='sequential'))
  assert not fast.vectorized
  assert fast.shard_stats.shards > 3  # clients of 1 to 4 batches: several shards by size
  assert 0.0 <= fast.shard_stats.waste < 0.5


def test_cohort_epochs_vectorised_with_one_padded_shard():
  fast = _compare('fedadam', 0, cohort.CohortExecution(mode='vectorized', num_shards=1))
  assert fast.shard_stats.shards == 3 and fast.shard_stats.waste > 0.2


@pytest.mark.parametrize('mode', ['sequential', 'vectorized'])
def test_xla_compiled_client_steps_equal(mode):
  _compare('fedadam', 3, cohort.CohortExecution(mode=mode, jit_compile=True), rounds=2)


@pytest.mark.parametrize('mode', ['sequential', 'vectorized'])
def test_xla_compiled_shard_program_equals(mode):
  """The whole program as one XLA computation; epochs give shards of two shapes."""
  _compare('fedyogi_paper', 0, cohort.CohortExecution(mode=mode, jit_compile='program'),
           rounds=2)


def test_cohort_through_tff_executor_equals_in_process():
  _compare('fedadam', 3, cohort.CohortExecution(in_process=False, num_shards=2), rounds=2)


def test_xla_program_through_tff_executor_equals():
  _compare('fedavg', 3, cohort.CohortExecution(in_process=False, num_shards=2,
                                               jit_compile='program'), rounds=2)


def test_unknown_jit_compile_is_refused():
  with pytest.raises(ValueError, match="jit_compile must be False, True, 'step', 'program' or "):
    cohort.CohortExecution(jit_compile='round')


@pytest.mark.parametrize('rnn, conv, local_steps, expected', [
    (True, True, 10, 'step'), (True, True, 0, 'step'),  # recurrent: per step, any K
    (False, False, 10, 'program'),  # feed-forward, fixed K: one shape per round
    (False, False, 0, False),  # epochs: a new shape (and compilation) most rounds
    (False, True, 10, False)])  # convolutions: not measured faster under XLA
def test_auto_jit_compile_follows_the_measured_rule(rnn, conv, local_steps, expected):
  view = types.SimpleNamespace(has_rnn=rnn, has_conv_or_rnn=conv)
  assert cohort.resolved_jit_compile('auto', view, local_steps) == expected
  assert cohort.resolved_jit_compile(True, view, local_steps) == 'step'
  assert cohort.resolved_jit_compile(False, view, local_steps) is False


def test_client_drift_and_uniform_weighting_equal():
  _compare('fedavg', 2, 'cohort', rounds=2, measure_client_drift=True,
           client_weighting=tff.learning.ClientWeighting.UNIFORM)


def _one_client_shard_options(what):
  return {'drift': dict(measure_client_drift=True),
          'dp': dict(model_aggregator=dp.dp_aggregator(0.0, 0.3, len(SIZES))),
          'compression': dict(upload_compression=compression.SharedIndexCompressionFactory(
              0.5, quantize=True))}[what]


@pytest.mark.parametrize('what', ['drift', 'dp', 'compression'])
def test_shards_of_one_client_equal(what):
  """Epoch rounds group clients by size, often one client to a shard: its
  client axis under tf.vectorized_map has size 1, which an unqualified squeeze
  (tf.norm's default) removes with the others (the drift metric once failed so)."""
  fast = _compare('fedavg', 0, cohort.CohortExecution(mode='vectorized', num_shards=len(SIZES)),
                  rounds=2, **_one_client_shard_options(what))
  assert fast.shard_stats.shards == 2 * len(SIZES)  # a shard per client and round


@pytest.mark.parametrize('execution', [
    cohort.CohortExecution(), cohort.CohortExecution(in_process=False, num_shards=2)])
def test_next_takes_client_datasets_as_tffs_learning_processes_do(execution):
  """`process.next(state, client_datasets)` builds `make_shards`' shards itself:
  the same round as the shards (exactly), and as the per-client process."""
  datasets = client_datasets()  # unequal clients, partial batches
  per_client = BUILDERS['fedadam'](local_steps=0)
  fast = BUILDERS['fedadam'](local_steps=0, execution=execution)
  assert fast.next.type_signature == fast.tff_next.type_signature  # shards at CLIENTS
  state = fast.initialize()
  for r, steps in enumerate((0, 2)):  # K is the state's: epochs, then 2 steps
    state = state._replace(client_work=collections.OrderedDict(
        state.client_work, local_steps=np.int32(steps)))
    from_datasets = fast.next(state, datasets)
    from_shards = fast.next(state, _shards(fast, datasets, steps))
    for a, b in zip(tf.nest.flatten((from_datasets.state, from_datasets.metrics)),
                    tf.nest.flatten((from_shards.state, from_shards.metrics))):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    _assert_outputs_equal(per_client.next(state, datasets), from_datasets, f'round {r + 1}')
    state = from_datasets.state


def test_next_takes_client_inputs_of_clients_that_keep_state():
  """SCAFFOLD: `process.client_input(dataset, state)` per client, as per client;
  the new states come back in the clients' order (epochs: shards reorder them)."""
  fast = scaffold.build_scaffold(model_fn, sgd(), tff.learning.optimizers.build_sgdm(1.0),
                                 local_steps=0, total_clients=len(SIZES), execution='cohort')
  state, datasets = fast.initialize(), client_datasets()
  stored = [fast.client_state_initial] * len(datasets)
  for _ in range(2):
    from_inputs = fast.next(state, [fast.client_input(d, c) for d, c in zip(datasets, stored)])
    from_shards = fast.next(state, fast.with_client_states(_shards(fast, datasets, 0), stored))
    for a, b in zip(tf.nest.flatten(from_inputs), tf.nest.flatten(from_shards)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    state, stored = from_inputs.state, from_inputs.clients
  with pytest.raises(TypeError, match='process.client_input'):
    fast.next(state, datasets)


def test_next_refuses_client_data_of_another_kind():
  fast = BUILDERS['fedavg'](local_steps=2, execution='cohort')
  state, datasets = fast.initialize(), client_datasets()
  with pytest.raises(TypeError, match='client_data, a list with one entry per client'):
    fast.next(state, datasets[0])
  with pytest.raises(TypeError, match='client_data must be a list of tf.data.Dataset'):
    fast.next(state, [datasets[0], np.zeros(3)])


def test_a_client_without_data_counts_as_in_the_per_client_round():
  datasets = client_datasets((6, 0, 9))
  _compare('fedavg', 2, 'cohort', rounds=1, datasets=datasets)


def test_runs_switch_execution_between_rounds():
  datasets = client_datasets()
  per_client = BUILDERS['fedadam'](local_steps=2)
  fast = BUILDERS['fedadam'](local_steps=2, execution='cohort')
  state = per_client.initialize()
  one = per_client.next(state, datasets)
  reference = per_client.next(one.state, datasets)
  switched = fast.next(one.state, _shards(fast, datasets, 2))
  _assert_outputs_equal(reference, switched, 'per-client round 1, cohort round 2')
  back = per_client.next(fast.next(state, _shards(fast, datasets, 2)).state, datasets)
  _assert_outputs_equal(reference, back, 'cohort round 1, per-client round 2')


def test_unsupported_aggregator_runs_per_client_with_one_line_naming_it():
  aggregator = tff.aggregators.clipping_factory(1.0, tff.aggregators.MeanFactory())
  with pytest.warns(cohort.CohortDoesNotApply, match=r'fedavg: the cohort execution does not '
                    r'apply \(the aggregator \w+Factory runs per client\)'):
    built = composer.built_by(lambda: BUILDERS['fedavg'](local_steps=1, execution='cohort',
                                                         model_aggregator=aggregator))
  assert not isinstance(built.process, cohort.CohortProcess)
  # The reason as a value, beside the process the TFF-shaped builder returned.
  assert built.execution == 'per_client' and built.recipe is not None
  assert built.why_per_client.startswith('the aggregator ') and built.why_per_client.endswith(
      'Factory runs per client'), built.why_per_client
  fast = composer.built_by(lambda: BUILDERS['fedavg'](local_steps=1, execution='cohort'))
  assert isinstance(fast.process, cohort.CohortProcess) and fast.why_per_client is None
  assert fast.execution == cohort.CohortExecution() and fast.process.recipe is fast.recipe


def _label_shaped_model(kind):
  """An autoencoder (y = x, mean squared error: the metric reduces y's last axis) or a
  multi-label model (multi-hot y, Precision/Recall: the mask must take y's shape)."""
  spec = collections.OrderedDict(x=tf.TensorSpec([None, D], tf.float32),
                                 y=tf.TensorSpec([None, D], tf.float32))

  def build():
    keras_model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(D,)),
        tf.keras.layers.Dense(D, activation='sigmoid',
                              kernel_initializer=tf.keras.initializers.RandomNormal(seed=5))])
    if kind == 'autoencoder':
      loss, metrics = tf.keras.losses.MeanSquaredError(), [
          tf.keras.metrics.MeanSquaredError(), tf.keras.metrics.MeanAbsoluteError()]
    else:
      loss, metrics = tf.keras.losses.BinaryCrossentropy(), [
          tf.keras.metrics.Precision(), tf.keras.metrics.Recall(top_k=2)]
    return tff.learning.models.from_keras_model(keras_model, loss=loss, input_spec=spec,
                                                metrics=metrics)

  return build


@pytest.mark.parametrize('kind', ['autoencoder', 'multi_label'])
def test_metrics_of_label_shaped_outputs_equal(kind):
  rng = np.random.default_rng(1)
  datasets = []
  for n in SIZES:
    x = rng.uniform(size=(n, D)).astype(np.float32)
    y = x if kind == 'autoencoder' else (x > 0.5).astype(np.float32)
    datasets.append(tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=x, y=y)).batch(B))
  build = lambda **kw: fedopt.build_fedavg(_label_shaped_model(kind), sgd(), local_steps=2, **kw)
  per_client, fast = build(), build(execution='cohort')
  assert isinstance(fast, cohort.CohortProcess)
  state = per_client.initialize()
  expected = per_client.next(state, datasets)
  actual = fast.next(state, _shards(fast, datasets, 2))
  _assert_outputs_equal(expected, actual, kind)


T, V = 6, 9  # the sequence model's steps and vocabulary


def sequence_model_fn():
  spec = collections.OrderedDict(x=tf.TensorSpec([None, T], tf.int32),
                                 y=tf.TensorSpec([None, T], tf.int32))
  keras_model = tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(T,)),
      tf.keras.layers.Embedding(V, 3, mask_zero=True,
                                embeddings_initializer=tf.keras.initializers.RandomNormal(seed=1)),
      tf.keras.layers.GRU(5, return_sequences=True,
                          kernel_initializer=tf.keras.initializers.GlorotUniform(seed=2),
                          recurrent_initializer=tf.keras.initializers.Orthogonal(seed=3)),
      tf.keras.layers.Dense(V, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=4))])
  return tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=spec, metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])


def sequence_datasets(sizes=(7, 13, 3)):
  rng = np.random.default_rng(0)  # zeros (masked tokens) inside and at the end of sequences
  return [tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=rng.integers(0, V, (n, T)).astype(np.int32),
      y=rng.integers(0, V, (n, T)).astype(np.int32))).batch(B) for n in sizes]


@pytest.mark.parametrize('jit_compile', [False, True])
def test_masked_sequence_model_equals_tff_forward_pass(jit_compile):
  """Embedding(mask_zero=True) + GRU, as the Shakespeare models: TFF's forward
  pass loses the Keras mask (its loss counts the masked steps); so must the cohort.
  Under XLA the GRU runs its generic loop (functional._generic_rnn): same values."""
  datasets = sequence_datasets()
  build = lambda **kw: fedopt.build_fedavg(sequence_model_fn, sgd(), local_steps=0, **kw)
  per_client = build()
  # In sequence; vectorised (unrolled) recurrent cohorts: tests/test_recurrent_cohort.py.
  fast = build(execution=cohort.CohortExecution(mode='sequential', jit_compile=jit_compile))
  assert isinstance(fast, cohort.CohortProcess) and not fast.vectorized
  state = per_client.initialize()
  for r in range(2):
    expected = per_client.next(state, datasets)
    actual = fast.next(state, _shards(fast, datasets, 0))
    _assert_outputs_equal(expected, actual, f'masked GRU round {r + 1}')
    state = expected.state


def xla_sequence_rounds(rounds=2, local_steps=2):
  """Rounds of the GRU model with XLA-compiled steps (run by the test below in a child)."""
  process = fedopt.build_fedavg(sequence_model_fn, sgd(), local_steps=local_steps,
                                execution=cohort.CohortExecution(mode='sequential',
                                                                 jit_compile=True))
  state = process.initialize()
  for _ in range(rounds):
    state = process.next(state, _shards(process, sequence_datasets((8, 8)), local_steps)).state


_CHILD = """
import sys
import threading
sys.path[:0] = sys.argv[1:]
import test_cohort
from tff_adaptive.execution import runtime
runtime.use_local_cpp_context()
try:
  test_cohort.xla_sequence_rounds()
finally:
  runtime.shutdown_workers()
"""


def test_xla_compiles_a_recurrent_client_step_once():
  """Every batch has one shape, so the jit-compiled step compiles once. Keras'
  GRU fast path made XLA take its weights and inputs as compile-time constants
  and recompile at every step (2 rounds x 2 clients x 2 steps = 8 here), which
  no result shows; TF's log counts the compilations (a child: the log level is
  read when TF loads)."""
  tests = os.path.dirname(os.path.abspath(__file__))
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='0', TF_CPP_VMODULE='device_compiler=1')
  child = subprocess.run([sys.executable, '-c', _CHILD, os.path.dirname(tests), tests], env=env,
                         capture_output=True, text=True, timeout=600, check=False)
  assert child.returncode == 0, child.stderr[-3000:]
  compilations = child.stderr.count('Compilation of XLA executable')
  assert compilations == 1, f'{compilations} XLA compilations of one step shape'


def test_padding_and_shards():
  clients = [[{'x': np.ones((4, 2)), 'y': np.ones(4)}] * n for n in (5, 1, 4, 2)]
  clients[1] = [{'x': np.ones((3, 2)), 'y': np.ones(3)}]
  assert cohort_data.group_by_size(clients) == [[0, 2], [3], [1]]
  assert cohort_data.group_by_size(clients, num_shards=2) == [[0, 2], [3, 1]]
  shard = cohort_data.pad([clients[1], clients[3]])
  assert shard['batches']['x'].shape == (2, 2, 4, 2)
  np.testing.assert_array_equal(shard['mask'], [[[1, 1, 1, 0], [0, 0, 0, 0]],
                                                [[1, 1, 1, 1], [1, 1, 1, 1]]])
  stats = cohort_data.ShardStats()
  cohort_data.shards(clients, num_shards=1, stats=stats)
  assert (stats.real_rows, stats.padded_rows) == (47, 80)


def test_client_cache_keeps_under_its_budget_and_rebuilds_evicted():
  built = []

  def dataset_fn(ids):
    built.extend(ids)
    return [tf.data.Dataset.from_tensor_slices({'x': np.full((6, 10), float(i))}).batch(2)
            for i in ids]

  cache = cohort_data.ClientCache(dataset_fn, budget_bytes=3 * 6 * 10 * 8)
  first = cache.get(['0', '1'], 3)
  assert len(first[1]) == 3 and built == ['0', '1']
  cache.get(['0', '1'], 3)
  assert built == ['0', '1']  # cached
  cache.get(['2', '3'], 3)  # 4 clients do not fit: the oldest goes
  assert cache.nbytes <= 3 * 6 * 10 * 8
  again = cache.get(['0'], 3)
  assert built[-1] == '0' and float(again[0][0]['x'][0, 0]) == 0.0


def test_client_cache_shared_by_threads_reads_each_client_once():
  """A population's feeders of one seed share a cache and prefetch on their own
  threads at once: a client missing for both is read from tf.data once."""
  built, started = [], threading.Event()

  def dataset_fn(ids):
    built.extend(ids)
    started.wait(5)  # the second caller arrives while the first still reads
    return [tf.data.Dataset.from_tensor_slices({'x': np.zeros((4, 2))}).batch(2) for _ in ids]

  cache = cohort_data.ClientCache(dataset_fn)
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    first = pool.submit(cache.get, ['0', '1'], 2)
    second = pool.submit(cache.get, ['1', '0'], 2)
    started.set()
    assert len(first.result()) == len(second.result()) == 2
  assert sorted(built) == ['0', '1']
