"""The package layering: who may import whom, no cycles, no import side effects;
and below bin/, settings, not bin/train's flag dict.

  bin/ → workflow/ → tasks/ → tff_adaptive/ (the installed library)

and inside workflow/, its parts one way: flags ← training ← reporting ← reproduction,
flags ← sweeps ← reporting (`WORKFLOW_PARTS`).

Imports are read from the source with `ast` (every `import`, including those
inside functions: a lazy import is still a dependency), resolved to first-party
modules, and checked against the allowed edges; the module graph must have no
cycle. The side-effect test imports every library module in a fresh interpreter
and compares the TFF attributes that the package knows how to patch, the exit
handlers, the signal handlers and the temp directory before and after.
"""

import ast
import importlib.util
import os
import re
import pkgutil
import subprocess
import sys
import textwrap

import pytest

from tff_adaptive.execution import tff_patches

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIRST_PARTY = ('tff_adaptive', 'tasks', 'workflow', 'bin', 'bench', 'reports', 'tests')
# layer → the first-party top-level packages it may import.
ALLOWED = {
    'tff_adaptive': {'tff_adaptive'},
    'tasks': {'tasks', 'tff_adaptive'},
    'workflow': {'workflow', 'tasks', 'tff_adaptive'},
}


def _load_build_tool():
  # bin/update_build.py resolves imports for BUILD; the layering is checked on
  # the same graph (one resolver, not two that could drift apart).
  spec = importlib.util.spec_from_file_location(
      'update_build', os.path.join(ROOT, 'bin', 'update_build.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


_BUILD_TOOL = _load_build_tool()
ALL_MODULES = {}
for _path in _BUILD_TOOL.python_files():
  if _path.split('/')[0] in ALLOWED:
    ALL_MODULES[_BUILD_TOOL.module_name(_path)] = os.path.join(ROOT, _path)

# Every first-party module (bin/ and tests/ too) and the top-level names of
# the folders BUILD does not cover, so an import of any of them is an edge.
_KNOWN = ({_BUILD_TOOL.module_name(p) for p in _BUILD_TOOL.python_files()} | set(FIRST_PARTY))
GRAPH = {module: _BUILD_TOOL.imports(os.path.relpath(path, ROOT), module, _KNOWN)
         for module, path in ALL_MODULES.items()}


def test_every_layer_imports_only_what_it_may():
  forbidden = []
  for module, targets in GRAPH.items():
    layer = module.split('.')[0]
    for target in sorted(targets):
      if target.split('.')[0] not in ALLOWED[layer]:
        forbidden.append(f'{module} imports {target}')
  assert not forbidden, 'forbidden import edges:\n' + '\n'.join(forbidden)


def _find_cycle(graph):
  """One cycle of the graph as a list of modules, or None (iterative DFS)."""
  state = {}
  for start in sorted(graph):
    if start in state:
      continue
    stack = [(start, iter(sorted(graph[start])))]
    path = [start]
    state[start] = 'open'
    while stack:
      node, children = stack[-1]
      child = next(children, None)
      if child is None:
        stack.pop()
        path.pop()
        state[node] = 'done'
        continue
      if child == node or child not in graph:
        continue  # `from package import name` of a package's own __init__
      if state.get(child) == 'open':
        return path[path.index(child):] + [child]
      if child not in state:
        state[child] = 'open'
        path.append(child)
        stack.append((child, iter(sorted(graph[child]))))
  return None


# tff_adaptive's subpackages, lowest first: each imports only those before it (and the
# top-level package). The round engine (rounds/) is below the algorithms that use it.
LIBRARY_ORDER = ('accounting', 'compression', 'optimizers', 'aggregators', 'rounds',
                 'extensions', 'personalization', 'algorithms', 'execution', 'schedules')


def _upward_library_edges(graph) -> list:
  upward = []
  for module, targets in graph.items():
    parts = module.split('.')
    if parts[0] != 'tff_adaptive' or len(parts) < 3:
      continue
    rank = LIBRARY_ORDER.index(parts[1])
    for target in sorted(targets):
      target_parts = target.split('.')
      if (target_parts[0] == 'tff_adaptive' and len(target_parts) > 1 and
          target_parts[1] in LIBRARY_ORDER and LIBRARY_ORDER.index(target_parts[1]) > rank):
        upward.append(f'{module} imports {target}')
  return upward


def test_library_subpackages_import_only_lower_ones():
  assert not _upward_library_edges(GRAPH), '\n'.join(_upward_library_edges(GRAPH))


def test_library_order_names_every_subpackage_and_sees_an_upward_edge():
  subpackages = {m.split('.')[1] for m in GRAPH if m.startswith('tff_adaptive.')
                 and len(m.split('.')) > 2}
  assert subpackages == set(LIBRARY_ORDER)
  planted = {'tff_adaptive.rounds.cohort': {'tff_adaptive.algorithms.composer'}}
  assert _upward_library_edges(planted) == [
      'tff_adaptive.rounds.cohort imports tff_adaptive.algorithms.composer']


# workflow/'s parts → the parts each may import (and the modules at workflow/'s top,
# errors, which import no part). bin/train's flags are below everything; a run of
# bin/train imports no sweep or report; a sweep runs bin/train as processes, so it
# imports only the flag table.
WORKFLOW_PARTS = {
    'flags': set(),
    'training': {'flags'},
    'sweeps': {'flags'},
    'reporting': {'flags', 'training', 'sweeps'},
    'reproduction': {'flags', 'training', 'sweeps', 'reporting'},
}


def _part(module: str):
  """workflow's part of `module` ('' for the modules at its top), or None outside workflow."""
  parts = module.split('.')
  if parts[0] != 'workflow' or len(parts) < 2:
    return None
  return parts[1] if parts[1] in WORKFLOW_PARTS else ''


def _edges_between_workflow_parts(graph) -> list:
  crossing = []
  for module, targets in graph.items():
    part = _part(module)
    if part is None:
      continue
    allowed = WORKFLOW_PARTS.get(part, set()) | {part, ''}
    for target in sorted(targets):
      target_part = _part(target)
      if target_part is not None and target_part not in allowed:
        crossing.append(f'{module} imports {target}')
  return crossing


def test_workflow_parts_import_only_the_parts_below():
  assert not _edges_between_workflow_parts(GRAPH), '\n'.join(_edges_between_workflow_parts(GRAPH))


def test_workflow_parts_name_every_subpackage_and_see_a_crossing_edge():
  parts = {m.split('.')[1] for m in GRAPH if m.startswith('workflow.') and
           ALL_MODULES[m].endswith('__init__.py')}
  assert parts == set(WORKFLOW_PARTS)
  top = {m for m in GRAPH if _part(m) == ''}
  assert top == {'workflow.errors'}, top  # a module at the top is shared by the parts
  planted = {'workflow.training.program': {'workflow.sweeps.sweep'},
             'workflow.flags.config': {'workflow.training.run_dir'},
             'workflow.errors': {'workflow.flags.config'},
             'workflow.reporting.report': {'workflow.training.program', 'workflow.errors'}}
  assert _edges_between_workflow_parts(planted) == [
      'workflow.training.program imports workflow.sweeps.sweep',
      'workflow.flags.config imports workflow.training.run_dir',
      'workflow.errors imports workflow.flags.config']


def test_no_import_cycles():
  # A package's __init__ re-exporting its own submodules is not a cycle.
  graph = {m: {t for t in ts if not (m == t.rsplit('.', 1)[0] and ALL_MODULES[m].endswith(
      '__init__.py'))} for m, ts in GRAPH.items()}
  cycle = _find_cycle(graph)
  assert cycle is None, 'import cycle: ' + ' → '.join(cycle)


def test_checker_sees_forbidden_edges_and_cycles():
  """The checks above can fail: a planted edge and a planted cycle are found."""
  planted = dict(GRAPH)
  planted['tff_adaptive.algorithms.fedgbo'] = GRAPH['tff_adaptive.algorithms.fedgbo'] | {
      'tasks.base'}
  assert any(t.split('.')[0] not in ALLOWED['tff_adaptive']
             for t in planted['tff_adaptive.algorithms.fedgbo'])
  assert _find_cycle({'a': {'b'}, 'b': {'c'}, 'c': {'a'}}) == ['a', 'b', 'c', 'a']
  assert _find_cycle({'a': {'b'}, 'b': set()}) is None


def test_library_modules_are_all_checked():
  assert 'tff_adaptive.algorithms.fedgbo' in GRAPH
  assert 'workflow.training.program' in GRAPH and 'tasks.cifar10_lda' in GRAPH
  assert 'tasks.base' in GRAPH['tasks.cifar10_lda']


# Every attribute of TFF the package knows how to patch (tff_patches.PATCHES),
# read in the probe's fresh interpreter before and after importing the library.
_PATCHED = [(p.module, p.attribute) for p in tff_patches.PATCHES if not p.per_instance]
_PROBE = textwrap.dedent('''
    import atexit, importlib, json, os, pkgutil, signal, sys
    sys.path.insert(0, {root!r})
    import tensorflow_federated
    from tensorflow_federated.python.core.impl.context_stack import context_stack_impl

    def resolve(module, attribute):
      value = importlib.import_module(module)
      for part in attribute.split('.'):
        value = getattr(value, part)
      return id(value)

    def snapshot():
      return dict(
          patched={{f'{{m}}:{{a}}': resolve(m, a) for m, a in {patched!r}}},
          context=id(context_stack_impl.context_stack.current),
          atexit=atexit._ncallbacks(),
          signals=[str(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM)],
          tmp=sorted(os.listdir(os.environ['TMPDIR'])))

    before = snapshot()
    import tff_adaptive
    imported = []
    for info in pkgutil.walk_packages(tff_adaptive.__path__, 'tff_adaptive.'):
      importlib.import_module(info.name)
      imported.append(info.name)
    after = snapshot()
    print(json.dumps(dict(before=before, after=after, imported=imported)))
''')


def _run_probe(tmp_path, extra=''):
  tmpdir = tmp_path / 'tmp'
  tmpdir.mkdir()
  env = dict(os.environ, TMPDIR=str(tmpdir), TF_CPP_MIN_LOG_LEVEL='3')
  code = _PROBE.format(root=ROOT, patched=_PATCHED) + extra
  out = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True,
                       timeout=300, check=True)
  import json  # pylint: disable=g-import-not-at-top
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_library_changes_nothing(tmp_path):
  result = _run_probe(tmp_path)
  assert len(result['imported']) >= 40, result['imported']
  assert 'tff_adaptive.execution.runtime' in result['imported']
  assert result['after'] == result['before']


def test_the_probe_sees_explicit_tracking(tmp_path):
  """The side-effect probe can fail: after track_tff_workers() it sees the changes."""
  result = _run_probe(tmp_path, extra=textwrap.dedent('''
      from tff_adaptive.execution import runtime
      runtime.track_tff_workers()
      print(json.dumps(dict(before=before, after=snapshot(), imported=imported)))
  '''))
  changed = {k for k in result['before'] if result['before'][k] != result['after'][k]}
  changed |= {k for k, v in result['before']['patched'].items()
              if result['after']['patched'][k] != v}
  assert {'atexit', 'patched'} <= changed, changed
  assert {k.split(':')[1] for k in changed if ':' in k} == {
      '_serialize_struct_type', '_serialize_federated_value', 'subprocess'}


# What bin/train runs before it imports TensorFlow: the flag table, both
# registries' names, defaults and checks, --help, and the run-directory checks.
_BEFORE_TENSORFLOW = textwrap.dedent('''
    import sys
    from tasks import registry
    from workflow import errors
    from workflow.flags import train_help, validation
    from workflow.training import cli, experiment
    settings, _ = cli.config_from_args(['--algorithm=fedgbo', '--task=shakespeare_leaf',
                                        '--root_output_dir=/nonexistent/runs'])
    validation.validate(settings)
    experiment.experiment_dir(settings)
    train_help.grouped_help()
    for refused in (['--algorithm=nope'], ['--task=nope'], ['--algorithm=mfl', '--dp']):
        try:
            validation.validate(cli.config_from_args(refused)[0])
        except errors.UsageError:
            pass
        else:
            raise AssertionError(refused)
    print(sorted(m for m in ('tensorflow', 'tensorflow_federated', 'keras') if m in sys.modules))
''')


def test_flag_checks_and_registry_names_load_without_tensorflow():
  out = subprocess.run([sys.executable, '-c', _BEFORE_TENSORFLOW], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip().splitlines()[-1] == '[]', out.stdout


def test_the_flag_modules_load_without_tensorflow():
  """workflow/flags/ says so: bin/train refuses a bad command before TensorFlow loads."""
  code = textwrap.dedent('''
      import importlib, pkgutil, sys
      import workflow.flags
      names = [i.name for i in pkgutil.walk_packages(workflow.flags.__path__, 'workflow.flags.')]
      for name in names:
          importlib.import_module(name)
      print(len(names), sorted(m for m in ('tensorflow', 'tensorflow_federated', 'keras')
                               if m in sys.modules))
  ''')
  out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
  assert out.returncode == 0, out.stderr[-2000:]
  count, loaded = out.stdout.strip().splitlines()[-1].split(' ', 1)
  assert int(count) >= 11 and loaded == '[]', out.stdout


def test_the_tensorflow_probe_can_fail():
  """Building a process does load TensorFlow: the probe above would see it."""
  code = _BEFORE_TENSORFLOW.replace('train_help.grouped_help()',
                                    'from workflow.training import algorithm_builders')
  out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
  assert 'tensorflow' in out.stdout.strip().splitlines()[-1], out.stdout + out.stderr[-2000:]


def test_library_does_not_see_the_checkout_tooling(tmp_path):
  """Installed editable, only `tff_adaptive` is importable from outside the checkout."""
  code = ('import importlib.util as u; import tff_adaptive; '
          'print([n for n in ("tasks", "workflow", "bin", "conftest") if u.find_spec(n)])')
  out = subprocess.run([sys.executable, '-c', code], cwd=str(tmp_path), capture_output=True, text=True,
                       timeout=120, check=True, env=dict(os.environ, PYTHONPATH=''))
  # (cwd is an empty directory: '/' would offer the system's /bin as a namespace package)
  assert out.stdout.strip() == '[]'


def test_pkgutil_walk_matches_files():
  names = {i.name for i in pkgutil.walk_packages([os.path.join(ROOT, 'tff_adaptive')],
                                                  'tff_adaptive.')}
  files = {m for m in ALL_MODULES if m.startswith('tff_adaptive.')}
  assert names == files


# Below the binaries, functions take `workflow.flags.config.Settings`, one
# of its groups or plain keyword arguments. workflow/flags/config.py alone turns the
# flat {flag: value} into settings (and back, for flags.json).
FLAG_DICT_EXEMPT = {'workflow/flags/config.py'}
_FLAG_DICT_TEXT = re.compile(r'(?<![\w.])cfg(\[|\.get\()')


def flag_dict_uses(source: str, path: str) -> list[str]:
  """`path:line: what` for each `cfg[`, `cfg.get(` (anywhere in the text) and parameter `cfg`."""
  found = [f'{path}:{source.count(chr(10), 0, m.start()) + 1}: {m.group(0)}'
           for m in _FLAG_DICT_TEXT.finditer(source)]
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
      arguments = node.args
      for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                  arguments.vararg, arguments.kwarg]:
        if arg is not None and arg.arg == 'cfg':
          found.append(f'{path}:{arg.lineno}: parameter cfg of '
                       f'{getattr(node, "name", "lambda")}')
  return sorted(found)


def test_no_flag_dict_below_the_binaries():
  found = []
  for module, path in sorted(ALL_MODULES.items()):
    relative = os.path.relpath(path, ROOT)
    if relative in FLAG_DICT_EXEMPT:
      continue
    with open(path, encoding='utf-8') as f:
      found += flag_dict_uses(f.read(), relative)
  assert not found, ('bin/train\'s flags reach the code below bin/ as config.Settings (or a '
                     'group of it, or keyword arguments), not as the flag dict:\n' +
                     '\n'.join(found))


def test_flag_dict_check_can_fail():
  """The check above sees every shape of the flag dict, and not names that merely contain cfg."""
  planted = textwrap.dedent('''
      def build(task, cfg):
        return cfg['algorithm'], cfg.get('seed')
      DEFAULTS = {'fedavg': lambda cfg: {}}
      def run(*, cfg=None):
        pass
      def fine(settings, my_cfg, cfgs):
        return my_cfg['x'], settings.cfg[0], cfgs.get('y')
  ''')
  found = flag_dict_uses(planted, 'workflow/planted.py')
  assert [int(line.split(':')[1]) for line in found] == [2, 3, 3, 4, 5], found
  assert 'workflow/flags/config.py' in {os.path.relpath(p, ROOT) for p in ALL_MODULES.values()}


def _sibling_imports(folder: str) -> dict:
  """module → the modules of `folder` it imports by bare name (scripts that put
  their own folder on sys.path: reports/, bench/)."""
  path = os.path.join(ROOT, folder)
  names = {f[:-3] for f in os.listdir(path) if f.endswith('.py')}
  graph = {}
  for name in names:
    with open(os.path.join(path, name + '.py'), encoding='utf-8') as f:
      tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        found |= {a.name.split('.')[0] for a in node.names}
      elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        found.add(node.module.split('.')[0])
    graph[name] = (found & names) - {name}
  return graph


@pytest.mark.parametrize('folder', ['reports', 'bench'])
def test_no_import_cycles_among_the_scripts(folder):
  graph = _sibling_imports(folder)
  assert graph and any(graph.values()), graph  # the scripts do import each other
  cycle = _find_cycle(graph)
  assert cycle is None, f'{folder}: import cycle: ' + ' → '.join(cycle)
