"""Size limits of the code a newcomer reads: modules ≤ 500 lines, functions ≤ 80.

They hold in the library, the tasks, the workflow, the benchmarks, the reports,
the binaries and the tests (docs/development.md, "Size limits"): a module that outgrows
them is split by what it does, a function into its steps.
"""

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The directories docs/training.md's Layout maps module by module; the size limits hold in
# the tests too.
MAPPED = ('tff_adaptive', 'tasks', 'workflow', 'bench', 'reports', 'bin')
CHECKED = MAPPED + ('tests',)
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def _python_files(tops=CHECKED):
  for top in tops:
    for where, dirs, files in os.walk(os.path.join(ROOT, top)):
      # Not the package's code: caches, the peers' virtual environments and
      # bench/tmp (bench/peers.py's copies of the package; both gitignored).
      dirs[:] = [d for d in dirs if d != '__pycache__' and
                 not os.path.exists(os.path.join(where, d, 'pyvenv.cfg')) and
                 os.path.join(where, d) != os.path.join(ROOT, 'bench', 'tmp')]
      yield from (os.path.join(where, f) for f in sorted(files) if f.endswith('.py'))


def oversized(source: str, name: str) -> list[str]:
  """What in `source` breaks the limits, one line each (empty: nothing)."""
  found = []
  lines = source.count('\n') + (not source.endswith('\n') and bool(source))
  if lines > MAX_MODULE_LINES:
    found.append(f'{name}: {lines} lines > {MAX_MODULE_LINES}')
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      # From the first decorator: what a reader scrolls through.
      start = min([node.lineno] + [d.lineno for d in node.decorator_list])
      length = node.end_lineno - start + 1
      if length > MAX_FUNCTION_LINES:
        found.append(f'{name}:{start} {node.name}: {length} lines > {MAX_FUNCTION_LINES}')
  return found


def test_modules_and_functions_within_the_limits():
  found = []
  for path in _python_files():
    with open(path, encoding='utf-8') as f:
      found += oversized(f.read(), os.path.relpath(path, ROOT))
  assert not found, '\n'.join(found)


def test_the_size_check_can_fail():
  body = ''.join(f'  x{i} = {i}\n' for i in range(MAX_FUNCTION_LINES))
  long_function = f'@staticmethod\ndef f():\n{body}'
  assert oversized(long_function, 'm.py') == [f'm.py:1 f: {MAX_FUNCTION_LINES + 2} lines > 80']
  assert oversized('x = 1\n' * (MAX_MODULE_LINES + 1), 'm.py') == ['m.py: 501 lines > 500']
  assert not oversized('x = 1\n' * MAX_MODULE_LINES, 'm.py')


def _named_in(text: str, module: str) -> bool:
  return re.search(rf'\b{re.escape(module)}\b', text) is not None


def test_the_module_maps_name_every_module():
  """docs/training.md's Layout and rounds/__init__.py's map: where a newcomer
  finds each module by what it does."""
  with open(os.path.join(ROOT, 'docs', 'training.md')) as f:
    layout = f.read().split('## Layout', 1)[1].split('\n## ', 1)[0]
  with open(os.path.join(ROOT, 'tff_adaptive', 'rounds', '__init__.py')) as f:
    rounds_map = f.read()
  missing = []
  for path in _python_files(MAPPED):
    module = os.path.splitext(os.path.basename(path))[0]
    if module == '__init__':
      continue
    if not _named_in(layout, module):
      missing.append(f'docs/training.md Layout: {os.path.relpath(path, ROOT)}')
    if os.path.basename(os.path.dirname(path)) == 'rounds' and not _named_in(rounds_map, module):
      missing.append(f'tff_adaptive/rounds/__init__.py: {module}')
  assert not missing, missing
