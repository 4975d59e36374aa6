"""Algorithm names (`--algorithm`) → learning processes built from a config.

Each entry adapts the flat flag config to one builder's typed arguments; the
algorithm itself lives in its own module. Adding an algorithm = one module and
one entry here.
"""

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from typing import Any, Optional

from absl import logging
import tensorflow as tf
import tensorflow_federated as tff

from tasks import base as task_base
from workflow import algorithm_defaults as algorithm_defaults_table
from workflow import library_flags
from tff_adaptive.accounting import flops
from tff_adaptive.accounting import privacy
from tff_adaptive.aggregators import compression
from tff_adaptive.optimizers import biased as biased_optimizers
from tff_adaptive.algorithms import ce_fedavg
from tff_adaptive.algorithms import composer
from tff_adaptive.rounds import cohort
from tff_adaptive.algorithms import fedada2
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


class ConfigError(ValueError):
  """A flag value the chosen algorithm cannot use; the message names the flag."""


Builder = Callable[[task_base.FederatedTask, Mapping[str, Any]], tff.learning.templates.LearningProcess]


Defaults = Callable[[Mapping[str, Any]], Mapping[str, Any]]


@dataclasses.dataclass(frozen=True)
class AlgorithmEntry:
  """An algorithm of `--algorithm`.

  Attributes:
    build: (task, config) -> learning process.
    client_optimizers: the `--client_optimizer` values it takes.
    needs_local_steps: whether it needs `--local_steps` > 0.
    doc: one line for --help and the README table.
    defaults: config -> {flag: value}, the algorithm's paper defaults for
      flags that were not given (`apply_defaults`); with only `--algorithm`
      given, the algorithm runs with them.
  """
  build: Builder
  client_optimizers: tuple[str, ...] = ('sgd',)
  needs_local_steps: bool = False
  doc: str = ''
  defaults: Defaults = lambda cfg: {}


WEIGHTINGS = {'num_examples': tff.learning.ClientWeighting.NUM_EXAMPLES,
              'uniform': tff.learning.ClientWeighting.UNIFORM}


def _weighting(cfg):
  if uses_dp(cfg):
    return tff.learning.ClientWeighting.UNIFORM  # DP aggregation is unweighted
  name = cfg.get('client_weighting') or 'default'
  return None if name == 'default' else WEIGHTINGS[name]


def uses_dp(cfg) -> bool:
  return bool(cfg.get('dp', False))


UPLOAD_COMPRESSIONS = ('none', 'topk', 'topk_uniq')
# TFF-built processes aggregate inside TFF's own templates; their uploads are
# not reachable by our joint (Δ, state) compression.
NOT_COMPRESSIBLE = ('mimelite', 'mimexlite', 'fedprox')


def upload_compression(cfg):
  """Shared-index compression of Δ (and state uploads) per --upload_compression."""
  name = cfg.get('upload_compression') or 'none'
  if name == 'none':
    return None
  if name not in UPLOAD_COMPRESSIONS:
    raise ConfigError(f'--upload_compression must be one of {", ".join(UPLOAD_COMPRESSIONS)}; '
                      f'got {name!r}')
  if cfg['algorithm'] in NOT_COMPRESSIBLE:
    raise ConfigError(f'--upload_compression is not available for --algorithm={cfg["algorithm"]}'
                      f' (its upload is aggregated inside TFF\'s own builder)')
  if uses_dp(cfg):
    raise ConfigError('--upload_compression cannot be combined with --dp')
  return compression.SharedIndexCompressionFactory(cfg.get('sparsity', 0.9),
                                                   quantize=name == 'topk_uniq')


AGGREGATORS = ('mean', 'robust', 'secure')


def model_aggregator(cfg):
  """The aggregation factory of Δ: DP (--dp), --aggregator=robust|secure, or None (the mean).

  robust and secure are TFF's `tff.learning.robust_aggregator` and
  `secure_aggregator` with --aggregator_zeroing / --aggregator_clipping,
  weighted unless --client_weighting=uniform. Secure aggregation runs on
  TFF's test execution context (`needs_secure_context`).
  """
  name = cfg.get('aggregator') or 'mean'
  if name not in AGGREGATORS:
    raise ConfigError(f'--aggregator must be one of {", ".join(AGGREGATORS)}; got {name!r}')
  if uses_dp(cfg):
    if name != 'mean':
      raise ConfigError(f'--aggregator={name} cannot be combined with --dp (DP is its own '
                        'aggregator)')
    return privacy.dp_aggregator(cfg.get('dp_noise_multiplier'), cfg.get('dp_clip_norm'),
                                 cfg['clients_per_round'])
  if name == 'mean':
    return None
  if (cfg.get('upload_compression') or 'none') != 'none':
    raise ConfigError(f'--aggregator={name} cannot be combined with --upload_compression (the '
                      'compression is its own aggregator)')
  kwargs = dict(zeroing=bool(cfg.get('aggregator_zeroing', True)),
                clipping=bool(cfg.get('aggregator_clipping', True)),
                weighted=(cfg.get('client_weighting') or 'default') != 'uniform')
  if name == 'robust':
    return tff.learning.robust_aggregator(**kwargs)
  return tff.learning.secure_aggregator(**kwargs)


def needs_secure_context(cfg) -> bool:
  """Secure aggregation's intrinsics run on TFF's test C++ context, not the native one."""
  return (cfg.get('aggregator') or 'mean') == 'secure'


def fb_flops_per_example(task: task_base.FederatedTask) -> float:
  """Forward+backward FLOPs per example of the task's Keras model (SPEC §8)."""
  try:
    return float(flops.model_counts(task.keras_model_fn()).fb_flops)
  except (NotImplementedError, ValueError) as e:
    logging.warning('FLOPs not counted for %s: %s', task.name, e)
    return 0.0


def _server_optimizer(algorithm, cfg):
  name = cfg.get('server_optimizer') or fedopt.ALGORITHM_SERVER_OPTIMIZER.get(algorithm, 'sgd')
  return fedopt.build_server_optimizer(
      name, cfg.get('server_learning_rate', 1.0),
      semantics=cfg.get('server_optimizer_semantics', 'tff'),
      beta_1=cfg.get('server_beta_1', 0.9), beta_2=cfg.get('server_beta_2', 0.99),
      tau=cfg.get('server_epsilon', 1e-3))


def _client_sgd(cfg):
  """The FedOpt-family clients: plain SGD with --client_learning_rate."""
  return tff.learning.optimizers.build_sgdm(cfg['client_learning_rate'])


def _fedopt_family(algorithm: str) -> Builder:
  def build(task, cfg):
    implied = fedopt.ALGORITHM_SERVER_OPTIMIZER[algorithm]
    if cfg.get('server_optimizer') and cfg['server_optimizer'] != implied:
      raise ConfigError(f'--server_optimizer={cfg["server_optimizer"]} contradicts '
                        f'--algorithm={algorithm} (which uses {implied}); leave it unset')
    return fedopt.build_fedopt(
        task.model_fn, _client_sgd(cfg), _server_optimizer(algorithm, cfg),
        local_steps=cfg.get('local_steps', 0), client_weighting=_weighting(cfg),
        model_aggregator=model_aggregator(cfg), upload_compression=upload_compression(cfg),
        fb_flops_per_example=fb_flops_per_example(task), algorithm=algorithm)
  return build


# The seed's table (SPEC §2); the library's FedGBO/MFL also take an AdaGrad.
BIASED_FLAG_OPTIMIZERS = ('sgdm', 'rmsprop', 'adam')


def _biased_client_optimizer(cfg):
  """--client_optimizer of FedGBO/MFL as the TFF optimiser whose hyperparameters
  the builders read (β1 is SGDm's momentum and RMSProp's decay, SPEC §2)."""
  name, lr = cfg['client_optimizer'], cfg['client_learning_rate']
  beta_1, beta_2 = cfg.get('client_beta_1', 0.9), cfg.get('client_beta_2', 0.99)
  epsilon = cfg.get('client_epsilon', 1e-8)
  # Validates the values (`build` names the flags in its messages).
  biased_optimizers.BiasedOptimizer(name, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon)
  if name == 'sgdm':
    return tff.learning.optimizers.build_sgdm(lr, momentum=beta_1)
  if name == 'rmsprop':
    return tff.learning.optimizers.build_rmsprop(lr, decay=beta_1, epsilon=epsilon)
  return tff.learning.optimizers.build_adam(lr, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon)


def _build_fedgbo(task, cfg):
  return fedgbo.build_fedgbo(
      task.model_fn, _biased_client_optimizer(cfg), local_steps=cfg['local_steps'],
      upload=cfg.get('fedgbo_upload', 'model'), client_weighting=_weighting(cfg),
      model_aggregator=model_aggregator(cfg),
      upload_compression=upload_compression(cfg), fb_flops_per_example=fb_flops_per_example(task))


def _build_mfl(task, cfg):
  return mfl.build_mfl(
      task.model_fn, _biased_client_optimizer(cfg), local_steps=cfg.get('local_steps', 0),
      bias_correction=cfg.get('mfl_bias_correction', False),
      client_weighting=_weighting(cfg), model_aggregator=model_aggregator(cfg),
      upload_compression=upload_compression(cfg), upload_state_deltas=bool(upload_compression(cfg)),
      fb_flops_per_example=fb_flops_per_example(task))


def _build_ce_fedavg(task, cfg):
  if (cfg.get('upload_compression') or 'none') == 'none':
    raise ConfigError('--algorithm=ce_fedavg compresses its uploads: set --upload_compression='
                      'topk or topk_uniq (or use --algorithm=mfl --client_optimizer=adam)')
  if (cfg.get('aggregator') or 'mean') != 'mean':
    raise ConfigError(f'--aggregator={cfg["aggregator"]} is not available for '
                      '--algorithm=ce_fedavg (its compressed upload is its own aggregator)')
  beta_1, beta_2 = cfg.get('client_beta_1', 0.9), cfg.get('client_beta_2', 0.999)
  epsilon = cfg.get('client_epsilon', 1e-8)
  biased_optimizers.BiasedOptimizer('adam', beta_1=beta_1, beta_2=beta_2, epsilon=epsilon)
  return ce_fedavg.build_ce_fedavg(
      task.model_fn, tff.learning.optimizers.build_adam(
          cfg['client_learning_rate'], beta_1=beta_1, beta_2=beta_2, epsilon=epsilon),
      sparsity=cfg.get('sparsity', 0.9), quantize=cfg['upload_compression'] == 'topk_uniq',
      local_steps=cfg.get('local_steps', 0), client_weighting=_weighting(cfg),
      fb_flops_per_example=fb_flops_per_example(task))


MIME_OPTIMIZERS = ('sgd', 'sgdm', 'rmsprop', 'adam')


def _tff_base_optimizer(cfg):
  """Mime's base optimiser, as TFF's optimisers (TFF's Mime uses them)."""
  name, lr = cfg['client_optimizer'], cfg['client_learning_rate']
  beta_1, eps = cfg.get('client_beta_1', 0.9), cfg.get('client_epsilon', 1e-8)
  if name == 'sgd':
    return tff.learning.optimizers.build_sgdm(lr)
  if name == 'sgdm':
    return tff.learning.optimizers.build_sgdm(lr, momentum=beta_1)
  if name == 'rmsprop':
    return tff.learning.optimizers.build_rmsprop(lr, decay=beta_1, epsilon=eps)
  return tff.learning.optimizers.build_adam(lr, beta_1=beta_1,
                                            beta_2=cfg.get('client_beta_2', 0.99), epsilon=eps)


def _build_mimelite(task, cfg):
  return mimelite.build_mimelite(
      task.model_fn, _tff_base_optimizer(cfg), _server_optimizer('mimelite', cfg),
      client_weighting=_weighting(cfg) or tff.learning.ClientWeighting.NUM_EXAMPLES,
      model_aggregator=model_aggregator(cfg), fb_flops_per_example=fb_flops_per_example(task))


def _build_mimexlite(task, cfg):
  return mimexlite.build_mimexlite(
      task.model_fn, _tff_base_optimizer(cfg), _server_optimizer('mimexlite', cfg),
      local_steps=cfg['local_steps'], client_weighting=_weighting(cfg),
      model_aggregator=model_aggregator(cfg), fb_flops_per_example=fb_flops_per_example(task))


def _build_fedprox(task, cfg):
  return fedprox.build_fedprox(
      task.model_fn, _client_sgd(cfg), _server_optimizer('fedprox', cfg),
      proximal_strength=cfg.get('fedprox_mu', 0.01),
      client_weighting=_weighting(cfg) or tff.learning.ClientWeighting.NUM_EXAMPLES,
      model_aggregator=model_aggregator(cfg), fb_flops_per_example=fb_flops_per_example(task))


def _build_fedmax(task, cfg):
  with tf.Graph().as_default():
    input_spec = task.model_fn().input_spec
  return fedmax.build_fedmax(
      task.keras_model_fn, input_spec, _client_sgd(cfg), _server_optimizer('fedmax', cfg),
      beta=cfg.get('fedmax_beta', 1.0), local_steps=cfg.get('local_steps', 0),
      client_weighting=_weighting(cfg), model_aggregator=model_aggregator(cfg),
      upload_compression=upload_compression(cfg),
      fb_flops_per_example=fb_flops_per_example(task))


def _build_fedada2(task, cfg):
  server_name = cfg.get('server_optimizer') or 'adam'
  client = fedada2.build_client_optimizer(
      cfg['client_optimizer'], cfg['client_learning_rate'], beta_1=cfg.get('client_beta_1', 0.9),
      beta_2=cfg.get('client_beta_2', 0.99), epsilon=cfg.get('client_epsilon', 1e-8),
      sm3_variant=cfg.get('sm3_variant', 'II'), delay=cfg.get('sm3_delay', 1),
      bias_correction=cfg.get('client_bias_correction', False))
  server = fedada2.build_server_optimizer(
      server_name, cfg.get('server_learning_rate', 1.0), beta_1=cfg.get('server_beta_1', 0.9),
      beta_2=cfg.get('server_beta_2', 0.99), tau=cfg.get('server_epsilon', 1e-3))
  return fedada2.build_fedada2(
      task.model_fn, client, server, local_steps=cfg.get('local_steps', 0),
      preconditioner=cfg.get('preconditioner', 'none'), warmup=cfg.get('client_lr_warmup', False),
      client_weighting=_weighting(cfg), model_aggregator=model_aggregator(cfg),
      upload_compression=upload_compression(cfg),
      fb_flops_per_example=fb_flops_per_example(task))


def _personalized_checks(name, cfg):
  """Flags the personalised processes (their own round, not the composer's) lack."""
  for flag, unset in (('dp', False), ('upload_compression', 'none'),
                      ('measure_client_drift', False), ('aggregator', 'mean')):
    if (cfg.get(flag) or unset) != unset:
      raise ConfigError(f'--{flag} is not available for --algorithm={name} (personalised round '
                        'with private client state)')
  return _weighting(cfg) or tff.learning.ClientWeighting.NUM_EXAMPLES


def _build_mtfl(task, cfg):
  weighting = _personalized_checks('mtfl', cfg)
  strategy = cfg.get('mtfl_strategy') or 'fedavg'
  implied = 'adam' if strategy == 'fedadam' else 'sgd'
  if cfg.get('server_optimizer') and cfg['server_optimizer'] != implied:
    raise ConfigError(f'--server_optimizer={cfg["server_optimizer"]} contradicts '
                      f'--mtfl_strategy={strategy} (which uses {implied}); leave it unset')
  client_opt = cfg.get('client_optimizer', 'sgd')
  if strategy != 'fedavg_adam' and client_opt != 'sgd':
    raise ConfigError(f'--client_optimizer={client_opt} contradicts --mtfl_strategy={strategy} '
                      '(SGD clients); --mtfl_strategy=fedavg_adam runs Adam clients')
  client_optimizer = _client_sgd(cfg)
  if strategy == 'fedavg_adam':
    client_optimizer = _biased_client_optimizer(dict(cfg, client_optimizer='adam'))
  return mtfl.build_mtfl(
      task.model_fn, task.keras_model_fn, client_optimizer,
      _server_optimizer('fedadam' if strategy == 'fedadam' else 'fedavg', cfg),
      private=cfg.get('private') or 'all', strategy=strategy,
      local_steps=cfg.get('local_steps', 0),
      bias_correction=cfg.get('mfl_bias_correction', False), client_weighting=weighting,
      fb_flops_per_example=fb_flops_per_example(task))


def _build_perfedavg(task, cfg):
  weighting = _personalized_checks('perfedavg', cfg)
  return perfedavg.build_perfedavg(
      task.model_fn, _client_sgd(cfg), _server_optimizer('perfedavg', cfg),
      beta=cfg.get('perfedavg_beta', 0.001), local_steps=cfg.get('local_steps', 0),
      client_weighting=weighting,
      fb_flops_per_example=fb_flops_per_example(task))


def _build_pfedme(task, cfg):
  weighting = _personalized_checks('pfedme', cfg)
  return pfedme.build_pfedme(
      task.model_fn, _client_sgd(cfg), lam=cfg.get('pfedme_lambda', 15.0),
      personal_learning_rate=cfg.get('pfedme_personal_learning_rate', 0.01),
      inner_steps=cfg.get('pfedme_inner_steps', 1), beta=cfg.get('pfedme_beta', 1.0),
      local_steps=cfg.get('local_steps', 0), client_weighting=weighting,
      fb_flops_per_example=fb_flops_per_example(task))


def _build_scaffold(task, cfg):
  if (cfg.get('upload_compression') or 'none') != 'none':
    raise ConfigError('--upload_compression is not available for --algorithm=scaffold (its '
                      'control-variate upload is summed, not compressed)')
  return scaffold.build_scaffold(
      task.model_fn, _client_sgd(cfg), _server_optimizer('scaffold', cfg),
      local_steps=cfg.get('local_steps', 0), total_clients=len(task.train_data.client_ids),
      client_weighting=_weighting(cfg), model_aggregator=model_aggregator(cfg),
      fb_flops_per_example=fb_flops_per_example(task))


ALGORITHMS: dict[str, AlgorithmEntry] = {
    **{name: AlgorithmEntry(_fedopt_family(name), doc=f'FedOpt, server {opt} (seed 003)',
                            defaults=algorithm_defaults_table.DEFAULTS[name])
       for name, opt in fedopt.ALGORITHM_SERVER_OPTIMIZER.items()},
    'fedgbo': AlgorithmEntry(_build_fedgbo, BIASED_FLAG_OPTIMIZERS, needs_local_steps=True,
                             doc='global biased optimiser, fixed on clients (seed 000)',
                             defaults=algorithm_defaults_table.DEFAULTS['fedgbo']),
    'mfl': AlgorithmEntry(_build_mfl, BIASED_FLAG_OPTIMIZERS,
                          doc='locally moving optimiser state, averaged (seed 000)',
                          defaults=algorithm_defaults_table.DEFAULTS['mfl']),
    'mimelite': AlgorithmEntry(_build_mimelite, MIME_OPTIMIZERS, doc="TFF's Mimelite"),
    'mimexlite': AlgorithmEntry(_build_mimexlite, MIME_OPTIMIZERS, needs_local_steps=True,
                                doc='Mimelite with a one-minibatch gradient (seed 000)',
                                defaults=algorithm_defaults_table.DEFAULTS['mimexlite']),
    'fedprox': AlgorithmEntry(_build_fedprox, doc="TFF's FedProx"),
    'fedmax': AlgorithmEntry(_build_fedmax, doc='max-entropy activation penalty'),
    'ce_fedavg': AlgorithmEntry(_build_ce_fedavg, ('adam',),
                                doc='MFL-Adam with compressed uploads (thesis ch. 3)',
                                defaults=algorithm_defaults_table.DEFAULTS['ce_fedavg']),
    'fedada2': AlgorithmEntry(_build_fedada2, fedada2.CLIENT_OPTIMIZERS,
                              doc='joint client+server adaptivity, SM3 clients (seed 002)',
                              defaults=algorithm_defaults_table.DEFAULTS['fedada2']),
    'mtfl': AlgorithmEntry(_build_mtfl, ('sgd', 'adam'),
                           doc='private batch-norm patches, per-client state (thesis ch. 4)',
                           defaults=algorithm_defaults_table.DEFAULTS['mtfl']),
    'perfedavg': AlgorithmEntry(_build_perfedavg, doc='Per-FedAvg, first order (thesis ch. 4)'),
    'pfedme': AlgorithmEntry(_build_pfedme, doc='pFedMe, Moreau envelopes (thesis ch. 4)'),
    'scaffold': AlgorithmEntry(_build_scaffold,
                               doc='control variates c, c_i kept by clients (seed 003 baseline)',
                               defaults=algorithm_defaults_table.DEFAULTS['scaffold']),
}


algorithm_defaults = algorithm_defaults_table.algorithm_defaults
MTFL_MODELS = algorithm_defaults_table.MTFL_MODELS


def apply_defaults(cfg: Mapping[str, Any], explicit) -> tuple[dict[str, Any], list[str]]:
  """`cfg` with the algorithm's defaults for the flags not in `explicit`.

  Returns (config, the applied defaults as `--flag=value` strings). Explicit
  flags (the command line, a preset) always win; a default that equals the
  value already set is not reported.
  """
  out = dict(cfg)
  applied = []
  for flag, value in algorithm_defaults(cfg).items():
    if flag in explicit or out.get(flag) == value:
      continue
    out[flag] = value
    applied.append(f'--{flag}={value}')
  return out, applied


def documented_defaults(flag: str) -> dict[str, str]:
  """{algorithm: its default of `flag`} for --help (conditions spelled out)."""
  out = {}
  for name in ALGORITHMS:
    plain = algorithm_defaults({'algorithm': name, 'task': 'digits'})
    if flag not in plain:
      continue
    text = str(plain[flag])
    if name == 'fedada2' and flag == 'client_optimizer':
      text += ' (adam with --preconditioner=dja)'
    if name == 'mtfl' and flag in ('digits_model', 'mnist_model', 'cifar10_model'):
      continue
    out[name] = text
  if flag in ('digits_model', 'mnist_model', 'cifar10_model'):
    out['mtfl'] = dict(MTFL_MODELS.values())[flag]
  if flag == 'client_optimizer':
    out['mtfl'] = 'adam with --mtfl_strategy=fedavg_adam'
  return out


# Built by TFF's own templates, not the composer: no client-drift measurement.
NO_CLIENT_DRIFT = ('mimelite', 'fedprox')


def build(name: str, task: task_base.FederatedTask,
          cfg: Mapping[str, Any]) -> tff.learning.templates.LearningProcess:
  if name not in ALGORITHMS:
    raise ConfigError(f'--algorithm must be one of {", ".join(sorted(ALGORITHMS))}; got {name!r}')
  entry = ALGORITHMS[name]
  client_opt = cfg.get('client_optimizer', 'sgd')
  if client_opt not in entry.client_optimizers:
    raise ConfigError(f'--client_optimizer={client_opt} is not supported by --algorithm={name}; '
                      f'it takes {", ".join(entry.client_optimizers)}')
  if entry.needs_local_steps and not cfg.get('local_steps'):
    raise ConfigError(f'--algorithm={name} needs exactly K local steps: set --local_steps')
  measure_drift = bool(cfg.get('measure_client_drift', False))
  if measure_drift and name in NO_CLIENT_DRIFT:
    raise ConfigError(f'--measure_client_drift is not available for --algorithm={name} (built by '
                      f"TFF's own template); use an algorithm of the round composer")
  execution, reason = _execution(name, cfg)
  # The composer reads these defaults from its context: every composer-built
  # algorithm gets the flags without an argument in each builder.
  with warnings.catch_warnings(record=True) as caught, composer.round_option_defaults(
      measure_client_drift=measure_drift, execution=execution):
    warnings.simplefilter('always')
    # The library names its arguments; the task's name picks the model flag to suggest.
    with library_flags.named_by_flags({'task': getattr(task, 'name', None), **cfg}, ConfigError):
      process = entry.build(task, cfg)
  for warning in caught:
    text = str(warning.message)
    if 'the cohort execution does not apply' in text:
      reason = text.split('does not apply (', 1)[1].rsplit(')', 1)[0]
    else:
      warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
  # program.run prints it when the rounds start (after every check that
  # may still refuse the command in one line).
  process.execution_line = execution_line(process, reason)
  return process


# Processes of their own round (personalised) or of TFF's templates.
PER_CLIENT_ONLY = {'mtfl': 'a personalised round', 'perfedavg': 'a personalised round',
                   'pfedme': 'a personalised round', 'mimelite': "built by TFF's template",
                   'fedprox': "built by TFF's template"}


def _execution(name: str, cfg: Mapping[str, Any]):
  """(execution for the builders, why per client or None) from --execution and the setup."""
  # bin/train's flag defaults to cohort; a config without it (a library
  # caller's dict that passes datasets to `process.next`) keeps per client.
  if cfg.get('execution', 'per_client') == 'per_client':
    return 'per_client', '--execution=per_client'
  if name in PER_CLIENT_ONLY:
    return 'per_client', f'--algorithm={name}: {PER_CLIENT_ONLY[name]}'
  if cfg.get('workers') or cfg.get('data_on_workers'):
    return 'per_client', '--workers/--data_on_workers: TFF workers run each client as a call'
  return cohort.CohortExecution(mode=cfg.get('cohort_mode', 'auto'),
                                jit_compile=bool(cfg.get('cohort_jit_compile'))), None


def execution_line(process, reason: Optional[str]) -> str:
  """The line bin/train prints at start: how rounds run, and why when not as a cohort."""
  if isinstance(process, cohort.CohortProcess):
    how = 'clients vectorised' if process.vectorized else 'clients in sequence'
    return f'execution: cohort (one compiled program per round, {how})'
  return f'execution: per_client ({reason})' if reason else 'execution: per_client'
