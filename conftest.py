"""Puts the repository root on sys.path so `tff_adaptive`, `tasks` and `bin` import."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import pytest


@pytest.fixture(autouse=True)
def _reset_tf_global_seed():
  """Keeps one test's `tf.random.set_seed` from changing later tests' shuffles.

  Eager-built datasets take the global seed into their shuffle seed while
  datasets built inside TFF computations (graphs) do not, so a leaked seed
  makes "data sent" and "data built on workers" differ.
  """
  yield
  tf = sys.modules.get('tensorflow')
  if tf is not None:
    tf.random.set_seed(None)
