"""Library errors in bin/train's words: the library names its arguments, bin/train its flags.

A `tff_adaptive` refusal of an argument is a `tff_adaptive.errors.ArgumentError`
(`fedgbo: local_steps must be an integer ≥ 1 ...`), which carries the owner
that checks the argument and the argument's name. The flag table
(`train_flags.ARGUMENT_FLAGS`, from each entry's `feeds`) says which flag sets
it; `flag_message` tells the error with that flag (`--local_steps must be
...`, the argument given a value as `--flag=value`), and `named_by_flags` does
it to the ValueErrors of a block. Any other error is left as it is.
"""

import contextlib
from typing import TYPE_CHECKING, Optional

from tff_adaptive import errors as library_errors
from workflow.flags import algorithms
from workflow.flags import train_flags

if TYPE_CHECKING:  # cli imports this module before it may import TensorFlow
  from workflow.flags import config


def _flag(owner: str, argument: Optional[str]) -> Optional[str]:
  table = train_flags.ARGUMENT_FLAGS
  return table.get((owner, argument)) or (table.get((None, argument)) if argument else None)


def flag_of(error: BaseException) -> Optional[str]:
  """The flag that sets the argument `error` refuses, or None (not an ArgumentError, or an
  argument no flag sets)."""
  if not isinstance(error, library_errors.ArgumentError):
    return None
  return _flag(error.owner, error.argument)


def _hint(error: library_errors.ArgumentError, settings: Optional['config.Settings']) -> str:
  """What only bin/train can name: the model flag of the task that has batch norm."""
  # patch_layout's refusal of a private choice (value given) is a model without batch norm.
  if error.owner != 'patch_layout' or error.value is None or settings is None:
    return ''
  flag, model = algorithms.MTFL_MODELS.get(settings.task.task, (None, None))
  return f'; --{flag}={model} has batch norm' if flag else ''


def flag_message(error: BaseException, settings: Optional['config.Settings'] = None) -> str:
  """`error`'s message with the argument it refuses, and every argument it names again,
  named by their flags (`--flag`, `--flag=value`).

  `settings` (the run's) adds what only they can say, e.g. the model flag to
  change of their task. An error no flag is about keeps its message.
  """
  flag = flag_of(error)
  if flag is None:
    return str(error)

  def name(argument, value):
    named = _flag(error.owner, argument)
    if named is None:
      return None  # an argument no flag sets keeps the library's words
    return f'--{named}' if value is None else f'--{named}={value}'

  words = error.worded(name)
  if error.argument is None:  # the owner's whole refusal is about the flag
    return f'--{flag}: {words}'
  return words + _hint(error, settings)


@contextlib.contextmanager
def named_by_flags(settings: Optional['config.Settings'] = None, error=ValueError):
  """Within the block, a library ArgumentError of a flag's argument is re-raised as
  `error(flag_message(...))` (from it); any other ValueError passes unchanged."""
  try:
    yield
  except ValueError as e:
    if flag_of(e) is None:
      raise
    raise error(flag_message(e, settings)) from e
