"""Algorithm names (`--algorithm`) → what each supports; loads without TensorFlow.

`ALGORITHMS` is the one place that says what an algorithm supports: its
client optimisers, whether it needs K, takes the aggregation flags, compresses
its uploads, is personalised, keeps client state, measures client drift, runs
as a cohort, and its defaults. Validation (`check`), bin/train's --help
(`having`) and the README's table (workflow/flags/algorithm_table.py) are derived
from the entries. The algorithm itself lives in its own module of
tff_adaptive/algorithms/; each entry names the function of
workflow/training/algorithm_builders.py that turns the typed settings
(`workflow.flags.config.Settings`) into its builder's arguments, and
`algorithm_builders.build` builds the process. Adding an algorithm = its
module, its function there and one entry here, its defaults included.

Nothing here imports TensorFlow or TFF: bin/train checks every flag against
these entries before it loads them, so a refused command answers at once.
"""

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, Union

from tff_adaptive.algorithms import names as library_names
from workflow.flags import config


class ConfigError(ValueError):
  """A flag value the chosen algorithm cannot use; the message names the flag."""


# settings -> {flag: value}: the algorithm's defaults, given the other flags.
Defaults = Callable[[config.Settings], Mapping[str, Any]]
UPLOAD_COMPRESSIONS = ('none', 'topk', 'topk_uniq')
AGGREGATORS = ('mean', 'robust', 'secure')
# FedGBO's and MFL's client optimisers as flags (the FedGBO paper's table;
# the library's FedGBO/MFL also take an AdaGrad).
BIASED_FLAG_OPTIMIZERS = ('sgdm', 'rmsprop', 'adam')
MIME_OPTIMIZERS = ('sgd', 'sgdm', 'rmsprop', 'adam')


def uses_dp(settings: config.Settings) -> bool:
  return bool(settings.aggregation.dp)


def needs_secure_context(settings: config.Settings) -> bool:
  """Secure aggregation's intrinsics run on TFF's test C++ context, not the native one."""
  return (settings.aggregation.aggregator or 'mean') == 'secure'


@dataclasses.dataclass(frozen=True)
class No:
  """A feature an algorithm lacks, and why (one line, shown in the error that refuses it)."""
  why: str

  def __bool__(self):
    return False


Feature = Union[bool, No]
_PERSONALISED = 'personalised round with private client state'


def _no_defaults(settings):
  del settings
  return {}


def _fixed(**flags) -> Defaults:
  """Defaults that do not depend on the other flags."""
  return lambda settings: dict(flags)


@dataclasses.dataclass(frozen=True)
class AlgorithmEntry:
  """An algorithm of `--algorithm`: how to build it and what it supports.

  Attributes:
    build: the name of its function in workflow/training/algorithm_builders.py,
      (task, settings, **round options) -> learning process (the round
      options are `composer.RoundOptions`' `measure_client_drift` and
      `execution`); or 'package.module:function', a library builder with the
      package's usual signature (`algorithm_builders.standard`); or such a
      callable itself, for an entry a script registers at run time.
    doc: one line for --help and the README table.
    client_optimizers: the `--client_optimizer` values it takes.
    needs_local_steps: whether it needs `--local_steps` > 0.
    server_optimizer: which --server_* flags it reads: 'fedopt' (all of them,
      `fedopt.build_server_optimizer`), 'fedada2' (all but
      --server_optimizer_semantics) or '' (none).
    aggregator: takes --aggregator and --dp (else `No(why)`).
    compressible: takes --upload_compression (else `No(why)`).
    measures_client_drift: takes --measure_client_drift (else `No(why)`).
    cohort: runs as one compiled program per round under --execution=cohort
      (else `No(why)`: it always runs per client).
    personalized: a personalised round (private client state, user accuracy).
    keeps_client_state: its clients keep state between rounds (a store,
      --client_state_dir).
    defaults: settings -> {flag: value}, the algorithm's paper defaults for
      flags that were not given (`apply_defaults`); with only `--algorithm`
      given, the algorithm runs with them. The paper's setting where its
      paper fixes one (optimiser kind, K, the upload compression, a
      batch-norm model for MTFL); where a paper only tunes a value per task
      (learning rates), a value chosen here, marked "chosen", with where it
      comes from. Explicit flags always win.
  """
  build: Union[str, Callable[..., Any]]
  doc: str = ''
  client_optimizers: tuple[str, ...] = ('sgd',)
  needs_local_steps: bool = False
  server_optimizer: str = 'fedopt'
  aggregator: Feature = True
  compressible: Feature = True
  measures_client_drift: Feature = True
  cohort: Feature = True
  personalized: bool = False
  keeps_client_state: bool = False
  defaults: Defaults = _no_defaults


def _personalised(build, doc, **fields) -> AlgorithmEntry:
  return AlgorithmEntry(build, doc, personalized=True, keeps_client_state=True,
                        aggregator=No(_PERSONALISED), compressible=No(_PERSONALISED),
                        measures_client_drift=No(_PERSONALISED), **fields)


_MIME_UPLOAD = 'its gradient upload besides Δ is averaged uncompressed'


# chosen: Reddi et al. 2021 tune η_s per task (FedAdam/FedYogi/FedAdagrad need one far
# below FedAvg's 1, τ = 1e-3); 0.01 is the demo's value on digits.
_ADAPTIVE_SERVER = _fixed(server_learning_rate=0.01)
# MTFL keeps a batch-norm patch private (thesis ch. 4): per task, the model flag and a model with
# batch normalisation (the MTFL defaults, and the hint of workflow/flags/library_flags.py).
MTFL_MODELS = {'digits': ('digits_model', 'cnn_bn'), 'mnist': ('mnist_model', 'mtfl_2nn'),
               'cifar10': ('cifar10_model', 'mtfl_cnn')}


def _fedada2_defaults(settings: config.Settings) -> dict[str, Any]:
  """The FedAda2 paper: SM3-Adam clients, Adam server, K = 10 (dense Adam clients with
  --preconditioner=dja, which SM3 cannot start from)."""
  dense = settings.algorithm.preconditioner == 'dja'
  # chosen: the learning rates selected on digits in reports/fedada2.md (the FedAda2
  # paper tunes them per task).
  return {'client_optimizer': 'adam' if dense else 'sm3_adam', 'local_steps': 10,
          'client_learning_rate': 0.01, 'server_learning_rate': 0.03}


def _mtfl_defaults(settings: config.Settings) -> dict[str, Any]:
  flag, model = MTFL_MODELS.get(settings.task.task, (None, None))
  out = {flag: model} if flag else {}
  if settings.personalized.mtfl_strategy == 'fedavg_adam':
    out['client_optimizer'] = 'adam'
  return out


# The FedGBO paper (FedGBO, MFL, MimeXlite) runs Adam clients with K = 10; thesis ch. 3
# (CE-FedAvg) top-k + 8-bit quantised uploads of Adam clients.
ALGORITHMS: dict[str, AlgorithmEntry] = {
    **{name: AlgorithmEntry('build_fedopt', f'FedOpt, server {opt} (Reddi et al. 2021)',
                            defaults=(_ADAPTIVE_SERVER
                                      if opt in library_names.FEDOPT_ADAPTIVE_SERVER_OPTIMIZERS
                                      else _no_defaults))
       for name, opt in library_names.FEDOPT_ALGORITHM_SERVER_OPTIMIZER.items()},
    'fedgbo': AlgorithmEntry('build_fedgbo',
                             'global biased optimiser, fixed on clients (FedGBO paper)',
                             BIASED_FLAG_OPTIMIZERS, needs_local_steps=True,
                             server_optimizer='',
                             defaults=_fixed(client_optimizer='adam', local_steps=10)),
    'mfl': AlgorithmEntry('build_mfl', 'locally moving optimiser state, averaged (FedGBO paper)',
                          BIASED_FLAG_OPTIMIZERS, server_optimizer='',
                          defaults=_fixed(client_optimizer='adam')),
    'mimelite': AlgorithmEntry('build_mimelite',
                               'Mime with fixed optimiser state, full gradient (Karimireddy et '
                               'al. 2021)', MIME_OPTIMIZERS, compressible=No(_MIME_UPLOAD)),
    'mimexlite': AlgorithmEntry('build_mimexlite',
                                'Mimelite with a one-minibatch gradient (FedGBO paper)',
                                MIME_OPTIMIZERS, needs_local_steps=True,
                                compressible=No(_MIME_UPLOAD),
                                defaults=_fixed(local_steps=10)),
    'fedprox': AlgorithmEntry('build_fedprox', 'proximal term μ/2‖y − x_t‖² (Li et al. 2020)'),
    'fedmax': AlgorithmEntry('build_fedmax', 'max-entropy activation penalty'),
    'ce_fedavg': AlgorithmEntry('build_ce_fedavg',
                                'MFL-Adam with compressed uploads (thesis ch. 3)', ('adam',),
                                server_optimizer='',
                                aggregator=No('its compressed upload is its own aggregator'),
                                defaults=_fixed(client_optimizer='adam',
                                                upload_compression='topk_uniq')),
    'fedada2': AlgorithmEntry('build_fedada2',
                              'joint client+server adaptivity, SM3 clients (FedAda2)',
                              library_names.FEDADA2_CLIENT_OPTIMIZERS, server_optimizer='fedada2',
                              defaults=_fedada2_defaults),
    'mtfl': _personalised('build_mtfl',
                          'private batch-norm patches, per-client state (thesis ch. 4)',
                          client_optimizers=('sgd', 'adam'), defaults=_mtfl_defaults),
    'perfedavg': _personalised('build_perfedavg',
                               'Per-FedAvg, first order (thesis ch. 4)'),
    'pfedme': _personalised('build_pfedme', 'pFedMe, Moreau envelopes (thesis ch. 4)',
                            server_optimizer=''),
    # The paper's server step (no server learning rate) and unweighted mean; α its
    # --feddyn_alpha default.
    'feddyn': AlgorithmEntry('build_feddyn',
                             'dynamic regularisation, λ_k kept by clients (Acar et al. 2021)',
                             server_optimizer='', keeps_client_state=True,
                             compressible=No('its count of participants is summed, not '
                                             'compressed')),
    # The paper's server step (SGD, η_g = 1: --server_learning_rate's default)
    # and unweighted means (the builder's default weighting): no defaults.
    'scaffold': AlgorithmEntry('build_scaffold',
                               'control variates c, c_i kept by clients (Karimireddy et al. 2020)',
                               keeps_client_state=True,
                               compressible=No('its control-variate upload is summed, not '
                                               'compressed')),
}


# ---- what the entries say, as lists (--help, messages) ----

FEATURES = {
    'client_optimizer': lambda e: e.client_optimizers != ('sgd',),
    'server_optimizer': lambda e: bool(e.server_optimizer),
    'server_optimizer_semantics': lambda e: e.server_optimizer == 'fedopt',
    'aggregator': lambda e: bool(e.aggregator),
    'compressible': lambda e: bool(e.compressible),
    'measures_client_drift': lambda e: bool(e.measures_client_drift),
    'personalized': lambda e: e.personalized,
    'keeps_client_state': lambda e: e.keeps_client_state,
}


def having(feature: str) -> tuple[str, ...]:
  """The algorithms whose entry has `feature` (a key of FEATURES), in registry order."""
  return tuple(name for name, entry in ALGORITHMS.items() if FEATURES[feature](entry))


def per_client_only() -> dict[str, str]:
  """{algorithm: why it runs per client} of the algorithms that never run as a cohort."""
  return {name: entry.cohort.why for name, entry in ALGORITHMS.items() if not entry.cohort}


# ---- validation: each check once, messages naming the flags ----


def _refuse(name: str, flag: str, feature: Feature) -> None:
  if not feature:
    raise ConfigError(f'--{flag} is not available for --algorithm={name} ({feature.why})')


def check_aggregation(settings: config.Settings) -> None:
  """--upload_compression, --dp and --aggregator against each other and the algorithm."""
  name, aggregation = settings.server.algorithm, settings.aggregation
  entry = ALGORITHMS[name]
  compression_name = aggregation.upload_compression or 'none'
  if compression_name != 'none':
    if compression_name not in UPLOAD_COMPRESSIONS:
      raise ConfigError(f'--upload_compression must be one of {", ".join(UPLOAD_COMPRESSIONS)}; '
                        f'got {compression_name!r}')
    _refuse(name, 'upload_compression', entry.compressible)
    if uses_dp(settings):
      raise ConfigError('--upload_compression cannot be combined with --dp')
  if uses_dp(settings):
    _refuse(name, 'dp', entry.aggregator)
  aggregator = aggregation.aggregator or 'mean'
  if aggregator not in AGGREGATORS:
    raise ConfigError(f'--aggregator must be one of {", ".join(AGGREGATORS)}; got {aggregator!r}')
  if aggregator != 'mean':
    _refuse(name, 'aggregator', entry.aggregator)
    if uses_dp(settings):
      raise ConfigError(f'--aggregator={aggregator} cannot be combined with --dp (DP is its own '
                        'aggregator)')
    if compression_name != 'none':
      raise ConfigError(f'--aggregator={aggregator} cannot be combined with --upload_compression '
                        '(the compression is its own aggregator)')


def check_known(name: str) -> None:
  if name not in ALGORITHMS:
    raise ConfigError(f'--algorithm must be one of {", ".join(sorted(ALGORITHMS))}; got {name!r}')


def check_algorithm(settings: config.Settings) -> None:
  """The algorithm is known and takes --client_optimizer, --local_steps, --measure_client_drift."""
  name = settings.server.algorithm
  check_known(name)
  entry = ALGORITHMS[name]
  client_opt = settings.client.client_optimizer
  if client_opt not in entry.client_optimizers:
    raise ConfigError(f'--client_optimizer={client_opt} is not supported by --algorithm={name}; '
                      f'it takes {", ".join(entry.client_optimizers)}')
  if entry.needs_local_steps and not settings.client.local_steps:
    raise ConfigError(f'--algorithm={name} needs exactly K local steps: set --local_steps')
  if settings.diagnostics.measure_client_drift:
    _refuse(name, 'measure_client_drift', entry.measures_client_drift)


def check(settings: config.Settings) -> None:
  """Every setting the algorithm's entry refuses (ConfigError naming the flag)."""
  check_algorithm(settings)
  check_aggregation(settings)


# ---- defaults ----


def algorithm_defaults(settings: config.Settings) -> dict[str, Any]:
  """The entry's defaults of `settings.server.algorithm`, given the other settings ({} if
  unknown)."""
  entry = ALGORITHMS.get(settings.server.algorithm)
  return dict(entry.defaults(settings)) if entry else {}


def apply_defaults(settings: config.Settings, explicit) -> tuple[config.Settings, list[str]]:
  """`settings` with the algorithm's defaults for the flags not in `explicit`.

  Returns (settings, the applied defaults as `--flag=value` strings). Explicit
  flags (the command line, a preset) always win; a default that equals the
  value already set is not reported.
  """
  current = settings.flag_values()
  changed = {}
  for flag, value in algorithm_defaults(settings).items():
    if flag in explicit or current[flag] == value:
      continue
    changed[flag] = value
  applied = [f'--{flag}={value}' for flag, value in changed.items()]
  return (settings.replace(**changed) if changed else settings), applied


@functools.lru_cache(maxsize=None)
def _plain_defaults(name: str) -> dict[str, Any]:
  """The defaults of `--algorithm=name` given alone (the task: digits, bin/train's default)."""
  return dict(ALGORITHMS[name].defaults(config.from_flags({'algorithm': name})))


def documented_defaults(flag: str) -> dict[str, str]:
  """{algorithm: its default of `flag`} for --help (conditions spelled out)."""
  out = {}
  for name in ALGORITHMS:
    plain = _plain_defaults(name)
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
