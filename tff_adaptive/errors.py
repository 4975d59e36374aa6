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
      print(e.worded(lambda argument, value: 'mu' if value is None else f'mu = {value}'))
      # mu must be ≥ 0; got -1.0
"""

import dataclasses
from collections.abc import Callable
from typing import Any, Optional, Union


@dataclasses.dataclass(frozen=True)
class Given:
  """Within a message, an argument named again: the error's own or `argument` (another of
  the owner's), given `value` (`strategy='fedavg_adam'`) or, value None, by name alone.
  `quoted`: the value is shown as its repr (`'fedavg_adam'`), else as it is (`exp`)."""
  value: Any = None
  argument: Optional[str] = None
  quoted: bool = True


Piece = Union[str, Given]
# (argument, value or None) → how the message says the argument; None: in the library's words.
Namer = Callable[[str, Any], Optional[str]]


class ArgumentError(ValueError):
  """A bad argument of `owner`.

  Attributes:
    owner: the function or class that checks the argument ('fedprox',
      'BiasedOptimizer', 'fedopt.build_server_optimizer').
    argument: the parameter's name; None when the message is about the call
      as a whole (`parse_addresses: 'x' is not host:port`).
    value: the argument's value that the message opens with
      (`private='all' needs ...`), or None (`private must be one of ...`).
    detail: the rest of the message: text, and `Given` where it names an
      argument again.
  """

  def __init__(self, owner: str, argument: Optional[str], *detail: Piece, value: Any = None):
    self.owner, self.argument, self.value, self.detail = owner, argument, value, detail
    super().__init__(self._message())

  def _pieces(self) -> tuple[Piece, ...]:
    opening = (Given(self.value), ' ') if self.argument is not None else ()
    return opening + self.detail

  def _message(self) -> str:
    return f'{self.owner}: {self.worded(lambda argument, value: None)}'

  def worded(self, name: Namer) -> str:
    """The message after `<owner>: `, each argument said by `name(argument, value or None)`
    (the library's words where it returns None)."""
    words = []
    for piece in self._pieces():
      if isinstance(piece, str):
        words.append(piece)
        continue
      argument = piece.argument or self.argument
      said = name(argument, piece.value)
      if said is None:
        shown = repr(piece.value) if piece.quoted else piece.value
        said = argument if piece.value is None else f'{argument}={shown}'
      words.append(said)
    return ''.join(words)

  def __reduce__(self):
    # BaseException pickles its args (the message); the parts rebuild the same error.
    return _rebuilt, (type(self), self.owner, self.argument, self.detail, self.value)


def _rebuilt(cls, owner, argument, detail, value) -> ArgumentError:
  error = cls.__new__(cls)
  ArgumentError.__init__(error, owner, argument, *detail, value=value)
  return error
