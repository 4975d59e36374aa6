"""One place lists every patch of TFF internals, with the TFF version it targets."""

import ast
import importlib
import inspect
import os

import tensorflow_federated as tff

from tff_adaptive.execution import tff_patches

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARY = os.path.join(ROOT, 'tff_adaptive')


def test_the_installed_tff_is_the_version_the_patches_target():
  assert tff.__version__ == tff_patches.TFF_VERSION


def test_every_listed_patch_names_an_existing_target_and_its_function():
  for patch in tff_patches.PATCHES:
    owner = importlib.import_module(patch.module)
    names = patch.attribute.split('.')
    while names and hasattr(owner, names[0]):
      owner = getattr(owner, names.pop(0))
    if patch.per_instance:  # set on objects of a local class: it is in the source
      source = inspect.getsource(owner)
      assert names and f'class {names[0]}' in source and names[-1] in source, patch
    else:
      assert not names, patch
    assert callable(getattr(tff_patches, patch.applied_by)), patch
    assert patch.why, patch


def _tff_names(tree: ast.AST) -> set[str]:
  """Names a module binds to TFF modules or objects by importing them."""
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names |= {(a.asname or a.name).split('.')[0] for a in node.names
                if a.name.startswith('tensorflow_federated')}
    elif isinstance(node, ast.ImportFrom) and (node.module or '').startswith(
        'tensorflow_federated'):
      names |= {a.asname or a.name for a in node.names}
  return names


def _root(node: ast.AST):
  while isinstance(node, ast.Attribute):
    node = node.value
  return node.id if isinstance(node, ast.Name) else None


def patches_outside(path: str, source: str) -> list[str]:
  """Assignments to (or setattr on) an attribute of something imported from TFF."""
  tree = ast.parse(source, path)
  tff_names, found = _tff_names(tree), []
  for node in ast.walk(tree):
    targets = node.targets if isinstance(node, ast.Assign) else []
    for target in targets:
      if isinstance(target, ast.Attribute) and _root(target) in tff_names:
        found.append(f'{path}:{node.lineno}')
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and
        node.func.id == 'setattr' and node.args and _root(node.args[0]) in tff_names):
      found.append(f'{path}:{node.lineno}')
  return found


def test_no_module_but_tff_patches_assigns_to_tff():
  found = []
  for directory, _, names in os.walk(LIBRARY):
    for name in names:
      path = os.path.join(directory, name)
      if name.endswith('.py') and path != tff_patches.__file__:
        with open(path) as f:
          found += patches_outside(os.path.relpath(path, ROOT), f.read())
  assert not found, f'patches of TFF outside tff_patches.py (list them there): {found}'


def test_the_scan_finds_a_patch():
  """The check above can fail: it sees a planted module and a setattr patch."""
  planted = ('from tensorflow_federated.python.core.impl.executors import value_serialization '
             'as vs\nimport tensorflow_federated as tff\nvs._serialize_struct_type = None\n'
             'setattr(tff.learning, "x", 1)\n')
  assert patches_outside('planted.py', planted) == ['planted.py:3', 'planted.py:4']
  with open(tff_patches.__file__) as f:
    assert patches_outside('tff_patches.py', f.read())  # where they are
