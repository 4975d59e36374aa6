"""Library errors in bin/train's words: the library names its arguments, bin/train its flags.

A `tff_adaptive` ValueError about an argument reads `<owner>: <argument> ...`
(`fedgbo: local_steps must be an integer ≥ 1 ...`, `BiasedOptimizer: beta_1
must be in [0, 1); got 1.0`), the owner being the algorithm or the callable
that checks it. `flag_message` turns such a message into the flag that sets
the argument (`--local_steps must be ...`), `argument='value'` into
`--flag=value`; `named_by_flags` does it to the ValueErrors of a block. A
message of another shape, or of an argument no flag sets, is left as it is.
"""

import contextlib
import re
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # cli imports this module before it may import TensorFlow
  from workflow import config

# (owner, argument) → the bin/train flag that sets the argument. Owner None:
# the argument means that flag whoever checks it.
ARGUMENT_FLAGS = {
    (None, 'local_steps'): 'local_steps',
    ('BiasedOptimizer', 'name'): 'client_optimizer',
    ('BiasedOptimizer', 'beta_1'): 'client_beta_1',
    ('BiasedOptimizer', 'beta_2'): 'client_beta_2',
    ('BiasedOptimizer', 'epsilon'): 'client_epsilon',
    ('dp_aggregator', 'noise_multiplier'): 'dp_noise_multiplier',
    ('dp_aggregator', 'clip_norm'): 'dp_clip_norm',
    ('SharedIndexCompressionFactory', 'sparsity'): 'sparsity',
    ('fedopt.build_server_optimizer', 'name'): 'server_optimizer',
    ('fedopt.build_server_optimizer', 'semantics'): 'server_optimizer_semantics',
    ('fedada2.build_client_optimizer', 'name'): 'client_optimizer',
    ('fedada2.build_client_optimizer', 'delay'): 'sm3_delay',
    ('fedada2.build_server_optimizer', 'name'): 'server_optimizer',
    ('fedada2', 'preconditioner'): 'preconditioner',
    ('fedgbo', 'upload'): 'fedgbo_upload',
    ('fedprox', 'proximal_strength'): 'fedprox_mu',
    ('fedmax', 'beta'): 'fedmax_beta',
    ('perfedavg', 'beta'): 'perfedavg_beta',
    ('pfedme', 'lam'): 'pfedme_lambda',
    ('pfedme', 'personal_learning_rate'): 'pfedme_personal_learning_rate',
    ('pfedme', 'inner_steps'): 'pfedme_inner_steps',
    ('pfedme', 'beta'): 'pfedme_beta',
    ('patch_layout', 'private'): 'private',
    ('mtfl', 'strategy'): 'mtfl_strategy',
    ('CohortExecution', 'mode'): 'cohort_mode',
    ('CohortExecution', 'jit_compile'): 'cohort_jit_compile',
    ('ErrorDrivenDecay', 'window'): 'schedule_window',
}
# Callables that one flag turns on: their whole message is about that flag.
OWNER_FLAGS = {'parse_addresses': 'workers', 'compose_data_on_workers': 'data_on_workers',
               'compose_cohort_data_on_workers': 'data_on_workers'}

_MESSAGE = re.compile(r'^(?P<owner>[A-Za-z_][\w.]*): (?P<rest>.*)$', re.DOTALL)
_ARGUMENT = re.compile(r'^(?P<argument>[a-z_]\w*)(?![\w(])')
_ASSIGNMENT = re.compile(r"(?<![\w.-])(?P<argument>[a-z_]\w*)='(?P<value>[^']*)'")


def _flag(owner: str, argument: str) -> Optional[str]:
  return ARGUMENT_FLAGS.get((owner, argument)) or ARGUMENT_FLAGS.get((None, argument))


# MTFL keeps a batch-norm patch private (thesis ch. 4): per task, the model flag and a model with
# batch normalisation (the registry's MTFL defaults and this hint read it).
MTFL_MODELS = {'digits': ('digits_model', 'cnn_bn'), 'mnist': ('mnist_model', 'mtfl_2nn'),
               'cifar10': ('cifar10_model', 'mtfl_cnn')}


def _hint(owner: str, message: str, settings: Optional['config.Settings']) -> str:
  """What only bin/train can name: the model flag of the task that has batch norm."""
  if owner != 'patch_layout' or 'BatchNormalization' not in message or settings is None:
    return ''
  flag, model = MTFL_MODELS.get(settings.task.task, (None, None))
  return f'; --{flag}={model} has batch norm' if flag else ''


def flag_message(message: str, settings: Optional['config.Settings'] = None) -> str:
  """`message` with the argument it is about, and any `argument='value'`, named by their flags.

  `settings` (the run's) adds what only they can say, e.g. the model flag to
  change of their task.
  """
  match = _MESSAGE.match(message)
  if not match:
    return message
  owner, rest = match.group('owner'), match.group('rest')
  if owner in OWNER_FLAGS:
    return f'--{OWNER_FLAGS[owner]}: {rest}'
  first = _ARGUMENT.match(rest)
  if not first or not _flag(owner, first.group('argument')):
    return message

  def assignment(m):
    flag = _flag(owner, m.group('argument'))
    return f'--{flag}={m.group("value")}' if flag else m.group(0)

  flagged = _ARGUMENT.sub(f'--{_flag(owner, first.group("argument"))}',
                          _ASSIGNMENT.sub(assignment, rest), count=1)
  return flagged + _hint(owner, rest, settings)


@contextlib.contextmanager
def named_by_flags(settings: Optional['config.Settings'] = None, error=ValueError):
  """Within the block, a library ValueError about a flag's argument is re-raised as
  `error(flag_message(...))` (from it); any other ValueError passes unchanged."""
  try:
    yield
  except ValueError as e:
    flagged = flag_message(str(e), settings)
    if flagged == str(e):
      raise
    raise error(flagged) from e
