"""The vectorised cohort program's two nestings, timed in one process.

  steps_outside    the step loop outside, each step one tf.vectorized_map over
                   the clients (tff_adaptive/rounds/cohort_program.py)
  clients_outside  one tf.vectorized_map over each client's whole round, its
                   step loop inside (pfor converts that while loop)

whichever `cohort_program.steps_outside` picks for the model, forced while
each process is built (the program is traced at build).

FedAvg, `CohortExecution(mode='vectorized', jit_compile=...)`, the bench's
settings (bench/run.py). Per nesting: build seconds (tracing, pfor's
conversion), first-round seconds (graph optimisation, XLA), the median round
(padding plus `process.next`, interleaved reps), and the first-round update's
largest difference to the other nesting's. Load average before and after.

  .venv/bin/python bench/cohort_nesting.py --setting=mlp_50x10 --jit_compile=program
  .venv/bin/python bench/cohort_nesting.py --setting=mlp_50x10 --jit_compile=none
"""

import argparse
import contextlib
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_cohort  # pylint: disable=g-import-not-at-top
import bench_rounds  # pylint: disable=g-import-not-at-top
import bench_sections  # pylint: disable=g-import-not-at-top
import machine_info  # pylint: disable=g-import-not-at-top

from tff_adaptive.execution import runtime  # pylint: disable=g-import-not-at-top
from tff_adaptive.rounds import cohort_program  # pylint: disable=g-import-not-at-top


@contextlib.contextmanager
def _nesting(name):
  """The program's nesting while it is traced (`cohort_program.steps_outside`)."""
  original = cohort_program.steps_outside
  cohort_program.steps_outside = lambda view: name == 'steps_outside'
  try:
    yield
  finally:
    cohort_program.steps_outside = original


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--setting', default='mlp_50x10', choices=list(bench_rounds.SETTINGS))
  p.add_argument('--jit_compile', default='program', choices=['none', 'step', 'program'])
  p.add_argument('--nestings', default='steps_outside,clients_outside')
  p.add_argument('--reps', type=int, default=15)
  p.add_argument('--out', default='')
  args = p.parse_args(argv)
  runtime.use_local_cpp_context()
  setting = bench_rounds.Setting(*bench_rounds.SETTINGS[args.setting])
  jit = False if args.jit_compile == 'none' else args.jit_compile
  bench_cohort.EXECUTIONS['probe'] = dict(mode='vectorized', jit_compile=jit)
  load_before = machine_info.load_average()
  arrays, data_s = bench_cohort.client_arrays(setting)
  runners, result = {}, {'setting': args.setting, 'jit_compile': args.jit_compile}
  for name in args.nestings.split(','):
    t0 = time.perf_counter()
    with _nesting(name):
      process, _ = bench_cohort.build('fedavg', setting.task(),
                                      bench_rounds.run_config('fedavg', setting), 'probe')
    build_s = time.perf_counter() - t0
    initial = next(iter(runners.values())).initial_state if runners else None
    runner = bench_cohort.CohortRunner(process, build_s, arrays, data_s, initial)
    runner.first()
    runners[name] = runner
    result[name] = dict(build_s=build_s, first_round_s=runner.first_round_s)
    print(name, result[name], flush=True)
  times = bench_sections.interleaved(runners, args.reps)
  first = next(iter(runners.values()))
  for name, runner in runners.items():
    result[name]['round_s'] = float(np.median(times[name]))
    result[name]['round_times_s'] = times[name]
    result[name]['update_diff_to_first'] = bench_cohort.state_update_difference(
        first.initial_state, first.first_state, runner.first_state)[0]
  result['load_before'], result['load_after'] = load_before, machine_info.load_average()
  machine_info.print_and_save(result, args.out)


if __name__ == '__main__':
  main()
