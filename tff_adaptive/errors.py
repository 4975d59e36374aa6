"""The library's error about one argument: a ValueError that names it as data.

An `ArgumentError` reads `<owner>: <argument> ...` (`fedprox: proximal_strength
must be ≥ 0; got -1.0`), `<owner>` being the function or class that checks the
argument. It also keeps `owner` and `argument`, so a caller that sets the
argument under another name (a command-line flag, a config key) can say the
same message in its own words (`worded`) without reading the text.

    try:
      fedprox.build_fedprox(model_fn, client_optimizer_fn, proximal_strength=-1.0)
    except errors.ArgumentError as e:
      print(e.owner, e.argument)                       # fedprox proximal_strength
      print(e.worded(lambda value: 'mu' if value is None else f'mu = {value}'))
      # mu must be ≥ 0; got -1.0
"""

import dataclasses
from collections.abc import Callable
from typing import Any, Optional, Union


@dataclasses.dataclass(frozen=True)
class Given:
  """Within a message, the argument given another value (`strategy='fedavg_adam'`)."""
  value: Any


Piece = Union[str, Given]


class ArgumentError(ValueError):
  """A bad argument of `owner`.

  Attributes:
    owner: the function or class that checks the argument ('fedprox',
      'BiasedOptimizer', 'fedopt.build_server_optimizer').
    argument: the parameter's name; None when the message is about the call
      as a whole (`parse_addresses: 'x' is not host:port`).
    value: the argument's value that the message opens with
      (`private='all' needs ...`), or None (`private must be one of ...`).
    detail: the rest of the message: text, and `Given(value)` where it names
      the argument with another value.
  """

  def __init__(self, owner: str, argument: Optional[str], *detail: Piece, value: Any = None):
    self.owner, self.argument, self.value, self.detail = owner, argument, value, detail
    super().__init__(f'{owner}: {self.worded(self._own_name)}')

  def _own_name(self, value: Any) -> str:
    return self.argument if value is None else f'{self.argument}={value!r}'

  def worded(self, name: Callable[[Any], str]) -> str:
    """The message after `<owner>: `, the argument (given a value, or None) said by `name`."""
    rest = ''.join(name(p.value) if isinstance(p, Given) else p for p in self.detail)
    return rest if self.argument is None else f'{name(self.value)} {rest}'

  def __reduce__(self):
    # BaseException pickles its args (the message); the parts rebuild the same error.
    return _rebuilt, (self.owner, self.argument, self.detail, self.value)


def _rebuilt(owner, argument, detail, value) -> ArgumentError:
  return ArgumentError(owner, argument, *detail, value=value)
