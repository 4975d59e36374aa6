"""The library speaks in parameters, not in bin/train's flags.

Read with `ast` from the source of `tff_adaptive/`: no string literal (a
message, a docstring, a piece of an f-string, a flag name kept in a variable
for a later message) holds `--flag` text, and no code reads a flag dict
(`cfg[...]`, `cfg.get(...)`). bin/train still names its flags: the library's
`<owner>: <argument> ...` messages are turned into them by
`workflow.library_flags`, checked here against the messages the library
really raises.
"""

import ast
import os
import re
import types
from typing import Optional

import pytest
import tensorflow as tf
import tensorflow_federated as tff

import algorithm_testing as at
from tff_adaptive.accounting import privacy
from tff_adaptive.aggregators import compression
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
from workflow import config
from workflow import library_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAG_TEXT = re.compile(r'(?<![\w-])--([A-Za-z][\w-]*)')

# (file, flag) → why that literal may hold it.
ALLOWED_FLAG_TEXT = {
    ('tff_adaptive/execution/worker_process.py', 'port'):
        "the command line of TFF's worker_binary, which WorkerProcess starts (not a message)",
    ('tff_adaptive/execution/worker_process.py', 'max_concurrent_computation_calls'):
        "the command line of TFF's worker_binary, which WorkerProcess starts (not a message)",
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
                     '(workflow.library_flags maps them):\n' + '\n'.join(found))


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


# ---- every argument a library ValueError names has a row of library_flags ----

_OWNED = re.compile(r'^(?P<owner>[A-Za-z_][\w.]*): (?P<argument>[a-z_]\w*)(?![\w(])')
_COMPUTED_OWNER = re.compile(r'^: (?P<argument>[a-z_]\w*)(?![\w(])')

# (owner, argument) → why no flag sets it (owner None: an owner computed at run time).
NO_FLAG = {
    (None, 'init_client_state'): "an algorithm module's recipe, not a setting of bin/train",
    (None, 'uses_first_gradient'): "a Recipe's field, not a setting of bin/train",
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
  """(`path:line`, owner, argument) of each ValueError that reads `<owner>: <argument> ...`,
  the argument being a parameter of the module (not a word such as `an`)."""
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


def _has_row(owner: Optional[str], argument: str) -> bool:
  if owner in library_flags.OWNER_FLAGS or (owner, argument) in NO_FLAG:
    return True
  # A computed owner is only known when raised: the argument's row must hold for any owner.
  return bool(library_flags.ARGUMENT_FLAGS.get((None, argument)) or
              owner and library_flags.ARGUMENT_FLAGS.get((owner, argument)))


def test_every_argument_named_in_a_library_error_has_a_flag_row():
  found = _scan(lambda source, path: [f'{where}: ({owner!r}, {argument!r})'
                                      for where, owner, argument in named_arguments(source, path)
                                      if not _has_row(owner, argument)])
  assert not found, ('a library ValueError names an argument workflow/library_flags.py has no '
                     'row for (add it to ARGUMENT_FLAGS, or to NO_FLAG here with why):\n' +
                     '\n'.join(found))
  assert len(_scan(named_arguments)) >= 30  # the scan sees the library's messages


ARGUMENT_SNIPPET = """
class CheckError(ValueError):
  pass

def build(local_steps, window, name, colour):
  if local_steps < 0:
    raise ValueError(f'{name}: local_steps must be >= 0; got {local_steps}')
  if window < 1:
    raise CheckError(f'Decay: window must be >= 1; got {window}')
  if colour:
    raise ValueError('build: colour is not a thing')
  raise ValueError('build: an error about no argument')
"""


def test_the_argument_scan_sees_owned_and_computed_owners():
  found = named_arguments(ARGUMENT_SNIPPET, 'tff_adaptive/planted.py')
  assert [(int(w.split(':')[1]), o, a) for w, o, a in found] == [
      (7, None, 'local_steps'), (9, 'Decay', 'window'), (11, 'build', 'colour')], found
  assert _has_row(None, 'local_steps') and not _has_row('Decay', 'window')
  assert not _has_row('build', 'colour')


# ---- bin/train names the flags: the library's messages mapped ----

def _sgd():
  return tff.learning.optimizers.build_sgdm(0.1)


def _no_batch_norm():
  return tf.keras.Sequential([tf.keras.Input([3]), tf.keras.layers.Dense(2)], name='dense_only')


# (what raises, the start of the library's message, the flag bin/train names).
LIBRARY_ERRORS = [
    (lambda: biased_optimizers.BiasedOptimizer('sgd'), 'BiasedOptimizer: name', '--client_optimizer'),
    (lambda: biased_optimizers.BiasedOptimizer('adam', beta_1=1.0), 'BiasedOptimizer: beta_1',
     '--client_beta_1'),
    (lambda: biased_optimizers.BiasedOptimizer('adam', beta_2=-0.1), 'BiasedOptimizer: beta_2',
     '--client_beta_2'),
    (lambda: biased_optimizers.BiasedOptimizer('adam', epsilon=0.0), 'BiasedOptimizer: epsilon',
     '--client_epsilon'),
    (lambda: privacy.dp_aggregator(-1.0, 1.0, 10), 'dp_aggregator: noise_multiplier',
     '--dp_noise_multiplier'),
    (lambda: privacy.dp_aggregator(1.0, 0.0, 10), 'dp_aggregator: clip_norm', '--dp_clip_norm'),
    (lambda: compression.SharedIndexCompressionFactory(1.0),
     'SharedIndexCompressionFactory: sparsity', '--sparsity'),
    (lambda: fedopt.build_server_optimizer('adam', 0.1, semantics='nope'),
     'fedopt.build_server_optimizer: semantics', '--server_optimizer_semantics'),
    (lambda: fedopt.build_server_optimizer('lamb', 0.1), 'fedopt.build_server_optimizer: name',
     '--server_optimizer'),
    (lambda: fedada2.build_client_optimizer('sgd', 0.1), 'fedada2.build_client_optimizer: name',
     '--client_optimizer'),
    (lambda: fedada2.build_client_optimizer('sm3_adagrad', 0.1, delay=0),
     'fedada2.build_client_optimizer: delay', '--sm3_delay'),
    (lambda: fedada2.build_server_optimizer('yogi', 0.1), 'fedada2.build_server_optimizer: name',
     '--server_optimizer'),
    (lambda: fedada2.fedada2_recipe(sm3.build_sm3_adam(0.1), fedada2.build_server_optimizer(
        'adam', 0.1), preconditioner='diag'), 'fedada2: preconditioner', '--preconditioner'),
    (lambda: fedada2.fedada2_recipe(sm3.build_sm3_adam(0.1), fedada2.build_server_optimizer(
        'adam', 0.1), preconditioner='dja'), "fedada2: preconditioner='dja'",
     '--preconditioner=dja needs a dense'),
    (lambda: fedgbo.build_fedgbo(at.model_fn, _sgd(), local_steps=0), 'fedgbo: local_steps',
     '--local_steps must be an integer ≥ 1'),
    (lambda: fedgbo.fedgbo_recipe(biased_optimizers.BiasedOptimizer('adam'), upload='both'),
     'fedgbo: upload', '--fedgbo_upload'),
    (lambda: mimexlite.build_mimexlite(at.model_fn, _sgd(), local_steps=0),
     'mimexlite: local_steps', '--local_steps'),
    (lambda: fedprox.build_fedprox(at.model_fn, _sgd(), proximal_strength=-1.0),
     'fedprox: proximal_strength', '--fedprox_mu'),
    (lambda: fedmax.fedmax_model_fn(at.keras_model, -1.0, None), 'fedmax: beta', '--fedmax_beta'),
    (lambda: perfedavg.perfedavg_recipe(0.0), 'perfedavg: beta', '--perfedavg_beta'),
    (lambda: pfedme.pfedme_recipe(0.0, 0.1), 'pfedme: lam', '--pfedme_lambda'),
    (lambda: pfedme.pfedme_recipe(1.0, 0.0), 'pfedme: personal_learning_rate',
     '--pfedme_personal_learning_rate'),
    (lambda: pfedme.pfedme_recipe(1.0, 0.1, inner_steps=0), 'pfedme: inner_steps',
     '--pfedme_inner_steps'),
    (lambda: pfedme.build_pfedme(at.model_fn, _sgd(), beta=0.0), 'pfedme: beta', '--pfedme_beta'),
    (lambda: mtfl.patch_layout(_no_batch_norm(), 'everything'), 'patch_layout: private',
     '--private must be one of'),
    (lambda: mtfl.patch_layout(_no_batch_norm(), 'all'), "patch_layout: private='all'",
     '--private=all needs a model with BatchNormalization'),
    (lambda: mtfl.build_mtfl(at.model_fn, at.keras_model, _sgd(), strategy='fedsgd'),
     'mtfl: strategy', '--mtfl_strategy'),
    (lambda: mtfl.build_mtfl(at.model_fn, at.keras_model, tff.learning.optimizers.build_adam(0.1),
                             private='none', strategy='fedavg'),
     "mtfl: strategy='fedavg'", "--mtfl_strategy=fedavg trains clients with SGD; an adaptive "
     "client optimiser is only used by --mtfl_strategy=fedavg_adam"),
    (lambda: worker_process.parse_addresses('localhost'), 'parse_addresses:', '--workers:'),
    (lambda: worker_process.parse_addresses('h:1,h:1'), 'parse_addresses:', '--workers:'),
    (lambda: data_on_workers.compose_data_on_workers(
        None, types.SimpleNamespace(name='plain', train_data=object())),
     'compose_data_on_workers:', '--data_on_workers: task plain'),
    (lambda: data_on_workers.compose_cohort_data_on_workers(
        types.SimpleNamespace(execution=cohort.CohortExecution(in_process=False)),
        types.SimpleNamespace(name='plain', train_data=object())),
     'compose_cohort_data_on_workers:', '--data_on_workers: task plain'),
]


@pytest.mark.parametrize('raise_it, library_text, flag_text', LIBRARY_ERRORS,
                         ids=[f'{i}-{case[1]}' for i, case in enumerate(LIBRARY_ERRORS)])
def test_library_errors_name_the_argument_and_bin_train_the_flag(raise_it, library_text,
                                                                  flag_text):
  with pytest.raises(ValueError) as raised:
    raise_it()
  message = str(raised.value)
  assert message.startswith(library_text) and '--' not in message, message
  assert '\n' not in message
  flagged = library_flags.flag_message(message)
  assert flagged.startswith(flag_text), (message, flagged)
  assert library_text.split(': ')[0] + ':' not in flagged


def test_the_flag_messages_leave_other_messages_alone():
  for message in ('fedgbo: model_fn must return a tff.learning.models.VariableModel',
                  '--local_steps must be >= 1', 'error schedule: observe(3) out of order',
                  'mtfl: client_weighting must be a tff.learning.ClientWeighting'):
    assert library_flags.flag_message(message) == message


def test_the_task_model_flag_is_named_where_the_library_cannot():
  message = str(_raised(lambda: mtfl.patch_layout(_no_batch_norm(), 'gamma_beta')))
  digits = config.from_flags({'task': 'digits'})
  assert library_flags.flag_message(message, digits).endswith(
      "--private=none (plain FL); --digits_model=cnn_bn has batch norm")
  emnist = config.from_flags({'task': 'emnist'})
  assert library_flags.flag_message(message, emnist).endswith('--private=none (plain FL)')


def test_named_by_flags_raises_the_given_error_from_the_library_one():

  class Refused(ValueError):
    pass

  with pytest.raises(Refused, match='^--client_beta_1 must be in') as raised:
    with library_flags.named_by_flags(config.from_flags({}), Refused):
      biased_optimizers.BiasedOptimizer('adam', beta_1=1.0)
  assert isinstance(raised.value.__cause__, ValueError)
  with pytest.raises(ValueError, match='^unrelated$') as raised:  # not a library argument
    with library_flags.named_by_flags(config.from_flags({}), Refused):
      raise ValueError('unrelated')
  assert not isinstance(raised.value, Refused)


def _raised(function):
  with pytest.raises(ValueError) as raised:
    function()
  return raised.value
