"""How well-conditioned a benchmark round is: the floor under the cohort-vs-per-client differences.

The cohort benchmarks compare each cohort execution's first round with the
per-client round on the same state and batches. On the EMNIST CNN some rows
differ by more than 1e-5 (FedAvg 3.6e-5, FedAdA²-SM3 9e-5, and 6.2e-2 with
`jit_compile='program'`, bench/results/overhead_cnn_s10.json). This script
measures whether such a difference is a defect of the cohort execution or the
round's own sensitivity to float32 rounding, in one process, per local-step
count K:

  perturbed_1e-7, perturbed_1e-6  the PER-CLIENT round run again from initial
                 weights multiplied by (1 + r·N(0, 1)), r = 1e-7 (about one
                 float32 ulp) and 1e-6: how far rounding-level changes of the
                 input move the same program's output.
  <execution>    the cohort execution (bench_cohort.EXECUTIONS) from the
                 unperturbed state: its difference to the per-client round.

Both are reported as the max |Δ − Δ_per-client| of the first round's model
update and as the max relative difference of the server optimiser state
(for the FedOpt-family server, m = (1 − β1)·Δ̄: the clients' mean update
before the server's adaptive step, which amplifies small Δ̄ by up to η_s/τ).
A cohort difference below the 1e-7 perturbation's is at the floor the
problem itself sets: no implementation of the same float32 arithmetic in a
different order can be expected to come closer.

Example (the committed JSON; ~20 minutes on 2 cores):
  .venv/bin/python bench/conditioning.py --algorithms=fedada2-sm3,fedavg \\
      --steps=1,3,10 --executions=cohort_seq,cohort_seq_xlaprog
"""

import argparse
import collections
import os
import sys

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# pylint: disable=g-import-not-at-top
import bench_rounds  # first: it puts the checkout on sys.path
import bench_cohort
import bench_results
from tff_adaptive.execution import runtime

PERTURBATIONS = (1e-7, 1e-6)


def _server_tensors(state):
  """The server optimiser's non-scalar state (empty for plain SGD)."""
  return [np.asarray(t, np.float64) for t in tf.nest.flatten(state.finalizer)
          if np.asarray(t).size > 1]


def difference(start, reference, other, other_start=None):
  """(max |Δ − Δ_ref| of the update, max |Δ_ref|, max relative server-state difference)."""
  update, scale = bench_cohort.state_update_difference(start, reference, other, other_start)
  server = [float(np.max(np.abs(a - e)) / max(np.max(np.abs(e)), 1e-30))
            for a, e in zip(_server_tensors(other), _server_tensors(reference))]
  return update, scale, (max(server) if server else None)


def perturbed(state, relative: float, seed: int = 0):
  """`state` with its trainable weights multiplied by (1 + relative·N(0, 1))."""
  rng = np.random.default_rng(seed)
  weights = state.global_model_weights
  trainable = [(np.asarray(t) * (1 + relative * rng.standard_normal(np.shape(t)))).astype(
      np.asarray(t).dtype) for t in weights.trainable]
  return tff.learning.templates.LearningAlgorithmState(
      tff.learning.models.ModelWeights(trainable, list(weights.non_trainable)),
      state.distributor, state.client_work, state.aggregator, state.finalizer)


def measure(name: str, setting: bench_rounds.Setting, executions) -> list:
  reference = bench_rounds.Runner(name, setting, 'python')
  reference.first()
  start, first = reference.initial_state, reference.first_state
  rows = []

  def row(kind, diffs):
    update, scale, server = diffs
    rows.append(collections.OrderedDict(
        algorithm=name, steps=setting.steps, compared=kind, update_max_abs_diff=update,
        update_max_abs=scale, server_state_max_rel_diff=server))
    print(dict(rows[-1]), flush=True)

  for relative in PERTURBATIONS:
    moved = perturbed(start, relative)
    out = reference.process.next(moved, reference.client_data())
    row(f'perturbed_{relative:g}', difference(start, first, out.state, moved))
  arrays, data_s = bench_cohort.client_arrays(setting)
  algorithm, _ = bench_rounds.ALGORITHMS[name]
  for key in executions:
    process, why = bench_cohort.build(algorithm, setting.task(),
                                      bench_rounds.run_config(name, setting), key)
    if process is None:
      print(f'{name}@{key}: not run ({why})', flush=True)
      continue
    runner = bench_cohort.CohortRunner(process, 0.0, arrays, data_s, start)
    runner.first()
    row(key, difference(start, first, runner.first_state))
  return rows


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--model', default='cnn', choices=sorted(bench_rounds.MODELS))
  p.add_argument('--clients', type=int, default=10)
  p.add_argument('--batch', type=int, default=20)
  p.add_argument('--steps', default='1,3,10', help='comma list of local step counts K')
  p.add_argument('--algorithms', default='fedada2-sm3,fedavg')
  p.add_argument('--executions', default='cohort_seq,cohort_seq_xlaprog')
  p.add_argument('--out_dir', default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   'results'))
  p.add_argument('--tag', default='cnn')
  args = p.parse_args(argv)
  runtime.use_local_cpp_context()
  executions = [e for e in args.executions.split(',') if e]
  unknown = [e for e in executions if e not in bench_cohort.EXECUTIONS]
  if unknown:
    p.error(f'--executions: unknown {", ".join(unknown)}; one of {", ".join(bench_cohort.EXECUTIONS)}')
  rows = []
  for steps in (int(s) for s in args.steps.split(',') if s):
    setting = bench_rounds.Setting(args.model, args.clients, steps, args.batch)
    for name in (a for a in args.algorithms.split(',') if a):
      rows.extend(measure(name, setting, executions))
  path = bench_results.write(args.out_dir, f'conditioning_{args.tag}', collections.OrderedDict(
      model=args.model, clients=args.clients, batch=args.batch,
      perturbations=list(PERTURBATIONS), rows=rows))
  print(path)


if __name__ == '__main__':
  main()
