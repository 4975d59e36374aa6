"""The flag config turned into each library builder's arguments.

One function per `--algorithm` entry of workflow/algorithms.py: (task, config,
**round options) -> learning process. The round options (`measure_client_drift`,
`execution`: `composer.RoundOptions` fields) come from `algorithms.build`,
which has already refused every flag the entry says the algorithm lacks
(`AlgorithmEntry`), so these functions only translate.

`standard` is the entry of a library builder with the package's usual
signature; a new algorithm that has it needs no function here.
"""

from collections.abc import Callable
from typing import Any

from absl import logging
import tensorflow as tf
import tensorflow_federated as tff

from tasks import base as task_base
from tff_adaptive.accounting import flops
from tff_adaptive.accounting import privacy
from tff_adaptive.aggregators import compression
from tff_adaptive.algorithms import ce_fedavg
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
from tff_adaptive.optimizers import biased as biased_optimizers


class ConfigError(ValueError):
  """A flag value the chosen algorithm cannot use; the message names the flag."""


# (task, config, **round options) -> learning process.
Builder = Callable[..., tff.learning.templates.LearningProcess]

WEIGHTINGS = {'num_examples': tff.learning.ClientWeighting.NUM_EXAMPLES,
              'uniform': tff.learning.ClientWeighting.UNIFORM}
UPLOAD_COMPRESSIONS = ('none', 'topk', 'topk_uniq')
AGGREGATORS = ('mean', 'robust', 'secure')
# The seed's table (SPEC §2); the library's FedGBO/MFL also take an AdaGrad.
BIASED_FLAG_OPTIMIZERS = ('sgdm', 'rmsprop', 'adam')
MIME_OPTIMIZERS = ('sgd', 'sgdm', 'rmsprop', 'adam')


def uses_dp(cfg) -> bool:
  return bool(cfg.get('dp', False))


def _weighting(cfg):
  if uses_dp(cfg):
    return tff.learning.ClientWeighting.UNIFORM  # DP aggregation is unweighted
  name = cfg.get('client_weighting') or 'default'
  return None if name == 'default' else WEIGHTINGS[name]


def upload_compression(cfg):
  """Shared-index compression of Δ (and state uploads) per --upload_compression."""
  name = cfg.get('upload_compression') or 'none'
  if name == 'none':
    return None
  return compression.SharedIndexCompressionFactory(cfg.get('sparsity', 0.9),
                                                   quantize=name == 'topk_uniq')


def model_aggregator(cfg):
  """The aggregation factory of Δ: DP (--dp), --aggregator=robust|secure, or None (the mean).

  robust and secure are TFF's `tff.learning.robust_aggregator` and
  `secure_aggregator` with --aggregator_zeroing / --aggregator_clipping,
  weighted unless --client_weighting=uniform. Secure aggregation runs on
  TFF's test execution context (`needs_secure_context`).
  """
  name = cfg.get('aggregator') or 'mean'
  if uses_dp(cfg):
    return privacy.dp_aggregator(cfg.get('dp_noise_multiplier'), cfg.get('dp_clip_norm'),
                                 cfg['clients_per_round'])
  if name == 'mean':
    return None
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


def round_keywords(task, cfg, **options) -> dict[str, Any]:
  """The `RoundOptions` keywords of the flags, with the round options from `algorithms.build`."""
  return dict(client_weighting=_weighting(cfg), model_aggregator=model_aggregator(cfg),
              upload_compression=upload_compression(cfg),
              fb_flops_per_example=fb_flops_per_example(task), **options)


def server_optimizer(algorithm, cfg):
  name = cfg.get('server_optimizer') or fedopt.ALGORITHM_SERVER_OPTIMIZER.get(algorithm, 'sgd')
  return fedopt.build_server_optimizer(
      name, cfg.get('server_learning_rate', 1.0),
      semantics=cfg.get('server_optimizer_semantics', 'tff'),
      beta_1=cfg.get('server_beta_1', 0.9), beta_2=cfg.get('server_beta_2', 0.99),
      tau=cfg.get('server_epsilon', 1e-3))


def client_sgd(cfg):
  """The FedOpt-family clients: plain SGD with --client_learning_rate."""
  return tff.learning.optimizers.build_sgdm(cfg['client_learning_rate'])


def client_optimizer(cfg):
  """--client_optimizer (sgd, sgdm, rmsprop, adam) as TFF's optimiser (Mime's base optimiser)."""
  name, lr = cfg.get('client_optimizer', 'sgd'), cfg['client_learning_rate']
  beta_1, eps = cfg.get('client_beta_1', 0.9), cfg.get('client_epsilon', 1e-8)
  if name == 'sgd':
    return tff.learning.optimizers.build_sgdm(lr)
  if name == 'sgdm':
    return tff.learning.optimizers.build_sgdm(lr, momentum=beta_1)
  if name == 'rmsprop':
    return tff.learning.optimizers.build_rmsprop(lr, decay=beta_1, epsilon=eps)
  return tff.learning.optimizers.build_adam(lr, beta_1=beta_1,
                                            beta_2=cfg.get('client_beta_2', 0.99), epsilon=eps)


def biased_client_optimizer(cfg):
  """--client_optimizer of FedGBO/MFL as the TFF optimiser whose hyperparameters
  the builders read (β1 is SGDm's momentum and RMSProp's decay, SPEC §2)."""
  # Validates the values (`algorithms.build` names the flags in its messages).
  biased_optimizers.BiasedOptimizer(cfg['client_optimizer'], beta_1=cfg.get('client_beta_1', 0.9),
                                    beta_2=cfg.get('client_beta_2', 0.99),
                                    epsilon=cfg.get('client_epsilon', 1e-8))
  return client_optimizer(cfg)


def standard(build_fn: Callable[..., Any]) -> Builder:
  """The entry's build of a library builder with the package's usual signature.

  `build_fn(model_fn, client_optimizer_fn, server_optimizer_fn, *,
  local_steps, **RoundOptions keywords)`, e.g. `fedopt.build_fedopt`: the
  client optimiser from --client_optimizer, the server optimiser from the
  --server_* flags, the aggregation flags and the round options.
  """
  def build(task, cfg, **options):
    return build_fn(task.model_fn, client_optimizer(cfg),
                    server_optimizer(cfg.get('algorithm', ''), cfg),
                    local_steps=cfg.get('local_steps', 0), **round_keywords(task, cfg, **options))
  build.__doc__ = f'`{build_fn.__module__}.{build_fn.__name__}` of the flags.'
  return build


def fedopt_family(algorithm: str) -> Builder:
  def build(task, cfg, **options):
    implied = fedopt.ALGORITHM_SERVER_OPTIMIZER[algorithm]
    if cfg.get('server_optimizer') and cfg['server_optimizer'] != implied:
      raise ConfigError(f'--server_optimizer={cfg["server_optimizer"]} contradicts '
                        f'--algorithm={algorithm} (which uses {implied}); leave it unset')
    return fedopt.build_fedopt(
        task.model_fn, client_sgd(cfg), server_optimizer(algorithm, cfg),
        local_steps=cfg.get('local_steps', 0), algorithm=algorithm,
        **round_keywords(task, cfg, **options))
  return build


def build_fedgbo(task, cfg, **options):
  return fedgbo.build_fedgbo(
      task.model_fn, biased_client_optimizer(cfg), local_steps=cfg['local_steps'],
      upload=cfg.get('fedgbo_upload', 'model'), **round_keywords(task, cfg, **options))


def build_mfl(task, cfg, **options):
  keywords = round_keywords(task, cfg, **options)
  return mfl.build_mfl(
      task.model_fn, biased_client_optimizer(cfg), local_steps=cfg.get('local_steps', 0),
      bias_correction=cfg.get('mfl_bias_correction', False),
      upload_state_deltas=keywords['upload_compression'] is not None, **keywords)


def build_ce_fedavg(task, cfg, **options):
  if (cfg.get('upload_compression') or 'none') == 'none':
    raise ConfigError('--algorithm=ce_fedavg compresses its uploads: set --upload_compression='
                      'topk or topk_uniq (or use --algorithm=mfl --client_optimizer=adam)')
  beta_1, beta_2 = cfg.get('client_beta_1', 0.9), cfg.get('client_beta_2', 0.999)
  epsilon = cfg.get('client_epsilon', 1e-8)
  biased_optimizers.BiasedOptimizer('adam', beta_1=beta_1, beta_2=beta_2, epsilon=epsilon)
  return ce_fedavg.build_ce_fedavg(
      task.model_fn, tff.learning.optimizers.build_adam(
          cfg['client_learning_rate'], beta_1=beta_1, beta_2=beta_2, epsilon=epsilon),
      sparsity=cfg.get('sparsity', 0.9), quantize=cfg['upload_compression'] == 'topk_uniq',
      local_steps=cfg.get('local_steps', 0), client_weighting=_weighting(cfg),
      fb_flops_per_example=fb_flops_per_example(task), **options)


def build_mimelite(task, cfg, **options):
  del options  # TFF's template: per client, no drift measurement (the entry says so)
  return mimelite.build_mimelite(
      task.model_fn, client_optimizer(cfg), server_optimizer('mimelite', cfg),
      client_weighting=_weighting(cfg) or tff.learning.ClientWeighting.NUM_EXAMPLES,
      model_aggregator=model_aggregator(cfg), fb_flops_per_example=fb_flops_per_example(task))


def build_mimexlite(task, cfg, **options):
  return mimexlite.build_mimexlite(
      task.model_fn, client_optimizer(cfg), server_optimizer('mimexlite', cfg),
      local_steps=cfg['local_steps'], client_weighting=_weighting(cfg),
      model_aggregator=model_aggregator(cfg), fb_flops_per_example=fb_flops_per_example(task),
      **options)


def build_fedprox(task, cfg, **options):
  del options  # TFF's template: per client, no drift measurement (the entry says so)
  return fedprox.build_fedprox(
      task.model_fn, client_sgd(cfg), server_optimizer('fedprox', cfg),
      proximal_strength=cfg.get('fedprox_mu', 0.01),
      client_weighting=_weighting(cfg) or tff.learning.ClientWeighting.NUM_EXAMPLES,
      model_aggregator=model_aggregator(cfg), fb_flops_per_example=fb_flops_per_example(task))


def build_fedmax(task, cfg, **options):
  with tf.Graph().as_default():
    input_spec = task.model_fn().input_spec
  return fedmax.build_fedmax(
      task.keras_model_fn, input_spec, client_sgd(cfg), server_optimizer('fedmax', cfg),
      beta=cfg.get('fedmax_beta', 1.0), local_steps=cfg.get('local_steps', 0),
      **round_keywords(task, cfg, **options))


def build_fedada2(task, cfg, **options):
  client = fedada2.build_client_optimizer(
      cfg['client_optimizer'], cfg['client_learning_rate'], beta_1=cfg.get('client_beta_1', 0.9),
      beta_2=cfg.get('client_beta_2', 0.99), epsilon=cfg.get('client_epsilon', 1e-8),
      sm3_variant=cfg.get('sm3_variant', 'II'), delay=cfg.get('sm3_delay', 1),
      bias_correction=cfg.get('client_bias_correction', False))
  server = fedada2.build_server_optimizer(
      cfg.get('server_optimizer') or 'adam', cfg.get('server_learning_rate', 1.0),
      beta_1=cfg.get('server_beta_1', 0.9), beta_2=cfg.get('server_beta_2', 0.99),
      tau=cfg.get('server_epsilon', 1e-3))
  return fedada2.build_fedada2(
      task.model_fn, client, server, local_steps=cfg.get('local_steps', 0),
      preconditioner=cfg.get('preconditioner', 'none'), warmup=cfg.get('client_lr_warmup', False),
      **round_keywords(task, cfg, **options))


def _personalized_weighting(cfg):
  return _weighting(cfg) or tff.learning.ClientWeighting.NUM_EXAMPLES


def build_mtfl(task, cfg, **options):
  del options  # a personalised round: per client, no drift measurement (the entry says so)
  strategy = cfg.get('mtfl_strategy') or 'fedavg'
  implied = 'adam' if strategy == 'fedadam' else 'sgd'
  if cfg.get('server_optimizer') and cfg['server_optimizer'] != implied:
    raise ConfigError(f'--server_optimizer={cfg["server_optimizer"]} contradicts '
                      f'--mtfl_strategy={strategy} (which uses {implied}); leave it unset')
  client_opt = cfg.get('client_optimizer', 'sgd')
  if strategy != 'fedavg_adam' and client_opt != 'sgd':
    raise ConfigError(f'--client_optimizer={client_opt} contradicts --mtfl_strategy={strategy} '
                      '(SGD clients); --mtfl_strategy=fedavg_adam runs Adam clients')
  client = client_sgd(cfg)
  if strategy == 'fedavg_adam':
    client = biased_client_optimizer(dict(cfg, client_optimizer='adam'))
  return mtfl.build_mtfl(
      task.model_fn, task.keras_model_fn, client,
      server_optimizer('fedadam' if strategy == 'fedadam' else 'fedavg', cfg),
      private=cfg.get('private') or 'all', strategy=strategy,
      local_steps=cfg.get('local_steps', 0),
      bias_correction=cfg.get('mfl_bias_correction', False),
      client_weighting=_personalized_weighting(cfg),
      fb_flops_per_example=fb_flops_per_example(task))


def build_perfedavg(task, cfg, **options):
  del options  # a personalised round: per client, no drift measurement (the entry says so)
  return perfedavg.build_perfedavg(
      task.model_fn, client_sgd(cfg), server_optimizer('perfedavg', cfg),
      beta=cfg.get('perfedavg_beta', 0.001), local_steps=cfg.get('local_steps', 0),
      client_weighting=_personalized_weighting(cfg),
      fb_flops_per_example=fb_flops_per_example(task))


def build_pfedme(task, cfg, **options):
  del options  # a personalised round: per client, no drift measurement (the entry says so)
  return pfedme.build_pfedme(
      task.model_fn, client_sgd(cfg), lam=cfg.get('pfedme_lambda', 15.0),
      personal_learning_rate=cfg.get('pfedme_personal_learning_rate', 0.01),
      inner_steps=cfg.get('pfedme_inner_steps', 1), beta=cfg.get('pfedme_beta', 1.0),
      local_steps=cfg.get('local_steps', 0), client_weighting=_personalized_weighting(cfg),
      fb_flops_per_example=fb_flops_per_example(task))


def build_scaffold(task, cfg, **options):
  return scaffold.build_scaffold(
      task.model_fn, client_sgd(cfg), server_optimizer('scaffold', cfg),
      local_steps=cfg.get('local_steps', 0), total_clients=len(task.train_data.client_ids),
      client_weighting=_weighting(cfg), model_aggregator=model_aggregator(cfg),
      fb_flops_per_example=fb_flops_per_example(task), **options)
