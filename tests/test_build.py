"""BUILD covers every Python file with a Bazel target, and lists nothing stale."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ('tff_adaptive', 'tasks', 'workflow', 'bin', 'tests')


def _parse_build():
  """Evaluates BUILD with stand-ins for the Starlark rules it uses."""
  targets = {}

  def rule(kind):
    def record(name, srcs=(), deps=(), main=None, **kwargs):
      del kwargs
      assert name not in targets, f'duplicate target {name}'
      targets[name] = dict(kind=kind, srcs=list(srcs), deps=list(deps), main=main)
    return record

  with open(os.path.join(ROOT, 'BUILD')) as f:
    code = f.read()
  exec(compile(code, 'BUILD', 'exec'), {  # pylint: disable=exec-used
      'py_library': rule('py_library'), 'py_binary': rule('py_binary'),
      'py_test': rule('py_test'), 'package': lambda **kwargs: None})
  return targets


def _python_files():
  files = {'conftest.py'}
  for top in PACKAGES:
    for directory, _, names in os.walk(os.path.join(ROOT, top)):
      if '__pycache__' in directory:
        continue
      files.update(os.path.relpath(os.path.join(directory, n), ROOT)
                   for n in names if n.endswith('.py'))
  return files


def test_every_python_file_has_a_target():
  listed = {src for t in _parse_build().values() for src in t['srcs']}
  missing = sorted(_python_files() - listed)
  assert not missing, f'Python files without a BUILD target: {missing}'


def test_every_listed_source_and_dependency_exists():
  targets = _parse_build()
  for name, target in targets.items():
    for src in target['srcs']:
      assert os.path.isfile(os.path.join(ROOT, src)), f'{name}: missing source {src}'
    for dep in target['deps']:
      assert dep.lstrip(':') in targets, f'{name}: unknown dependency {dep}'


def test_build_is_generated_from_the_imports():
  result = subprocess.run([sys.executable, os.path.join(ROOT, 'bin', 'update_build.py'),
                           '--check'], capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr


def test_rule_kinds_match_file_roles():
  for name, target in _parse_build().items():
    src = target['srcs'][0]
    if os.path.basename(src).startswith('test_'):
      assert target['kind'] == 'py_test', name
    elif src.startswith('bin/') and src.endswith('.py') and not src.endswith('__init__.py'):
      assert target['kind'] == 'py_binary', name
    else:
      assert target['kind'] == 'py_library', name


@pytest.mark.skipif(shutil.which('bazel') is None, reason="Debian's bazel-bootstrap not installed")
def test_bazel_query_accepts_build():
  # --batch: no server left running; a fixed output root keeps reruns fast.
  result = subprocess.run(['bazel', '--batch', '--output_user_root=/tmp/tff_adaptive_bazel',
                           'query', '//...'],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert '//:bin_train' in result.stdout
