"""One train step of the lane program's model pass, alone: ms per lane-step.

`tff_adaptive.rounds.lanes.LaneModel` on the Shakespeare task's GRU-128 (Embedding
90 → 8, 2 × GRU 128 returning every position, Dense 90; masked positions; T = 80,
B = 4), every lane with its own weights: forward, backward (the lanes' written-out
gradients) and an SGD step, as one `tf.function`, on L lanes, with one intra-op
thread (bin/train's setting where a recurrent task's clients run as lanes). Each
configuration runs in its own process (the thread count is fixed at TensorFlow's
first op); the median of --reps steps after a first, tracing one. `cores` is the
process's CPU time over the steps' wall time.

  .venv/bin/python bench/lane_step.py --lanes=1,4,14,50 --variants=tf,xla
"""

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, 'bench')]

import machine_info  # pylint: disable=g-import-not-at-top

STEP = '''
import json, os, statistics, sys, time
sys.path.insert(0, {root!r})
import tensorflow as tf
from tff_adaptive.execution import runtime
runtime.set_intra_op_threads(1)
from tasks.models import recurrent
from tff_adaptive.rounds import lanes
model = recurrent.create_gru_sequence_model(90, 80, 128, 0)
lane_model = lanes.LaneModel(model, {groups})
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction='none')

@tf.function(autograph=False, jit_compile={xla})
def step(weights, x, y):
  with tf.GradientTape() as tape:
    tape.watch(weights)
    loss = tf.reduce_sum(loss_fn(y, lane_model(weights, x)) * tf.cast(x > 0, tf.float32))
  return [w - 0.01 * g for w, g in zip(weights, tape.gradient(loss, weights))], loss

for count in {lanes}:
  weights = [tf.repeat(v[tf.newaxis], count, 0) for v in model.trainable_variables]
  x = tf.random.uniform([count, 4, 80], 1, 90, tf.int64, seed=1)
  y = tf.random.uniform([count, 4, 80], 1, 90, tf.int64, seed=2)
  step(weights, x, y)[1].numpy()
  walls, cpus = [], []
  for _ in range({reps}):
    wall, cpu = time.perf_counter(), time.process_time()
    step(weights, x, y)[1].numpy()
    walls.append(time.perf_counter() - wall); cpus.append(time.process_time() - cpu)
  print(json.dumps(dict(lanes=count, ms_per_lane_step=statistics.median(walls) * 1e3 / count,
                        cores=sum(cpus) / sum(walls))), flush=True)
'''


def run(variant: str, lanes: list[int], reps: int, groups: str) -> list[dict]:
  code = STEP.format(root=ROOT, xla=variant == 'xla', lanes=lanes, reps=reps,
                     groups=groups or None)
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
  return [dict(variant=variant, groups=groups or 'default', **json.loads(line))
          for line in out.stdout.splitlines() if line.startswith('{')]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--lanes', default='1,4,14,50')
  parser.add_argument('--variants', default='tf,xla')
  parser.add_argument('--groups', default='', help='LaneModel groups (default: one per core)')
  parser.add_argument('--reps', type=int, default=8)
  parser.add_argument('--out', default=os.path.join(ROOT, 'bench', 'results', 'lane_step.json'))
  args = parser.parse_args()
  lanes = [int(n) for n in args.lanes.split(',')]
  load_before = machine_info.load_average()
  rows = [row for variant in args.variants.split(',')
          for row in run(variant, lanes, args.reps, args.groups)]
  for row in rows:
    print(f"{row['variant']:4s} L={row['lanes']:3d} {row['ms_per_lane_step']:7.2f} ms per "
          f"lane-step, {row['cores']:.2f} cores")
  machine_info.print_and_save(dict(machine=machine_info.machine(), load_before=load_before,
                                   load_after=machine_info.load_average(), rows=rows), args.out)


if __name__ == '__main__':
  main()
