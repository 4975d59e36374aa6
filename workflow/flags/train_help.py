"""bin/train's --help: the flag table (`workflow/flags/train_flags.py`) with what the
algorithm registry says about each flag (its readers, per-algorithm values and
defaults).

Apart from the table so that the table imports no registry: the registry reads
the typed settings (`workflow/flags/config.py`), which are built from the table.
"""

import textwrap
from collections.abc import Mapping
from typing import Any

from workflow.flags import train_flags
from workflow.flags.train_flags import GROUPS, Flag, Having


def readers(f: Flag) -> tuple[str, ...]:
  """The algorithms that read flag `f` (empty: every algorithm)."""
  if isinstance(f.algorithms, Having):
    from workflow.flags import algorithms  # pylint: disable=g-import-not-at-top
    return algorithms.having(f.algorithms.feature)
  return f.algorithms


def _readers(f: Flag) -> str:
  return ', '.join(readers(f)) or 'all algorithms'


def _algorithm_notes(name: str) -> list[str]:
  """Per-algorithm values and defaults of `name`, from the algorithm registry."""
  from workflow.flags import algorithms  # pylint: disable=g-import-not-at-top
  notes = []
  if name == 'algorithm':
    notes.append('values: ' + ' | '.join(algorithms.ALGORITHMS))
  if name == 'task':
    from tasks import registry  # pylint: disable=g-import-not-at-top
    notes.append('values: ' + ' | '.join(registry.TASKS) + ' | package.module:function')
  if name == 'client_optimizer':
    by_values: dict[tuple[str, ...], list[str]] = {}
    for algorithm, entry in algorithms.ALGORITHMS.items():
      by_values.setdefault(entry.client_optimizers, []).append(algorithm)
    notes.append('values: ' + '; '.join(f'{", ".join(names)}: {" | ".join(values)}'
                                         for values, names in by_values.items()))
  defaults = algorithms.documented_defaults(name)
  if defaults:
    notes.append('algorithm defaults: ' + '; '.join(f'{a}: {v}' for a, v in defaults.items()))
  return notes


def grouped_help(program: str = 'bin/train.py', doc: str = '') -> str:
  """bin/train's --help: every group, each flag with its values, defaults and readers."""
  lines = [doc.strip(), ''] if doc else []
  lines += [f'Flags of {program}, by group (--helpfull: absl\'s listing, with its own flags).']
  wrap = lambda text, indent: textwrap.fill(text, 100, initial_indent=indent,
                                            subsequent_indent=indent)
  for _, title, group in GROUPS:
    lines += ['', f'{title}:']
    for f in group:
      default = '' if f.default in (None, '') else repr(f.default) if f.kind != 'bool' else (
          'true' if f.default else 'false')
      lines.append(f'  --{f.name}' + (f' (default: {default})' if default else ''))
      lines.append(wrap(f.help, '      '))
      if f.values:
        lines.append(wrap('values: ' + ' | '.join(f.values), '      '))
      for note in _algorithm_notes(f.name):
        lines.append(wrap(note, '      '))
      if f.algorithms:
        lines.append(wrap(f'read by: {_readers(f)}', '      '))
  return '\n'.join(lines) + '\n'


def check_table(names: Mapping[str, Any]) -> None:
  """Raises ValueError if a flag's readers name an unregistered algorithm."""
  for f in train_flags.FLAGS_BY_NAME.values():
    unknown = set(readers(f)) - set(names)
    if unknown:
      raise ValueError(f'--{f.name} is read by unknown algorithms {sorted(unknown)}')
