"""Building the package leaves the checkout as it was: `pip wheel .` of a clone
writes no build/ or *.egg-info/ into it (pyproject.toml's backend, build_tools/clean_backend.py).
"""

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIT = ['git', '-c', 'user.email=test@example.com', '-c', 'user.name=test']


def _run(cmd, cwd, timeout=300, stdin=None):
  result = subprocess.run(cmd, cwd=cwd, input=stdin, capture_output=True, text=True,
                          timeout=timeout)
  assert result.returncode == 0, (cmd, result.stdout[-3000:], result.stderr[-3000:])
  return result.stdout


def _clone_of_the_working_tree(dest):
  """The checkout's tracked and new files as they are now, committed in a fresh repository."""
  files = _run(['git', 'ls-files', '-z', '--cached', '--others', '--exclude-standard'], ROOT)
  copied = [n for n in filter(None, files.split('\0')) if os.path.isfile(os.path.join(ROOT, n))]
  for name in copied:
    os.makedirs(os.path.dirname(os.path.join(dest, name)), exist_ok=True)
    shutil.copy2(os.path.join(ROOT, name), os.path.join(dest, name))
  _run(GIT + ['init', '-q'], dest)
  # -f: files a .gitignore hides but the checkout tracks (added with `git add -f`, as
  # reports/shakespeare_runs/.gitignore's resumable checkpoints are) stay tracked, as in a clone.
  _run(GIT + ['add', '-f', '--pathspec-from-file=-', '--pathspec-file-nul'], dest,
       stdin='\0'.join(copied))
  _run(GIT + ['commit', '-q', '-m', 'copy'], dest)


def test_pip_wheel_leaves_the_checkout_clean(tmp_path):
  clone, wheels = tmp_path / 'clone', tmp_path / 'wheels'
  clone.mkdir()
  _clone_of_the_working_tree(str(clone))
  assert _run(['git', 'status', '--porcelain', '--ignored'], str(clone)) == ''
  _run([sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation',
        '--disable-pip-version-check', '-q', '-w', str(wheels), '.'], str(clone))
  # --ignored: not even files that a .gitignore would hide.
  assert _run(['git', 'status', '--porcelain', '--ignored'], str(clone)) == ''
  (wheel,) = os.listdir(wheels)
  names = zipfile.ZipFile(wheels / wheel).namelist()
  assert 'tff_adaptive/algorithms/composer.py' in names
  assert not [n for n in names if n.split('/')[0] in ('build_tools', 'workflow', 'tasks', 'tests')]


def test_a_users_own_build_directory_is_left_alone(tmp_path):
  clone = tmp_path / 'clone'
  clone.mkdir()
  _clone_of_the_working_tree(str(clone))
  (clone / 'build').mkdir()
  (clone / 'build' / 'mine.txt').write_text('kept')
  _run([sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation',
        '--disable-pip-version-check', '-q', '-w', str(tmp_path / 'wheels'), '.'], str(clone))
  assert (clone / 'build' / 'mine.txt').read_text() == 'kept'
