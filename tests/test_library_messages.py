"""The library speaks in parameters, not in bin/train's flags.

Read with `ast` from the source of `tff_adaptive/`: no string literal (a
message, a docstring, a piece of an f-string, a flag name kept in a variable
for a later message) holds `--flag` text, and no code reads a flag dict
(`cfg[...]`, `cfg.get(...)`). bin/train still names its flags: the library
refuses an argument with a `tff_adaptive.errors.ArgumentError`, which carries
its owner and argument, and `workflow.flags.library_flags` names the flag whose
table entry feeds them. Checked here both ways (every ArgumentError the
library makes has its flag, every row of the table is raised) and against
the messages the library really raises.
"""

import ast
import os
import pickle
import re
import types
from typing import Optional

import pytest
import tensorflow as tf
import tensorflow_federated as tff

import algorithm_testing as at
from tff_adaptive import errors as library_errors
from tff_adaptive.aggregators import compression
from tff_adaptive.aggregators import dp
from tff_adaptive.algorithms import fedada2
from tff_adaptive.algorithms import fedgbo
from tff_adaptive.algorithms import fedmax
from tff_adaptive.algorithms import fedopt
from tff_adaptive.algorithms import fedprox
from tff_adaptive.algorithms import mimexlite
from tff_adaptive.algorithms import mtfl
from tff_adaptive.algorithms import perfedavg
from tff_adaptive.algorithms import pfedme
from tff_adaptive.execution import data_on_workers
from tff_adaptive.execution import worker_process
from tff_adaptive.optimizers import biased as biased_optimizers
from tff_adaptive.optimizers import sm3
from tff_adaptive.rounds import cohort
from tff_adaptive.schedules import driver as round_schedules
from workflow.flags import config
from workflow.flags import library_flags
from workflow.flags import train_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAG_TEXT = re.compile(r'(?<![\w-])--([A-Za-z][\w-]*)')

# (file, flag) → why that literal may hold it.
ALLOWED_FLAG_TEXT = {
    ('tff_adaptive/execution/worker_process.py', 'port'):
        "the command line of TFF's worker_binary, which WorkerProcess starts (not a message)",
    ('tff_adaptive/execution/worker_process.py', 'max_concurrent_computation_calls'):
        "the command line of TFF's worker_binary, which WorkerProcess starts (not a message)",
    ('tff_adaptive/execution/parent_death.py', 'pdeathsig'):
        "setpriv's option in the command line a worker starts under (not a message)",
    ('tff_adaptive/execution/parent_death.py', 'default-signal'):
        "env's option in the command line a worker starts under (not a message)",
}


def _library_files():
  for folder, _, names in os.walk(os.path.join(ROOT, 'tff_adaptive')):
    for name in sorted(names):
      if name.endswith('.py'):
        path = os.path.join(folder, name)
        yield os.path.relpath(path, ROOT), path


def flag_texts(source: str, path: str) -> list[str]:
  """`path:line: --flag in 'literal'` for each string literal of `source` naming a flag."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
      for flag in FLAG_TEXT.findall(node.value):
        if (path, flag) not in ALLOWED_FLAG_TEXT:
          found.append(f'{path}:{node.lineno}: --{flag} in {node.value[:70]!r}')
  return found


def flag_dict_reads(source: str, path: str) -> list[str]:
  """`path:line` of each `cfg[...]` and `cfg.get(...)` in `source`."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Subscript):
      target = node.value
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
        node.func.attr == 'get':
      target = node.func.value
    else:
      continue
    if isinstance(target, ast.Name) and target.id == 'cfg':
      found.append(f'{path}:{node.lineno}: {ast.unparse(node)[:70]}')
  return found


def _scan(check):
  found = []
  for relative, path in _library_files():
    with open(path, encoding='utf-8') as f:
      found += check(f.read(), relative)
  return found


def test_library_messages_and_docstrings_name_no_flags():
  found = _scan(flag_texts)
  assert not found, ('the library names its arguments, not bin/train\'s flags '
                     '(workflow.flags.library_flags maps them):\n' + '\n'.join(found))


def test_library_reads_no_flag_dict():
  found = _scan(flag_dict_reads)
  assert not found, 'the library takes arguments, not the flag dict:\n' + '\n'.join(found)


def test_every_library_file_is_scanned():
  scanned = {relative for relative, _ in _library_files()}
  assert 'tff_adaptive/algorithms/fedgbo.py' in scanned and len(scanned) >= 60
  for path, _ in ALLOWED_FLAG_TEXT:
    assert path in scanned, path


BAD_SNIPPET = '''
"""Module docstring: run with `--local_steps=K`."""
import warnings

def build(local_steps, cfg):
  """Needs --local_steps."""
  for flag, value in (('--client_beta_1', 1.0),):
    pass
  if local_steps < 1:
    raise ValueError(f'--local_steps must be >= 1; got {local_steps}')
  warnings.warn('see --help')
  return cfg['local_steps'] + cfg.get('seed', 0)
'''
GOOD_SNIPPET = '''
"""Module docstring: decrements with x--; a rule ---------- and a flag-like word a--b."""

def build(local_steps, config):
  """local_steps: K >= 1."""
  if local_steps < 1:
    raise ValueError(f'fedgbo: local_steps must be an integer >= 1; got {local_steps}')
  return config['local_steps'] + config.get('seed', 0)
'''


def test_checkers_see_flag_text_and_flag_dict_reads():
  """The checks above can fail: a planted module is caught on every line that should be."""
  found = flag_texts(BAD_SNIPPET, 'tff_adaptive/planted.py')
  assert sorted(int(line.split(':')[1]) for line in found) == [2, 6, 7, 10, 11], found
  assert any("--local_steps in '--local_steps must be >= 1; got '" in line for line in found)
  reads = flag_dict_reads(BAD_SNIPPET, 'tff_adaptive/planted.py')
  assert [int(line.split(':')[1]) for line in reads] == [12, 12], reads
  assert not flag_texts(GOOD_SNIPPET, 'tff_adaptive/planted.py')
  assert not flag_dict_reads(GOOD_SNIPPET, 'tff_adaptive/planted.py')
  # The allow-list is per file: the worker's command line elsewhere is flag text.
  argv = "ARGS = [f'--port={1}', '--max_concurrent_computation_calls=']"
  assert not flag_texts(argv, 'tff_adaptive/execution/worker_process.py')
  assert len(flag_texts(argv, 'tff_adaptive/execution/remote_context.py')) == 2


# ---- every argument error of the library has its flag in the table, and back ----

_OWNED = re.compile(r'^(?P<owner>[A-Za-z_][\w.]*): (?P<argument>[a-z_]\w*)(?![\w(])')
_COMPUTED_OWNER = re.compile(r'^: (?P<argument>[a-z_]\w*)(?![\w(])')
COMPUTED = '<computed>'  # an ArgumentError whose argument is not a literal

# (owner, argument) → why no flag sets it (owner None: an owner computed at run time). These
# stay plain ValueErrors: bin/train never passes a value the library refuses here.
NO_FLAG = {
    ('more_gradients', 'batches_per_step'): "an algorithm module's extension, not a setting "
                                            'of bin/train',
    ('feddyn', 'total_clients'): "the task's number of clients (algorithm_builders passes it)",
    ('mime', 'gradient'): "mimelite.mime_recipe's, chosen by --algorithm (mimelite, mimexlite)",
    ('scaffold', 'total_clients'): "the task's number of clients (algorithm_builders passes it)",
    (None, 'client_weighting'): ('the builders derive it from --client_weighting and --dp and never '
                                 'pass one the library refuses; its messages are about the code'),
}


def _value_errors(tree) -> set[str]:
  names = {'ValueError'}
  for node in ast.walk(tree):
    if isinstance(node, ast.ClassDef) and any(
        isinstance(base, ast.Name) and base.id in names for base in node.bases):
      names.add(node.name)
  return names


def _parameters(tree) -> set[str]:
  """Names of the module's parameters and dataclass fields: what a message's argument can be."""
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
      arguments = node.args
      names.update(a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs)
    elif isinstance(node, ast.ClassDef):
      names.update(item.target.id for item in node.body
                   if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name))
  return names


def _owner_and_argument(message):
  """(owner or None if computed, argument) of `<owner>: <argument> ...`, else None."""
  pieces = message.values if isinstance(message, ast.JoinedStr) else [message]
  first = pieces[0]
  if isinstance(first, ast.Constant) and isinstance(first.value, str):
    match = _OWNED.match(first.value)
    return match and (match.group('owner'), match.group('argument'))
  if isinstance(first, ast.FormattedValue) and len(pieces) > 1 and \
      isinstance(pieces[1], ast.Constant):
    match = _COMPUTED_OWNER.match(pieces[1].value)
    return match and (None, match.group('argument'))
  return None


def named_arguments(source: str, path: str) -> list[tuple[str, Optional[str], str]]:
  """(`path:line`, owner, argument) of each plain ValueError whose text reads
  `<owner>: <argument> ...`, the argument being a parameter of the module (not a word
  such as `an`)."""
  tree = ast.parse(source)
  errors, parameters = _value_errors(tree), _parameters(tree)
  found = []
  for node in ast.walk(tree):
    if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args):
      continue
    func = node.exc.func
    if (func.id if isinstance(func, ast.Name) else getattr(func, 'attr', None)) not in errors:
      continue
    named = _owner_and_argument(node.exc.args[0])
    if named and named[1] in parameters:
      found.append((f'{path}:{node.lineno}', *named))
  return found


# ArgumentError subclasses whose owner is fixed (their first argument is the argument), and the
# arguments a raise site of such an owner may compute.
OWNED_ERRORS = {'ScheduleError': 'RoundSchedules'}
COMPUTED_ARGUMENTS = {'RoundSchedules': ('local_steps', 'client_lr', 'server_lr')}


def _called(node) -> Optional[str]:
  return getattr(node.func, 'attr', getattr(node.func, 'id', None))


def argument_errors(source: str, path: str) -> list[tuple[str, Optional[str], Optional[str]]]:
  """(`path:line`, owner or None if computed, argument or COMPUTED) of each ArgumentError
  made, and of each argument it names again (`Given(argument=...)`)."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if not isinstance(node, ast.Call):
      continue
    if _called(node) == 'ArgumentError' and len(node.args) >= 2:
      owner = node.args[0].value if isinstance(node.args[0], ast.Constant) else None
      argument = node.args[1]
    elif _called(node) in OWNED_ERRORS and node.args:
      owner, argument = OWNED_ERRORS[_called(node)], node.args[0]
    else:
      continue
    where = f'{path}:{node.lineno}'
    if isinstance(argument, ast.Constant):
      found.append((where, owner, argument.value))
    else:
      found += [(where, owner, a) for a in COMPUTED_ARGUMENTS.get(owner, (COMPUTED,))]
    found += [(where, owner, keyword.value.value) for inner in ast.walk(node)
              if isinstance(inner, ast.Call) and _called(inner) == 'Given'
              for keyword in inner.keywords
              if keyword.arg == 'argument' and isinstance(keyword.value, ast.Constant)]
  return found


def _library_argument_errors():
  # errors.py rebuilds pickled errors from their parts: not a refusal of its own.
  return _scan(lambda source, path: [] if path == 'tff_adaptive/errors.py'
               else argument_errors(source, path))


def _flag_for(owner: Optional[str], argument: Optional[str], table=None) -> Optional[str]:
  table = train_flags.ARGUMENT_FLAGS if table is None else table
  if owner is None:  # computed: only a row for any owner holds whatever it is
    return table.get((None, argument))
  return table.get((owner, argument)) or (table.get((None, argument)) if argument else None)


def _unraised(table, raised) -> list[str]:
  """The table's (owner, argument) rows that no ArgumentError of `raised` refuses."""
  return [f'--{flag}: {key}' for key, flag in table.items()
          if not (key in raised if key[0] is not None else
                  any(argument == key[1] for _, argument in raised))]


def test_every_argument_error_of_the_library_has_a_flag_or_a_reason():
  made = _library_argument_errors()
  found = [f'{where}: ({owner!r}, {argument!r})' for where, owner, argument in made
           if argument == COMPUTED or
           not (_flag_for(owner, argument) or (owner, argument) in NO_FLAG)]
  assert not found, ('a library ArgumentError has no flag (give the flag that sets it `feeds=` '
                     'in workflow/flags/train_flags.py, or add it to NO_FLAG here with why):\n'
                     + '\n'.join(found))
  assert len(made) >= 35  # the scan sees the library's argument errors


def test_every_argument_a_flag_feeds_is_refused_by_the_library():
  """A `feeds=` row that the library never raises would name no flag: a stale row."""
  raised = {(owner, argument) for _, owner, argument in _library_argument_errors()}
  missing = _unraised(train_flags.ARGUMENT_FLAGS, raised)
  assert not missing, 'no library ArgumentError refuses these rows of the flag table:\n' + \
      '\n'.join(missing)
  assert len(train_flags.ARGUMENT_FLAGS) >= 28


def test_no_plain_value_error_names_an_argument_a_flag_could_name():
  """A plain ValueError reading `<owner>: <argument> ...` carries no owner and argument:
  bin/train could not name the flag. Such a refusal is an ArgumentError, or in NO_FLAG."""
  found = _scan(lambda source, path: [f'{where}: ({owner!r}, {argument!r})'
                                      for where, owner, argument in named_arguments(source, path)
                                      if (owner, argument) not in NO_FLAG])
  assert not found, ('a library ValueError names an argument in its text only (raise '
                     'tff_adaptive.errors.ArgumentError, or add it to NO_FLAG here with why):\n' +
                     '\n'.join(found))
  assert {(o, a) for _, o, a in _scan(named_arguments)} == set(NO_FLAG)


ARGUMENT_SNIPPET = """
class CheckError(ValueError):
  pass

def build(local_steps, window, name, colour, argument):
  if local_steps < 0:
    raise ValueError(f'{name}: local_steps must be >= 0; got {local_steps}')
  if window < 1:
    raise CheckError(f'Decay: window must be >= 1; got {window}')
  if colour:
    raise ValueError('build: colour is not a thing')
  if argument:
    raise errors.ArgumentError(name, 'local_steps', 'must be >= 0')
  if window > 9:
    raise errors.ArgumentError('ErrorDrivenDecay', 'window', 'must be small')
  raise ArgumentError('Decay', argument, 'is computed')
  raise ScheduleError(name, ': drop ', errors.Given(argument='data_on_workers'))
  raise ValueError('build: an error about no argument')
"""


def test_the_argument_scans_see_owned_and_computed_owners():
  found = named_arguments(ARGUMENT_SNIPPET, 'tff_adaptive/planted.py')
  assert [(int(w.split(':')[1]), o, a) for w, o, a in found] == [
      (7, None, 'local_steps'), (9, 'Decay', 'window'), (11, 'build', 'colour')], found
  made = argument_errors(ARGUMENT_SNIPPET, 'tff_adaptive/planted.py')
  assert sorted([(int(w.split(':')[1]), o, a) for w, o, a in made], key=lambda m: m[0]) == [
      (13, None, 'local_steps'), (15, 'ErrorDrivenDecay', 'window'), (16, 'Decay', COMPUTED),
      (17, 'RoundSchedules', 'local_steps'), (17, 'RoundSchedules', 'client_lr'),
      (17, 'RoundSchedules', 'server_lr'), (17, 'RoundSchedules', 'data_on_workers')]
  # The fixed owner the scan gives ScheduleError is its own.
  assert round_schedules.ScheduleError('client_lr', ': no').owner == OWNED_ERRORS['ScheduleError']
  assert _flag_for(None, 'local_steps') == 'local_steps'
  assert _flag_for('ErrorDrivenDecay', 'window') == 'schedule_window'
  assert not _flag_for('Decay', 'window') and not _flag_for('build', 'colour')
  assert not _flag_for(None, 'window')  # a computed owner needs a row for any owner
  # A row nothing raises is found; a wildcard row is met by any owner's refusal.
  table = {('fedprox', 'proximal_strength'): 'fedprox_mu', (None, 'local_steps'): 'local_steps',
           ('gone', 'strength'): 'gone_flag'}
  raised = {('fedprox', 'proximal_strength'), ('scaffold', 'local_steps')}
  assert _unraised(table, raised) == ["--gone_flag: ('gone', 'strength')"]
