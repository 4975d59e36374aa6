"""Every bench script's references into its sibling bench modules exist.

Some bench scripts run only where `perf` or the peer environments exist (CI has
perf; this machine may not), so a rename in bench/run.py can break them unseen.
This reads the sources (no TensorFlow): for each `import sibling as alias`, each
`alias.name` must be defined at the sibling's top level.
"""

import ast
import os

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'bench')


def _tree(name):
  with open(os.path.join(BENCH, name + '.py')) as f:
    return ast.parse(f.read())


def _top_level_names(tree) -> set:
  names = set()
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
      names.add(node.name)
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      for target in targets:
        names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      names.update((a.asname or a.name).split('.')[0] for a in node.names)
  return names


def _sibling_aliases(tree, siblings) -> dict:
  aliases = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for a in node.names:
        if a.name in siblings:
          aliases[a.asname or a.name] = a.name
  return aliases


SCRIPTS = sorted(f[:-3] for f in os.listdir(BENCH) if f.endswith('.py'))


def _missing(script) -> list:
  tree = _tree(script)
  aliases = _sibling_aliases(tree, set(SCRIPTS))
  defined = {alias: _top_level_names(_tree(module)) for alias, module in aliases.items()}
  return sorted(
      f'{script}.py:{node.lineno} {node.value.id}.{node.attr}' for node in ast.walk(tree)
      if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
      and node.value.id in aliases and node.attr not in defined[node.value.id])


@pytest.mark.parametrize('script', SCRIPTS)
def test_references_into_sibling_modules_exist(script):
  assert not _missing(script)


def test_the_check_sees_a_missing_name(tmp_path, monkeypatch):
  """The probe can fail: a script naming run._load, which run.py does not define."""
  (tmp_path / 'run.py').write_text('def load_average():\n  return []\n')
  (tmp_path / 'user.py').write_text('import run as bench\nbench.load_average()\nbench._load()\n')
  monkeypatch.setattr(__import__(__name__), 'BENCH', str(tmp_path))
  monkeypatch.setattr(__import__(__name__), 'SCRIPTS', ['run', 'user'])
  assert _missing('user') == ['user.py:3 bench._load']
