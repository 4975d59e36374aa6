"""The library as a user gets it (issue 16): pip-installed into a fresh venv, used from outside.

One test, because the venv is the expensive part (the pinned stack's wheels
come from pip's cache; the index is the one bin/setup_env.sh uses):
  * `pip install <checkout>` (pyproject.toml) after the verified stack and TFF
    with --no-deps, exactly as docs/library.md says;
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(cmd, **kwargs):
  result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
  assert result.returncode == 0, (cmd, result.stdout[-3000:], result.stderr[-5000:])
  return result


def test_installed_package_runs_the_example_outside_the_checkout(tmp_path):
  venv = tmp_path / 'venv'
  _run([sys.executable, '-m', 'venv', str(venv)], timeout=300)
  py = str(venv / 'bin' / 'python')
  pip = [py, '-m', 'pip', 'install', '-q', '--disable-pip-version-check']
  _run(pip + ['-r', os.path.join(ROOT, 'requirements.txt')], timeout=1800)
  _run(pip + ['--no-deps', '-r', os.path.join(ROOT, 'requirements-tff.txt')], timeout=600)
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
