"""TensorFlow's intra-op threads: bin/train's rule and the library's setter.

`--intra_op_threads=0` gives one thread exactly where a round runs a recurrent
model's clients as lanes (a recurrent task, the local cohort with `auto`'s or
vectorised clients and no XLA); `runtime.set_intra_op_threads` sets it before
TensorFlow's first op (and the variable its thread pools read), says False
after it, and refuses a negative count naming the argument.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from tff_adaptive.execution import runtime
from workflow.flags import config
from workflow.training import algorithm_builders

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize('flags, threads', [
    ({'task': 'shakespeare_character'}, 1),
    ({'task': 'stackoverflow_word', 'cohort_mode': 'vectorized', 'cohort_jit_compile': 'none'}, 1),
    ({'task': 'shakespeare_character', 'cohort_mode': 'sequential'}, 0),
    ({'task': 'shakespeare_character', 'cohort_jit_compile': 'step'}, 0),
    ({'task': 'shakespeare_character', 'execution': 'per_client'}, 0),
    ({'task': 'shakespeare_character', 'workers': 'localhost:1'}, 0),
    ({'task': 'digits'}, 0),
    ({'task': 'digits', 'intra_op_threads': 3}, 3),
])
def test_bin_train_gives_one_thread_where_recurrent_clients_run_as_lanes(flags, threads):
  assert algorithm_builders.intra_op_threads(config.from_flags(flags)) == threads


def test_set_before_the_first_op_and_not_after():
  script = textwrap.dedent(f'''
      import os, sys
      sys.path.insert(0, {ROOT!r})
      import tensorflow as tf
      from tff_adaptive.execution import runtime
      assert runtime.set_intra_op_threads(1)
      assert tf.config.threading.get_intra_op_parallelism_threads() == 1
      assert os.environ['TF_NUM_INTRAOP_THREADS'] == '1'
      tf.constant(1.0) + 1.0
      assert runtime.set_intra_op_threads(1)  # the same: nothing to change
      assert not runtime.set_intra_op_threads(2)
      assert runtime.set_intra_op_threads(0)  # the default: nothing asked
      print('ok')
  ''')
  done = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True,
                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'), check=False, timeout=300)
  assert done.stdout.strip().endswith('ok'), done.stderr[-2000:]
  with pytest.raises(ValueError, match='set_intra_op_threads: threads=-1 must be 0'):
    runtime.set_intra_op_threads(-1)
