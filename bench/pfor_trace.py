"""The vectorised cohort's build with TF's pfor broadcast and with the package's.

  tf_own   TF 2.14's `_PforInput.expanddim_inputs_for_broadcast` (dynamic ranks)
  static   `tff_adaptive.rounds.pfor_trace.static_broadcast_ranks` (static ranks)

Each algorithm's `CohortExecution(mode='vectorized', jit_compile=...)` process is
built `--reps` times per method, the two methods alternated (tf_own, static,
static, tf_own, ...), all in one process; the build is tracing the shard program
(pfor's conversion) and the TFF computations around it. Per method the median
build seconds, and per algorithm the largest difference of the first round's
weight update between the two.
Load average before and after.

  .venv/bin/python bench/pfor_trace.py --setting=mlp_50x10 --algorithms=fedavg,mimelite
"""

import argparse
import contextlib
import json
import os
import sys
import time
from unittest import mock

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_cohort  # pylint: disable=g-import-not-at-top
import bench_rounds  # pylint: disable=g-import-not-at-top
import machine_info  # pylint: disable=g-import-not-at-top

from tff_adaptive.execution import runtime  # pylint: disable=g-import-not-at-top
from tff_adaptive.rounds import pfor_trace  # pylint: disable=g-import-not-at-top

METHODS = {
    'static': contextlib.nullcontext,
    # The package's builds enter `static_broadcast_ranks`; for TF's own it does nothing.
    'tf_own': lambda: mock.patch.object(pfor_trace, 'static_broadcast_ranks',
                                        contextlib.nullcontext),
}


def _build(algorithm, setting, method):
  t0 = time.perf_counter()
  with METHODS[method]():
    process, why = bench_cohort.build(algorithm, setting.task(),
                                      bench_rounds.run_config(algorithm, setting), 'probe')
  if process is None:
    raise SystemExit(f'{algorithm}: no cohort ({why})')
  return process, time.perf_counter() - t0


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--setting', default='mlp_50x10', choices=list(bench_rounds.SETTINGS))
  p.add_argument('--algorithms', default='fedavg,mimelite')
  p.add_argument('--jit_compile', default='none', choices=['none', 'step', 'program'])
  p.add_argument('--reps', type=int, default=2)
  p.add_argument('--out', default='')
  args = p.parse_args(argv)
  runtime.use_local_cpp_context()
  setting = bench_rounds.Setting(*bench_rounds.SETTINGS[args.setting])
  bench_cohort.EXECUTIONS['probe'] = dict(
      mode='vectorized', jit_compile=False if args.jit_compile == 'none' else args.jit_compile)
  result = {'setting': args.setting, 'jit_compile': args.jit_compile,
            'load_before': machine_info.load_average()}
  arrays, data_s = bench_cohort.client_arrays(setting)
  order = [('tf_own', 'static'), ('static', 'tf_own')]
  for algorithm in args.algorithms.split(','):
    builds, runners = {m: [] for m in METHODS}, {}
    for rep in range(args.reps):
      for method in order[rep % 2]:
        process, seconds = _build(algorithm, setting, method)
        builds[method].append(seconds)
        if method not in runners:  # the first round of each, from the same state
          initial = next(iter(runners.values())).initial_state if runners else None
          runners[method] = bench_cohort.CohortRunner(process, seconds, arrays, data_s, initial)
          runners[method].first()
    result[algorithm] = {m: dict(build_s=float(np.median(b)), builds_s=b)
                         for m, b in builds.items()}
    own = runners['tf_own']
    result[algorithm]['first_update_diff'] = bench_cohort.state_update_difference(
        own.initial_state, own.first_state, runners['static'].first_state)[0]
    print(algorithm, json.dumps(result[algorithm]), flush=True)
  result['load_after'] = machine_info.load_average()
  machine_info.print_and_save(result, args.out)


if __name__ == '__main__':
  main()
