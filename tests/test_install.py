"""The library as a user gets it: pip-installed into a fresh venv, used from outside.

One test, because the venv is the expensive part:
  * `pip install <checkout>` (pyproject.toml, the index bin/setup_env.sh uses)
    into a fresh venv that already holds the verified stack and TFF. The stack
    is the checkout's own .venv, linked in, not installed again:
    bin/setup_env.sh installed it at the start of `make test` exactly as
    docs/library.md's first two lines say, and installing it a second time
    here took 100 s of the suite. pip sees the stack's metadata, so it checks
    the package's declared dependencies against it and installs nothing else;
  * from an empty directory outside the checkout, only `tff_adaptive` is
    importable (not `tasks`, `workflow`, `bin`, `tests`, `conftest`);
  * examples/quickstart.py, copied there, runs: FedGBO with TFF's
    `build_adam`, FedAdam with paper semantics, Mime Lite and FedAda2 (SM3)
    on its own Keras model and `TestClientData`, 2 rounds each, each composed
    with `tff.learning.robust_aggregator` and
    `DifferentiallyPrivateFactory.gaussian_fixed`, evaluated with
    `build_fed_eval`, one of them under `tff.learning.programs.train_model`
    stopped and resumed through a `FileProgramStateManager`;
  * nothing is left in the run's TMPDIR, and no worker_binary outlives it.
"""

import os
import shutil
import subprocess
import sys

import pytest

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(cmd, **kwargs):
  result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
  assert result.returncode == 0, (cmd, result.stdout[-3000:], result.stderr[-5000:])
  return result


# Not linked from the stack: the venv's own installer, and the checkout's
# editable install of this package (the test installs the package itself).
_NOT_LINKED = ('pip', 'setuptools', '_distutils_hack', 'distutils-precedence.pth', '__editable__',
               'tff_adaptive', '__pycache__')


def _link_stack(py):
  """Links every distribution of this interpreter's site-packages but `_NOT_LINKED` into `py`'s."""
  site = lambda exe: _run([exe, '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
                          timeout=60).stdout.strip()
  ours, theirs = site(sys.executable), site(py)
  assert ours != theirs
  for name in sorted(os.listdir(ours)):
    if not name.startswith(_NOT_LINKED) and not os.path.exists(os.path.join(theirs, name)):
      os.symlink(os.path.join(ours, name), os.path.join(theirs, name))


def test_installed_package_runs_the_example_outside_the_checkout(tmp_path):
  venv = tmp_path / 'venv'
  _run([sys.executable, '-m', 'venv', str(venv)], timeout=300)
  py = str(venv / 'bin' / 'python')
  pip = [py, '-m', 'pip', 'install', '-q', '--disable-pip-version-check']
  _link_stack(py)
  stack = _run([py, '-m', 'pip', 'list', '--format=freeze'], timeout=120).stdout
  stack = stack.lower().replace('_', '-')
  assert 'tensorflow-federated==0.87.0' in stack and 'tff-adaptive' not in stack, stack
  # A copy, so that the build cannot see (or write into) the checkout.
  src = tmp_path / 'src'
  shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
      '.venv', '.git', '__pycache__', 'runs', 'demo_output', 'bench', 'reports', '*.egg-info',
      'build'))
  _run(pip + [str(src)], timeout=900)

  user = tmp_path / 'user_project'
  user.mkdir()
  shutil.copy(os.path.join(ROOT, 'examples', 'quickstart.py'), user / 'quickstart.py')
  shutil.rmtree(src)  # the installed package must not need its source tree
  tmp = tmp_path / 'tmp'
  tmp.mkdir()
  env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'VIRTUAL_ENV')}
  env.update(TMPDIR=str(tmp), TF_CPP_MIN_LOG_LEVEL='3')

  seen = _run([py, '-c', 'import importlib.util as u, tff_adaptive; '
               'print(tff_adaptive.__file__); '
               'print([n for n in ("tasks", "workflow", "bin", "tests", "conftest") '
               'if u.find_spec(n)])'], cwd=user, env=env, timeout=300).stdout.splitlines()
  assert str(venv) in seen[0] and seen[1] == '[]', seen

  program_dir = user / 'program'
  out = _run([py, 'quickstart.py', '--rounds=2', f'--program_dir={program_dir}'], cwd=user,
             env=env, timeout=1800).stdout
  lines = out.splitlines()
  for name in ('fedgbo', 'fedadam_paper', 'mimelite', 'fedada2'):
    for agg in ('mean', 'robust', 'dp'):
      assert any(l.split()[:2] == [name, agg] and '2 rounds' in l for l in lines), (name, agg, out)
  assert 'train_model: stopped after round 1, resumed to round 3' in out, out
  assert sorted(os.listdir(program_dir))[-1].endswith('3'), os.listdir(program_dir)
  assert os.listdir(tmp) == [], os.listdir(tmp)
  leftover = subprocess.run(['pgrep', '-f', str(venv) + '.*worker_binary'], capture_output=True,
                            text=True).stdout.split()
  assert not leftover, leftover
