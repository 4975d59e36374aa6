"""The learning process of the typed settings (`build`), and each algorithm's builder.

`build(task, settings)` builds the process of `settings.server.algorithm`:
its registry entry (workflow/flags/algorithms.py, which loads without TensorFlow)
names one function here, (task, settings, **round options) -> learning
process. The round options (`measure_client_drift`, `execution`:
`composer.RoundOptions` fields) come from `build`, which has already refused
every flag the entry says the algorithm lacks (`AlgorithmEntry`), so these
functions only translate settings into the library builder's arguments.

An entry may instead name a library builder with the package's usual
signature as 'package.module:function' (`standard`): a new algorithm that
has it needs no function here.
"""

import dataclasses
import importlib
import warnings
from collections.abc import Callable
from typing import Any, Optional

from absl import logging
import tensorflow as tf
import tensorflow_federated as tff

from tasks import base as task_base
from tasks import registry as task_registry
from tff_adaptive.accounting import flops
from tff_adaptive.aggregators import compression
from tff_adaptive.aggregators import dp
from tff_adaptive.aggregators import robust
from tff_adaptive.aggregators import secure
from tff_adaptive.algorithms import ce_fedavg
from tff_adaptive.algorithms import composer
from tff_adaptive.algorithms import fedada2
from tff_adaptive.algorithms import feddyn
from tff_adaptive.algorithms import fedgbo
from tff_adaptive.algorithms import fedmax
from tff_adaptive.algorithms import fedopt
from tff_adaptive.algorithms import fedprox
from tff_adaptive.algorithms import mfl
from tff_adaptive.algorithms import mimelite
from tff_adaptive.algorithms import mimexlite
from tff_adaptive.algorithms import mtfl
from tff_adaptive.algorithms import perfedavg
from tff_adaptive.algorithms import pfedme
from tff_adaptive.algorithms import scaffold
from tff_adaptive.execution import worker_process
from tff_adaptive.optimizers import biased as biased_optimizers
from tff_adaptive.optimizers import biased_tff
from tff_adaptive.rounds import cohort
from workflow.flags import algorithms
from workflow.flags import config
from workflow.flags import library_flags

# (task, settings, **round options) -> learning process.
Builder = Callable[..., tff.learning.templates.LearningProcess]

WEIGHTINGS = {'num_examples': tff.learning.ClientWeighting.NUM_EXAMPLES,
              'uniform': tff.learning.ClientWeighting.UNIFORM}



def _weighting(settings: config.Settings):
  if algorithms.uses_dp(settings):
    return tff.learning.ClientWeighting.UNIFORM  # DP aggregation is unweighted
  name = settings.client.client_weighting or 'default'
  return None if name == 'default' else WEIGHTINGS[name]


def upload_compression(settings: config.Settings):
  """Shared-index compression of Δ (and state uploads) per --upload_compression."""
  aggregation = settings.aggregation
  name = aggregation.upload_compression or 'none'
  if name == 'none':
    return None
  return compression.SharedIndexCompressionFactory(aggregation.sparsity,
                                                   quantize=name == 'topk_uniq')


def model_aggregator(settings: config.Settings):
  """The aggregation factory of Δ: DP (--dp), --aggregator=robust|secure, or None (the mean).

  Each is the package's aggregator (`tff_adaptive.aggregators`): robust and
  secure are TFF's `tff.learning.robust_aggregator` and `secure_aggregator`
  with --aggregator_zeroing / --aggregator_clipping, weighted unless
  --client_weighting=uniform. DP and robust also run in the cohort program;
  secure runs per client, on TFF's test execution context
  (`needs_secure_context`).
  """
  aggregation = settings.aggregation
  name = aggregation.aggregator or 'mean'
  if algorithms.uses_dp(settings):
    return dp.dp_aggregator(aggregation.dp_noise_multiplier, aggregation.dp_clip_norm,
                            settings.client.clients_per_round)
  if name == 'mean':
    return None
  kwargs = dict(zeroing=bool(aggregation.aggregator_zeroing),
                clipping=bool(aggregation.aggregator_clipping),
                weighted=(settings.client.client_weighting or 'default') != 'uniform')
  if name == 'robust':
    return robust.robust_aggregator(**kwargs)
  return secure.secure_aggregator(**kwargs)


def fb_flops_per_example(task: task_base.FederatedTask) -> float:
  """Forward+backward FLOPs per example of the task's Keras model (docs/algorithms.md#costs)."""
  try:
    return float(flops.model_counts(task.keras_model_fn()).fb_flops)
  except (NotImplementedError, ValueError) as e:
    logging.warning('FLOPs not counted for %s: %s', task.name, e)
    return 0.0


def round_keywords(task, settings: config.Settings, **options) -> dict[str, Any]:
  """The `RoundOptions` keywords of the settings, with the round options from `build`."""
  return dict(client_weighting=_weighting(settings), model_aggregator=model_aggregator(settings),
              upload_compression=upload_compression(settings),
              fb_flops_per_example=fb_flops_per_example(task), **options)


def server_optimizer(algorithm: str, settings: config.Settings):
  server = settings.server
  name = server.server_optimizer or fedopt.ALGORITHM_SERVER_OPTIMIZER.get(algorithm, 'sgd')
  return fedopt.build_server_optimizer(
      name, server.server_learning_rate, semantics=server.server_optimizer_semantics,
      beta_1=server.server_beta_1, beta_2=server.server_beta_2, tau=server.server_epsilon)


def client_sgd(client: config.ClientSettings):
  """The FedOpt-family clients: plain SGD with --client_learning_rate."""
  return tff.learning.optimizers.build_sgdm(client.client_learning_rate)


def client_optimizer(client: config.ClientSettings):
  """--client_optimizer (sgd, sgdm, rmsprop, adam) as TFF's optimiser (Mime's base optimiser)."""
  name, lr = client.client_optimizer, client.client_learning_rate
  beta_1, eps = client.client_beta_1, client.client_epsilon
  if name == 'sgd':
    return tff.learning.optimizers.build_sgdm(lr)
  if name == 'sgdm':
    return tff.learning.optimizers.build_sgdm(lr, momentum=beta_1)
  if name == 'rmsprop':
    return tff.learning.optimizers.build_rmsprop(lr, decay=beta_1, epsilon=eps)
  return tff.learning.optimizers.build_adam(lr, beta_1=beta_1, beta_2=client.client_beta_2,
                                            epsilon=eps)


def mime_base_optimizer(settings: config.Settings):
  """Mime's base optimiser: --client_optimizer, its RMSProp or Adam TFF's or, with
  --mime_statistics=paper, the FedGBO paper's (v from 1, no bias correction)."""
  client = settings.client
  if settings.algorithm.mime_statistics == 'paper' and client.client_optimizer == 'rmsprop':
    return biased_tff.build_paper_rmsprop(client.client_learning_rate, decay=client.client_beta_1,
                                          epsilon=client.client_epsilon)
  if settings.algorithm.mime_statistics == 'paper' and client.client_optimizer == 'adam':
    return biased_tff.build_paper_adam(client.client_learning_rate, beta_1=client.client_beta_1,
                                       beta_2=client.client_beta_2, epsilon=client.client_epsilon)
  return client_optimizer(client)


def biased_client_optimizer(client: config.ClientSettings):
  """--client_optimizer of FedGBO/MFL as the TFF optimiser whose hyperparameters
  the builders read (β1 is SGDm's momentum and RMSProp's decay, docs/algorithms.md#fedgbo)."""
  # Validates the values (`build` names the flags in its messages).
  biased_optimizers.BiasedOptimizer(client.client_optimizer, beta_1=client.client_beta_1,
                                    beta_2=client.client_beta_2, epsilon=client.client_epsilon)
  return client_optimizer(client)


def standard(build_fn: Callable[..., Any]) -> Builder:
  """The entry's build of a library builder with the package's usual signature.

  `build_fn(model_fn, client_optimizer_fn, server_optimizer_fn, *,
  local_steps, **RoundOptions keywords)`, e.g. `fedopt.build_fedopt`: the
  client optimiser from --client_optimizer, the server optimiser from the
  --server_* flags, the aggregation flags and the round options.
  """
  def build(task, settings: config.Settings, **options):
    return build_fn(task.model_fn, client_optimizer(settings.client),
                    server_optimizer(settings.server.algorithm, settings),
                    local_steps=settings.client.local_steps,
                    **round_keywords(task, settings, **options))
  build.__doc__ = f'`{build_fn.__module__}.{build_fn.__name__}` of the settings.'
  return build


def _refuse_server_optimizer(settings: config.Settings, implied: str, because: str) -> None:
  given = settings.server.server_optimizer
  if given and given != implied:
    raise algorithms.ConfigError(f'--server_optimizer={given} contradicts {because} (which '
                                 f'uses {implied}); leave it unset')


def build_fedopt(task, settings: config.Settings, **options):
  """FedAvg, FedAvgM, FedAdagrad, FedAdam, FedYogi: --algorithm names the server optimiser."""
  algorithm = settings.server.algorithm
  _refuse_server_optimizer(settings, fedopt.ALGORITHM_SERVER_OPTIMIZER[algorithm],
                           f'--algorithm={algorithm}')
  return fedopt.build_fedopt(
      task.model_fn, client_sgd(settings.client), server_optimizer(algorithm, settings),
      local_steps=settings.client.local_steps, algorithm=algorithm,
      **round_keywords(task, settings, **options))


def build_fedgbo(task, settings: config.Settings, **options):
  return fedgbo.build_fedgbo(
      task.model_fn, biased_client_optimizer(settings.client),
      local_steps=settings.client.local_steps, upload=settings.algorithm.fedgbo_upload,
      **round_keywords(task, settings, **options))


def build_mfl(task, settings: config.Settings, **options):
  keywords = round_keywords(task, settings, **options)
  return mfl.build_mfl(
      task.model_fn, biased_client_optimizer(settings.client),
      local_steps=settings.client.local_steps,
      bias_correction=settings.algorithm.mfl_bias_correction,
      upload_state_deltas=keywords['upload_compression'] is not None, **keywords)


def build_ce_fedavg(task, settings: config.Settings, **options):
  client, compression_name = settings.client, settings.aggregation.upload_compression or 'none'
  if compression_name == 'none':
    raise algorithms.ConfigError(
        '--algorithm=ce_fedavg compresses its uploads: set --upload_compression=topk or '
        'topk_uniq (or use --algorithm=mfl --client_optimizer=adam)')
  beta_1, beta_2, epsilon = client.client_beta_1, client.client_beta_2, client.client_epsilon
  biased_optimizers.BiasedOptimizer('adam', beta_1=beta_1, beta_2=beta_2, epsilon=epsilon)
  return ce_fedavg.build_ce_fedavg(
      task.model_fn, tff.learning.optimizers.build_adam(
          client.client_learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon),
      sparsity=settings.aggregation.sparsity, quantize=compression_name == 'topk_uniq',
      local_steps=client.local_steps, client_weighting=_weighting(settings),
      fb_flops_per_example=fb_flops_per_example(task), **options)


def build_mimelite(task, settings: config.Settings, **options):
  return mimelite.build_mimelite(
      task.model_fn, mime_base_optimizer(settings), server_optimizer('mimelite', settings),
      local_steps=settings.client.local_steps, **round_keywords(task, settings, **options))


def build_mimexlite(task, settings: config.Settings, **options):
  return mimexlite.build_mimexlite(
      task.model_fn, mime_base_optimizer(settings), server_optimizer('mimexlite', settings),
      local_steps=settings.client.local_steps, client_weighting=_weighting(settings),
      model_aggregator=model_aggregator(settings),
      fb_flops_per_example=fb_flops_per_example(task), **options)


def build_fedprox(task, settings: config.Settings, **options):
  return fedprox.build_fedprox(
      task.model_fn, client_sgd(settings.client), server_optimizer('fedprox', settings),
      proximal_strength=settings.algorithm.fedprox_mu, local_steps=settings.client.local_steps,
      **round_keywords(task, settings, **options))


def build_fedmax(task, settings: config.Settings, **options):
  with tf.Graph().as_default():
    input_spec = task.model_fn().input_spec
  return fedmax.build_fedmax(
      task.keras_model_fn, input_spec, client_sgd(settings.client),
      server_optimizer('fedmax', settings), beta=settings.algorithm.fedmax_beta,
      local_steps=settings.client.local_steps, **round_keywords(task, settings, **options))


def build_fedada2(task, settings: config.Settings, **options):
  client, server, algorithm = settings.client, settings.server, settings.algorithm
  client_opt = fedada2.build_client_optimizer(
      client.client_optimizer, client.client_learning_rate, beta_1=client.client_beta_1,
      beta_2=client.client_beta_2, epsilon=client.client_epsilon,
      sm3_variant=algorithm.sm3_variant, delay=algorithm.sm3_delay,
      bias_correction=algorithm.client_bias_correction)
  server_opt = fedada2.build_server_optimizer(
      server.server_optimizer or 'adam', server.server_learning_rate, beta_1=server.server_beta_1,
      beta_2=server.server_beta_2, tau=server.server_epsilon)
  return fedada2.build_fedada2(
      task.model_fn, client_opt, server_opt, local_steps=client.local_steps,
      preconditioner=algorithm.preconditioner, warmup=algorithm.client_lr_warmup,
      **round_keywords(task, settings, **options))


def _personalized_weighting(settings: config.Settings):
  return _weighting(settings) or tff.learning.ClientWeighting.NUM_EXAMPLES


def _mtfl_client(settings: config.Settings, strategy: str):
  client = settings.client
  if strategy != 'fedavg_adam' and client.client_optimizer != 'sgd':
    raise algorithms.ConfigError(
        f'--client_optimizer={client.client_optimizer} contradicts --mtfl_strategy={strategy} '
        '(SGD clients); --mtfl_strategy=fedavg_adam runs Adam clients')
  if strategy == 'fedavg_adam':
    return biased_client_optimizer(dataclasses.replace(client, client_optimizer='adam'))
  return client_sgd(client)


def build_mtfl(task, settings: config.Settings, *, execution, **options):
  # A round of the engine: `execution` applies (a model with fused batch norm
  # runs per client, and the library's warning says why); the entry refuses
  # drift measurement.
  del options
  strategy = settings.personalized.mtfl_strategy or 'fedavg'
  _refuse_server_optimizer(settings, 'adam' if strategy == 'fedadam' else 'sgd',
                           f'--mtfl_strategy={strategy}')
  client = _mtfl_client(settings, strategy)
  return mtfl.build_mtfl(
      task.model_fn, task.keras_model_fn, client,
      server_optimizer('fedadam' if strategy == 'fedadam' else 'fedavg', settings),
      private=settings.personalized.private or 'all', strategy=strategy,
      local_steps=settings.client.local_steps,
      bias_correction=settings.algorithm.mfl_bias_correction,
      client_weighting=_personalized_weighting(settings),
      fb_flops_per_example=fb_flops_per_example(task), execution=execution)


def build_perfedavg(task, settings: config.Settings, **options):
  # A round of the engine: `execution` applies (the entry refuses drift measurement).
  return perfedavg.build_perfedavg(
      task.model_fn, client_sgd(settings.client), server_optimizer('perfedavg', settings),
      beta=settings.personalized.perfedavg_beta, local_steps=settings.client.local_steps,
      client_weighting=_personalized_weighting(settings),
      fb_flops_per_example=fb_flops_per_example(task), **options)


def build_pfedme(task, settings: config.Settings, **options):
  # A round of the engine: `execution` applies (the entry refuses drift measurement).
  personalized = settings.personalized
  return pfedme.build_pfedme(
      task.model_fn, client_sgd(settings.client), lam=personalized.pfedme_lambda,
      personal_learning_rate=personalized.pfedme_personal_learning_rate,
      inner_steps=personalized.pfedme_inner_steps, beta=personalized.pfedme_beta,
      local_steps=settings.client.local_steps, client_weighting=_personalized_weighting(settings),
      fb_flops_per_example=fb_flops_per_example(task), **options)


def build_feddyn(task, settings: config.Settings, **options):
  return feddyn.build_feddyn(
      task.model_fn, client_sgd(settings.client), alpha=settings.algorithm.feddyn_alpha,
      local_steps=settings.client.local_steps, total_clients=len(task.train_data.client_ids),
      client_weighting=_weighting(settings), model_aggregator=model_aggregator(settings),
      fb_flops_per_example=fb_flops_per_example(task), **options)


def build_scaffold(task, settings: config.Settings, **options):
  return scaffold.build_scaffold(
      task.model_fn, client_sgd(settings.client), server_optimizer('scaffold', settings),
      local_steps=settings.client.local_steps, total_clients=len(task.train_data.client_ids),
      client_weighting=_weighting(settings), model_aggregator=model_aggregator(settings),
      fb_flops_per_example=fb_flops_per_example(task), **options)


# ---- building ----


def entry_builder(name: str) -> Builder:
  """The builder the registry entry of --algorithm=`name` names (`AlgorithmEntry.build`)."""
  named = algorithms.ALGORITHMS[name].build
  if callable(named):  # registered at run time by a script or a test
    return named
  module, _, function = named.rpartition(':')
  if module:  # a library builder with the package's usual signature
    return standard(getattr(importlib.import_module(module), function))
  return globals()[function]


def build(task: task_base.FederatedTask,
          settings: config.Settings) -> tff.learning.templates.LearningProcess:
  """The learning process of `settings.server.algorithm` (ConfigError naming a flag)."""
  return built(task, settings).process


def built(task: task_base.FederatedTask, settings: config.Settings) -> composer.Built:
  """`build`'s process with how its rounds run and why (`execution_line` words it).

  The round options (`measure_client_drift`, `execution`) go to the entry's
  build as keywords. `why_per_client` is the library's reason, or the
  settings' when they ask for per-client rounds.
  """
  algorithms.check(settings)
  execution, reason = _execution(settings)
  options = dict(measure_client_drift=bool(settings.diagnostics.measure_client_drift),
                 execution=execution)
  with warnings.catch_warnings():
    # Said once, by the line bin/train prints at start, from `why_per_client`.
    warnings.simplefilter('ignore', cohort.CohortDoesNotApply)
    # The library names its arguments; the settings name the flags.
    with library_flags.named_by_flags(settings, algorithms.ConfigError):
      result = composer.built_by(
          lambda: entry_builder(settings.server.algorithm)(task, settings, **options))
  if result.why_per_client is None and reason is not None:
    result = dataclasses.replace(result, why_per_client=reason)
  return result


def intra_op_threads(settings: config.Settings, recurrent: Optional[bool] = None) -> int:
  """--intra_op_threads for `runtime.set_intra_op_threads`, 0 resolved: one
  thread where the round runs a recurrent model's clients as lanes (a task of
  `tasks.registry.RECURRENT_TASKS`, or `recurrent`, in the local cohort with
  `auto`'s or vectorised clients and no XLA), else TensorFlow's default (0):
  one thread was measured faster there only (docs/performance.md)."""
  execution = settings.execution
  if execution.intra_op_threads:
    return execution.intra_op_threads
  if recurrent is None:
    recurrent = settings.task.task in task_registry.RECURRENT_TASKS
  lanes = (execution.execution == 'cohort' and execution.cohort_mode != 'sequential' and
           execution.cohort_jit_compile in ('auto', 'none') and not execution.workers)
  return int(recurrent and lanes)


# --cohort_jit_compile → CohortExecution.jit_compile.
_JIT = {'auto': 'auto', 'none': False, 'step': 'step', 'program': 'program'}


def _execution(settings: config.Settings):
  """(execution for the builders, why per client or None) from --execution and the setup."""
  name, execution = settings.server.algorithm, settings.execution
  if execution.execution == 'per_client':
    return 'per_client', '--execution=per_client'
  entry = algorithms.ALGORITHMS[name]
  if not entry.cohort:
    return 'per_client', f'--algorithm={name}: {entry.cohort.why}'
  if execution.data_on_workers and not execution.workers:
    return 'per_client', ("--data_on_workers without --workers: each client's dataset is built "
                          'from its id')
  options = dict(mode=execution.cohort_mode, jit_compile=_JIT[execution.cohort_jit_compile])
  if execution.workers:
    # One padded shard per worker, sent as the CLIENTS value: each worker returns
    # its shard's weighted sums, summed once (tests/test_cohort_workers.py);
    # with --data_on_workers the value is the shard's client ids and the worker
    # builds the shard (cli._build, tests/test_cohort_data_on_workers.py).
    options.update(in_process=False,
                   num_shards=len(worker_process.parse_addresses(execution.workers)))
  return cohort.CohortExecution(**options), None


def execution_line(result: composer.Built, shard_data_on_workers: bool = False) -> str:
  """The line bin/train prints at start: how rounds run, and why when not as a cohort."""
  process, reason = result.process, result.why_per_client
  if cohort.is_cohort(process):
    how = 'clients vectorised' if process.vectorized else 'clients in sequence'
    how += {False: '', 'step': ', XLA per client step', 'program': ', XLA over the program'}[
        process.jit_compile]
    if not process.execution.in_process:
      how += ', one shard per TFF worker'
      if shard_data_on_workers:
        how += ', its data built on the worker from client ids'
    return f'execution: cohort (one compiled program per round, {how})'
  return f'execution: per_client ({reason})' if reason else 'execution: per_client'
