"""docs/library.md runs: its python blocks, in order, as one program (a fresh interpreter)."""

import os
import re
import subprocess
import sys

import pytest

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, 'docs', 'library.md')


def blocks() -> list[str]:
  with open(DOC) as f:
    return re.findall(r'^```python\n(.*?)^```', f.read(), flags=re.S | re.M)


def test_doc_has_an_example_per_builder():
  code = '\n'.join(blocks())
  algorithms = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, 'tff_adaptive', 'algorithms'))
                      if f.endswith('.py')
                      and f not in ('__init__.py', 'composer.py', 'names.py', 'server_optimizers.py',
                                    'validation.py'))
  # MTFL and pFedMe share Per-FedAvg's PersonalizedClientsProcess usage (shown once).
  missing = [a for a in algorithms
             if f'build_{a}(' not in code and a not in ('mtfl', 'pfedme')]
  assert not missing, f'docs/library.md has no runnable example of: {missing}'


def test_doc_examples_run(tmp_path):
  program = '\n\n'.join(blocks())
  env = dict(os.environ, TMPDIR=str(tmp_path), TF_CPP_MIN_LOG_LEVEL='3',
             PYTHONPATH=ROOT)  # this checkout's library, as installed editable
  result = subprocess.run([sys.executable, '-c', program], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=1500)
  assert result.returncode == 0, result.stderr[-5000:]
  out = result.stdout
  assert 'client steps with K=2: 6.0' in out, out
  assert 'fedgbo cannot take the client optimiser' in out, out  # names builder and optimiser
  assert "'distributor'" in out and "'finalizer'" in out, out
  assert 'train_model versions [0, 1] [0, 1, 2, 3]' in out, out
  assert 'scaffold cohort, c_1 leaves: 4' in out, out  # two Dense layers' kernels and biases
  assert 'feddyn h leaves: 4' in out, out
