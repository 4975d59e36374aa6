"""Every report script starts: `--help` exits 0 (its imports resolve from any directory).

The report scripts run for hours and are rerun rarely, so an import they lost
(reports/fedada2_report.py once could not find `tasks`) shows only then; this
starts each one as a user would, from outside the checkout.
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPORTS = os.path.join(ROOT, 'reports')


def _scripts():
  for name in sorted(os.listdir(REPORTS)):
    if name.endswith('.py'):
      with open(os.path.join(REPORTS, name)) as f:
        if "__name__ == '__main__'" in f.read():
          yield name


@pytest.mark.parametrize('script', list(_scripts()))
def test_help_exits_0_from_outside_the_checkout(script, tmp_path):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  env.pop('PYTHONPATH', None)
  result = subprocess.run([sys.executable, os.path.join(REPORTS, script), '--help'],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  assert 'usage' in result.stdout.lower(), result.stdout[-500:]
