"""--flagfile chains, checked before absl reads them.

absl skips a flagfile that includes itself, or one of the files that include
it, with a warning and goes on: the run starts without the flags its author
meant. The same file under two spellings (`a.flags` including `./a.flags`)
escapes absl's check, which compares the names as written, and recurses until
Python's stack overflows. `cycle` follows the chain as absl will read it
(`--flagfile=F` and `--flagfile F` on the command line, `--flagfile=F` lines
in the files, names relative to the working directory) and compares the files
themselves.
"""

import os
from typing import Optional

_DIRECTIVES = ('--flagfile=', '-flagfile=')


def _named_file(text: str) -> Optional[str]:
  """The file a `--flagfile=F` argument or line names (as absl expands it), else None."""
  for prefix in _DIRECTIVES:
    if text.startswith(prefix):
      return os.path.expanduser(text[len(prefix):].strip()) or None
  return None


def cycle(args) -> Optional[str]:
  """The first flagfile chain in `args` (no program name) that returns to a file.

  Returns it as 'a.flags -> b.flags -> a.flags', or None. A file absl cannot
  open or decode is left to absl's own error.
  """
  i = 0
  while i < len(args):
    arg = args[i]
    if arg == '--':  # absl stops reading flags there
      break
    if arg in ('--flagfile', '-flagfile'):
      i += 1
      name = os.path.expanduser(args[i]) if i < len(args) else None
    else:
      name = _named_file(arg)
    if name:
      found = _follow(name, [])
      if found:
        return found
    i += 1
  return None


def _follow(name: str, chain: list[tuple[str, str]]) -> Optional[str]:
  """Depth-first through the files `name` includes; `chain` holds (real path, name)."""
  real = os.path.realpath(name)
  seen = [r for r, _ in chain]
  if real in seen:
    return ' -> '.join([n for _, n in chain[seen.index(real):]] + [name])
  try:
    with open(name, encoding='utf-8') as f:
      lines = f.readlines()
  except (OSError, UnicodeDecodeError):
    return None
  chain.append((real, name))
  for line in lines:
    included = _named_file(line)
    if included:
      found = _follow(included, chain)
      if found:
        return found
  chain.pop()
  return None
