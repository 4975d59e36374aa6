"""What an adaptive client step adds to FedAvg's: the reason behind "adaptive ≤ 1.1× FedAvg".

The cohort target "every adaptive algorithm ≤ 1.1× FedAvg (cohort)" is missed
in some settings (docs/performance.md). A cohort round is C·K client steps,
each a gradient (forward + backward) and the algorithm's `Recipe.local_step`.
This script times, in one process and interleaved:

  gradient   K gradients of the benchmark model on B-example batches
             (a tf.function over the weights as tensors, as the cohort
             program computes them);
  step:<alg> K calls of <alg>'s own `local_step` (the Recipe the cohort
             execution runs, taken from the registry's build) on fixed
             gradients, starting from its `init_local`.

Without XLA only: XLA compiling a loop over fixed gradients hoists every
gradient-only term (SM3's cover maxima of g², Adam's g²) out of the loop and
times a different program (seen in a first run).

and reports each algorithm's predicted round ratio
(gradient + step:<alg>) / (gradient + step:fedavg), the part of the
adaptive/FedAvg ratio that its client update alone explains.

Example (the committed JSON, under 5 minutes):
  .venv/bin/python bench/client_step_cost.py --models=mlp,cnn,so_lr
"""

import argparse
import collections
import os
import statistics
import sys
import time

import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# pylint: disable=g-import-not-at-top
import bench_rounds  # first: it puts the checkout on sys.path
import bench_cohort
import bench_results
import bench_sections
from tff_adaptive.rounds import functional

ALGORITHMS = ('fedavg', 'fedadam', 'fedgbo-adam', 'mfl-adam', 'fedada2-sm3')


def recipe_of(name: str, setting: bench_rounds.Setting):
  """The Recipe the registry's cohort build of `name` runs."""
  algorithm, _ = bench_rounds.ALGORITHMS[name]
  process, why = bench_cohort.build(algorithm, setting.task(),
                                    bench_rounds.run_config(name, setting),
                                    'cohort_seq')
  if process is None:
    raise ValueError(f'{name}: no cohort process ({why})')
  return process.recipe


def gradient_fn(setting: bench_rounds.Setting, steps: int):
  """K gradients of the model at fixed weights: the arithmetic every algorithm shares."""
  view = functional.FunctionalView(setting.model_fn)
  weights = [tf.convert_to_tensor(v) for v in setting.keras_fn().trainable_weights]
  # Ten batches in turn, so that no compiler can hoist the gradient out of the loop.
  batches = list(setting.client_dataset(0).take(10))
  stacked = tf.nest.map_structure(lambda *t: tf.stack(t), *batches)
  mask = tf.ones([setting.batch])

  @tf.function
  def k_gradients():
    total = tf.constant(0.0)
    for k in tf.range(steps):
      batch = tf.nest.map_structure(lambda t: tf.gather(t, k % len(batches)), stacked)
      grads, *_ = view.loss_and_grads(weights, batch, mask)
      total += tf.add_n([tf.reduce_sum(g) for g in grads])  # keeps every gradient live
    return total
  return k_gradients, weights


def local_steps_fn(recipe, weights, steps: int):
  """K `local_step`s from `init_local`, on fixed gradients."""
  specs = [tf.TensorSpec(w.shape, w.dtype) for w in weights]
  stats = recipe.init_stats(specs)
  grads = [0.01 * tf.random.stateless_normal(w.shape, (1, 2)) for w in weights]

  @tf.function
  def k_steps():
    local = recipe.initial_local(recipe.broadcast(stats), list(weights),
                                 recipe.initial_client_state(specs))
    y = list(weights)
    for k in tf.range(steps):
      local, y = recipe.local_step(local, y, grads, tf.constant(0.02), k)
      y = list(y)
    return tf.add_n([tf.reduce_sum(t) for t in y])
  return k_steps


def measure(model: str, clients: int, steps: int, batch: int, reps: int):
  setting = bench_rounds.Setting(model, clients, steps, batch)
  grad, weights = gradient_fn(setting, steps)
  fns = {'gradient': grad}
  for name in ALGORITHMS:
    fns[f'step:{name}'] = local_steps_fn(recipe_of(name, setting), weights, steps)
  for fn in fns.values():
    fn()  # trace
  times = bench_sections.interleaved({k: (lambda f=f: f().numpy()) for k, f in fns.items()}, reps)
  median = {k: statistics.median(v) for k, v in times.items()}
  base = median['gradient'] + median['step:fedavg']
  return collections.OrderedDict(
      model=model, batch=batch, steps_timed=steps, reps=reps,
      seconds_per_step={k: v / steps for k, v in median.items()},
      step_over_gradient={n: median[f'step:{n}'] / median['gradient'] for n in ALGORITHMS},
      predicted_ratio_to_fedavg={n: (median['gradient'] + median[f'step:{n}']) / base
                                 for n in ALGORITHMS})


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--models', default='mlp,cnn,so_lr')
  p.add_argument('--steps', type=int, default=100, help='steps per timed call')
  p.add_argument('--reps', type=int, default=7)
  p.add_argument('--out_dir', default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   'results'))
  args = p.parse_args(argv)
  results = []
  for model in (m for m in args.models.split(',') if m):
    batch = bench_rounds.SETTINGS.get(model, (None, None, None, 20))[3]
    results.append(measure(model, 10, args.steps, batch, args.reps))
    print(dict(results[-1]), flush=True)
  print(bench_results.write(args.out_dir, 'client_step_cost',
                            collections.OrderedDict(results=results)))


if __name__ == '__main__':
  main()
