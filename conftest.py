"""Puts the checkout first on sys.path (its `tff_adaptive`, `tasks`, `workflow`).

The test session is a program like bin/train: it asks for TFF worker tracking
explicitly (`runtime.track_tff_workers`); importing the library does nothing.
tests/test_layering.py checks that in fresh interpreters.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import pytest


# Files holding the longest tests (a pip install, many in-process bin/train
# runs) go first: `-n 3` hands out tests in collection order, and a
# long test collected last keeps one worker busy long after the other is idle.
# Whole files move, so module-scoped fixtures are still set up once.
_LONG_FILES_FIRST = ('test_install.py', 'test_train_workflow.py', 'test_train_cli.py',
                     'test_cohort.py', 'test_library_docs.py', 'test_round_schedules.py',
                     'test_tasks_docs.py', 'test_shakespeare_build.py', 'test_workers.py',
                     'test_cohort_workers.py')


def pytest_collection_modifyitems(session, config, items):
  del session, config
  rank = {name: i for i, name in enumerate(_LONG_FILES_FIRST)}
  items.sort(key=lambda item: rank.get(os.path.basename(str(item.fspath)), len(rank)))


def pytest_configure(config):
  del config
  from tff_adaptive.execution import runtime  # pylint: disable=g-import-not-at-top
  runtime.track_tff_workers()


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


@pytest.fixture(autouse=True, scope='session')
def _children_tmpdir(tmp_path_factory):
  """The tests' children make their temporary files inside pytest's tree (pruned by pytest).

  A child killed with SIGKILL (the kill -9 tests) cannot remove the private
  worker-log directory it made (`runtime.private_log_dir`): in the system's
  temporary directory, every run of the suite left a few behind.
  """
  before = os.environ.get('TMPDIR')
  os.environ['TMPDIR'] = str(tmp_path_factory.mktemp('children_tmp'))
  yield
  if before is None:
    os.environ.pop('TMPDIR')
  else:
    os.environ['TMPDIR'] = before


@pytest.fixture(scope='module')
def local_cpp_context():
  """TFF's local C++ context for a test module (`pytestmark = usefixtures(...)`)."""
  from tff_adaptive.execution import runtime  # pylint: disable=g-import-not-at-top
  runtime.use_local_cpp_context()
  yield
  runtime.shutdown_workers()
