"""Round time of our FedAvg vs TFF's FedAvg with each client-loop implementation.

  .venv/bin/python bench/loop_implementations.py [--clients=10] [--steps=10] [--reps=4]

One process, rounds interleaved (each process once per repetition), medians;
synthetic linear model of bench/run.py, where the fixed per-client cost of a
client computation dominates. It showed that the `dataset.reduce` loop (TFF's
default, and what autograph made of our `for batch in dataset`) costs ~3x the
iterator loop per client in TFF's C++ executor (docs/performance.md).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top,wrong-import-position

from bench import bench_rounds  # pylint: disable=g-import-not-at-top,wrong-import-position
from tff_adaptive.execution import runtime  # pylint: disable=g-import-not-at-top,wrong-import-position


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--clients', type=int, default=10)
  parser.add_argument('--steps', type=int, default=10)
  parser.add_argument('--reps', type=int, default=4)
  args = parser.parse_args()
  runtime.use_local_cpp_context()
  setting = bench_rounds.Setting('linear', args.clients, args.steps, 20)
  data = setting.python_datasets()
  processes = {
      f'tff_fedavg_{impl.name.lower()}': tff.learning.algorithms.build_weighted_fed_avg(
          setting.model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
          loop_implementation=impl)
      for impl in (tff.learning.LoopImplementation.DATASET_REDUCE,
                   tff.learning.LoopImplementation.DATASET_ITERATOR)}
  processes['ours_fedavg'] = bench_rounds.build_process('fedavg', setting)
  states = {name: p.initialize() for name, p in processes.items()}
  for name, p in processes.items():  # first round: tracing and compilation
    states[name] = p.next(states[name], data).state
  times = {name: [] for name in processes}
  for _ in range(args.reps):
    for name, p in processes.items():
      started = time.perf_counter()
      states[name] = p.next(states[name], data).state
      times[name].append(time.perf_counter() - started)
  print(f'load average {os.getloadavg()}')
  for name, values in times.items():
    print(f'{name:32s} {np.median(values):.3f} s/round (median of {args.reps})')


if __name__ == '__main__':
  main()
