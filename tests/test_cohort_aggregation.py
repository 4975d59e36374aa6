"""The cohort program's aggregators equal the per-client round's.

Fixed-clip DP with noise 0 and CE-FedAvg compression: cohort and per-client
rounds equal within 1e-5 over 3 rounds on clients of unequal sizes (weights,
server state, the DP state, metrics, measured bits). With noise: the noise
the cohort adds has TFF's distribution, N(0, (σC / clients_per_round)²) on
the mean. Other aggregators run per client (test_cohort.py).

Compression is bit-identical per client given the same (Δ, extra) (the
cohort calls the factory's own encoder); end to end the rounds are not, as
Δ itself is not: the functional view's gradients round differently from the
model's variables (plain FedAvg: max |Δx| 6e-8 after 3 rounds). Measured
with compression (s = 0.5, UniQ/ExpQ): max |Δx| 1.2e-7 (FedAvg), 3e-8 (MFL),
upload bits equal in every round.
"""

import collections
import logging

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import test_cohort as tc
from tff_adaptive.aggregators import compression
from tff_adaptive.aggregators import dp
from tff_adaptive.algorithms import fedopt
from tff_adaptive.rounds import cohort
from tff_adaptive.rounds import cohort_aggregation

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('local_cpp_context')]


def test_dp_aggregator_is_tff_gaussian_fixed_and_keeps_its_parameters():
  aggregator = dp.dp_aggregator(0.5, 0.1, 4)
  assert isinstance(aggregator, tff.aggregators.UnweightedAggregationFactory)
  assert isinstance(aggregator.tff_factory, tff.aggregators.DifferentiallyPrivateFactory)
  assert (aggregator.noise_multiplier, aggregator.clip_norm,
          aggregator.clients_per_round) == (0.5, 0.1, 4.0)
  theirs = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
      noise_multiplier=0.5, clients_per_round=4, clip=0.1)
  value = tff.TensorType(np.float32, [3])
  ours_process, their_process = aggregator.create(value), theirs.create(value)
  # (as strings: TFF's `==` already tells apart the types of two processes built
  # from the same `gaussian_fixed` arguments)
  for computation in ('initialize', 'next'):
    assert (str(getattr(ours_process, computation).type_signature) ==
            str(getattr(their_process, computation).type_signature))


@pytest.mark.parametrize('mode', ['vectorized', 'sequential'])
def test_dp_without_noise_equals_per_client(mode):
  clients = len(tc.SIZES)
  # Round 1's ‖Δ_i‖ are 0.21, 0.31, 0.41, 0.46 (measured): clip 0.3 clips three of four.
  aggregator = dp.dp_aggregator(0.0, 0.3, clients + 1)  # not the cohort size: TFF's denominator
  tc._compare('fedavg', 3, cohort.CohortExecution(mode=mode), model_aggregator=aggregator)


def test_dp_through_tff_executor_keeps_the_dp_state():
  aggregator = dp.dp_aggregator(0.0, 0.1, len(tc.SIZES))
  tc._compare('fedadam', 2, cohort.CohortExecution(in_process=False, num_shards=2), rounds=2,
              model_aggregator=aggregator)


def _wide_model_fn(hidden=600):
  keras_model = tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(tc.D,)),
      tf.keras.layers.Dense(hidden, activation='tanh'), tf.keras.layers.Dense(tc.C)])
  return tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=tc._SPEC)


@pytest.mark.parametrize('execution', ['per_client', 'cohort'])
def test_dp_noise_has_tffs_distribution(execution):
  # Client learning rate 0: every Δ_i is 0, so x_{t+1} − x_t is the noise on the
  # mean (server SGD step 1): N(0, (σC / clients_per_round)²) per coordinate.
  noise, clip, per_round = 2.0, 0.3, 3
  process = fedopt.build_fedavg(
      _wide_model_fn, tff.learning.optimizers.build_sgdm(0.0), local_steps=1,
      model_aggregator=dp.dp_aggregator(noise, clip, per_round), execution=execution)
  datasets = tc.client_datasets()
  state = process.initialize()
  before = np.concatenate([np.ravel(w) for w in process.get_model_weights(state).trainable])
  data = tc._shards(process, datasets, 1) if execution == 'cohort' else datasets
  state = process.next(state, data).state
  after = np.concatenate([np.ravel(w) for w in process.get_model_weights(state).trainable])
  sample = after - before
  assert sample.size > 4000  # std estimated within ~1.1% (one standard error)
  want = noise * clip / per_round
  assert abs(np.std(sample) / want - 1.0) < 0.05
  assert abs(np.mean(sample)) < 5 * want / np.sqrt(sample.size)


# In sequence: the XLA-compiled shard program below (the same program, compiled).
@pytest.mark.parametrize('name,mode', [('fedavg', 'vectorized'), ('mfl', 'vectorized')])
def test_compression_equals_per_client(name, mode):
  # MFL uploads Adam's Δm, Δv: sparsified at Δω's indices (CE-FedAvg).
  factory = compression.SharedIndexCompressionFactory(0.5, quantize=True)
  tc._compare(name, 3, cohort.CohortExecution(mode=mode), upload_compression=factory)


def test_pfor_fallbacks_are_said_in_one_line():
  # CE-FedAvg's encoder (TopKV2, ScatterNd) has no vectorising converter.
  records = []
  handler = logging.Handler()
  handler.emit = records.append
  logger = logging.getLogger('tensorflow')
  logger.addHandler(handler)
  try:
    fedopt.build_fedavg(tc.model_fn, tff.learning.optimizers.build_sgdm(0.1), local_steps=2,
                        upload_compression=compression.SharedIndexCompressionFactory(0.5),
                        execution=cohort.CohortExecution(mode='vectorized'))
  finally:
    logger.removeHandler(handler)
  messages = [r.getMessage() for r in records]
  assert not [m for m in messages if m.startswith('Using a while_loop for converting')]
  said = [m for m in messages if m.startswith('cohort: tf.vectorized_map runs')]
  assert len(said) == 1 and 'TopKV2' in said[0], messages


def test_compression_through_tff_executor_measures_the_same_bits():
  # (the TFF computation's own server step and measurements, not the in-process ones)
  factory = compression.SharedIndexCompressionFactory(0.5, quantize=True)
  tc._compare('mfl', 2, cohort.CohortExecution(in_process=False, num_shards=2), rounds=2,
              upload_compression=factory)


def test_compression_encodes_each_client_as_the_per_client_computation_bit_for_bit():
  # Same Δ, extra in: the cohort's per-client encoding (under vectorized_map)
  # decodes to the very bits the factory's TFF computation does.
  rng = np.random.default_rng(0)
  shapes = [(6, 5), (5,), (5, 3)]
  clients = [collections.OrderedDict(
      delta=[rng.normal(size=s).astype(np.float32) for s in shapes],
      extra=collections.OrderedDict(
          m=[rng.normal(size=s).astype(np.float32) for s in shapes],
          v=[rng.exponential(size=s).astype(np.float32) for s in shapes],
          step=np.float32(3.0))) for _ in range(3)]
  factory = compression.SharedIndexCompressionFactory(0.6, quantize=True)
  value_type = tff.types.tensorflow_to_type(tf.nest.map_structure(
      lambda t: tf.TensorSpec(t.shape, tf.float32), clients[0]))
  per_client = tff.tensorflow.computation(factory.encoder(value_type), value_type)
  stacked = tf.nest.map_structure(lambda *t: np.stack(t), *clients)
  program = tf.function(lambda v: tf.vectorized_map(factory.encoder(value_type), v,
                                                    fallback_to_while_loop=True))
  decoded, bits = program(stacked)
  for i, value in enumerate(clients):
    want, want_bits = per_client(value)
    got = tf.nest.map_structure(lambda t: np.asarray(t)[i], decoded)
    assert float(bits[i]) == float(want_bits)
    for u, v in zip(tf.nest.flatten(want), tf.nest.flatten(got)):
      np.testing.assert_array_equal(np.asarray(v), np.asarray(u))


def test_other_aggregators_are_named_in_the_reason():
  robust = tff.learning.robust_aggregator(zeroing=True, clipping=True)
  reason = cohort_aggregation.supported(
      cohort.options_lib.RoundOptions(model_aggregator=robust))
  assert reason == f'the aggregator {type(robust).__name__} runs per client'


@pytest.mark.parametrize('aggregation', ['dp', 'compression'])
def test_aggregators_in_an_xla_compiled_shard_program(aggregation):
  kwargs = (dict(model_aggregator=dp.dp_aggregator(0.0, 0.3, len(tc.SIZES)))
            if aggregation == 'dp' else
            dict(upload_compression=compression.SharedIndexCompressionFactory(0.5, True)))
  tc._compare('mfl', 2, cohort.CohortExecution(mode='sequential', jit_compile='program'),
              rounds=2, **kwargs)


# bin/train's aggregation options in both executions, in-process (bin/train's
# own flag parsing and run): 4 clients of a Dirichlet split train epoch rounds,
# so the cohort's shards hold one or a few clients each.
OPTION_RUN = ['--task=digits', '--digits_model=mlp', '--num_clients=8', '--clients_per_round=4',
              '--client_batch_size=32', '--total_rounds=1', '--rounds_per_eval=1',
              '--measure_client_drift']
OPTIONS = {
    # No noise: the two executions' models can be compared.
    'dp': ['--algorithm=fedavg', '--dp', '--dp_clip_norm=0.5', '--dp_noise_multiplier=0'],
    'compression': ['--algorithm=fedavg', '--upload_compression=topk_uniq', '--sparsity=0.5'],
    'robust': ['--algorithm=fedavgm', '--aggregator=robust'],
}


@pytest.mark.parametrize('option', sorted(OPTIONS))
def test_bin_train_options_run_and_agree_in_both_executions(option, tmp_path, capsys):
  from workflow.training import cli  # pylint: disable=g-import-not-at-top
  rows = {}
  for execution in ('per_client', 'cohort'):
    settings, notes = cli.config_from_args([*OPTION_RUN, *OPTIONS[option],
                                            f'--execution={execution}', '--show_progress=true',
                                            f'--root_output_dir={tmp_path / execution}'])
    _, rows[execution] = cli.run_training(settings, notes)
    # The execution line (printed with progress): the option did not fall back to per client.
    line = next(l for l in capsys.readouterr().err.splitlines() if l.startswith('execution: '))
    assert line.startswith(f'execution: {execution}'), line
  compared = [k for k in rows['per_client'] if k.startswith(('eval/', 'train/client_work/',
                                                             'train/client_drift/'))]
  assert 'eval/loss' in compared and any('client_drift' in k for k in compared), compared
  for key in compared:
    np.testing.assert_allclose(rows['cohort'][key], rows['per_client'][key], rtol=1e-4,
                               atol=1e-5, err_msg=f'{option}: {key}')
