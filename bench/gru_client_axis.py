"""How fast a hand-written GRU with the client axis on its weights runs a cohort round.

The bench's `gru` setting (bench/run.py: the Shakespeare GRU of bench_models.py, 10
clients x 10 SGD steps x batch 4, learning rate 0.02), in one process:

  raw            bench_rounds.py's `build_raw`: the clients one after another, Keras' GRU
  scan           every weight stacked on a leading client axis C; per layer the input
                 projection of all 80 positions as one einsum, then `tf.scan` over the
                 positions with the recurrent matmul batched over the clients
                 ([C,B,H] x [C,H,3H]) and Keras' reset_after GRU arithmetic; the gradient
                 of the sum of the clients' losses; one `tf.function` per round
  scan_xla       the same round compiled by XLA (jit_compile=True)
  unrolled       the positions a Python loop, no XLA (--variants)

Each variant's per-client weights after the round are checked against the raw loop's
(each client run alone through `build_raw`) before it is timed; the first call (trace and
compile) and the median of --reps interleaved rounds are reported, with the load, and a
breakdown of the fastest agreeing variant (forward, forward + backward, the recurrent
matmuls alone, one op's cost in a loop). Regenerate bench/results/gru_client_axis.json:

  .venv/bin/python bench/gru_client_axis.py
"""

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, 'bench')]
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# pylint: disable=g-import-not-at-top
import numpy as np
import tensorflow as tf

import bench_models
import bench_rounds
import bench_sections

OUT = os.path.join(ROOT, 'bench', 'results', 'gru_client_axis.json')
VARIANTS = {'scan': (False, False), 'scan_xla': (False, True), 'unrolled': (True, False),
            'unrolled_xla': (True, True)}
TOLERANCE = 1e-5


def gru_layer(inputs, kernel, recurrent, bias, unroll):
  """Keras' GRU (reset_after=True) over time-major inputs [T,C,B,I] -> [T,C,B,H]."""
  projected = tf.einsum('tcbi,cij->tcbj', inputs, kernel) + bias[:, None, 0]
  recurrent_bias = bias[:, None, 1]

  def cell(h, x):
    inner = tf.matmul(h, recurrent) + recurrent_bias
    x_z, x_r, x_h = tf.split(x, 3, axis=-1)
    r_z, r_r, r_h = tf.split(inner, 3, axis=-1)
    z = tf.sigmoid(x_z + r_z)
    r = tf.sigmoid(x_r + r_r)
    return z * h + (1 - z) * tf.tanh(x_h + r * r_h)

  h = tf.zeros_like(projected[0, ..., :recurrent.shape[1]])
  if not unroll:
    return tf.scan(cell, projected, initializer=h)
  outputs = []
  for x in tf.unstack(projected):
    h = cell(h, x)
    outputs.append(h)
  return tf.stack(outputs)


def client_losses(weights, x, y, unroll):
  """Each client's mean cross-entropy over its batch's positions: x, y [C,B,T] -> [C]."""
  embedding, k1, r1, b1, k2, r2, b2, dense, dense_bias = weights
  h = tf.transpose(tf.gather(embedding, x, batch_dims=1), [2, 0, 1, 3])
  h = gru_layer(gru_layer(h, k1, r1, b1, unroll), k2, r2, b2, unroll)
  logits = tf.einsum('tcbh,chv->tcbv', h, dense) + dense_bias[:, None]
  labels = tf.transpose(y, [2, 0, 1])
  losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
  return tf.reduce_mean(losses, axis=[0, 2])


def gradients(weights, x, y, unroll):
  # The sum's gradient wrt client c's slice is client c's own gradient.
  with tf.GradientTape() as tape:
    tape.watch(weights)
    loss = tf.reduce_sum(client_losses(weights, x, y, unroll))
  return [tf.convert_to_tensor(g) for g in tape.gradient(loss, weights)]


def build_round(steps, unroll, jit):
  def round_fn(weights, x, y):
    weights = list(weights)
    for k in tf.range(steps):
      grads = gradients(weights, x[:, k], y[:, k], unroll)
      weights = [w - bench_rounds.LEARNING_RATE * g for w, g in zip(weights, grads)]
    return weights
  return tf.function(round_fn, jit_compile=jit)


def cohort_inputs(setting):
  """Initial weights tiled over the clients, and x, y as [C,K,B,T]."""
  initial = [w.numpy() for w in setting.keras_fn().trainable_variables]
  stacked = [tf.constant(np.stack([w] * setting.clients)) for w in initial]
  xs, ys = zip(*(setting.client_tensors(c) for c in range(setting.clients)))
  shape = (setting.clients, setting.steps, setting.batch) + setting.shape
  return stacked, tf.reshape(tf.stack(xs), shape), tf.reshape(tf.stack(ys), shape)


class _OneClient(bench_rounds.Setting):
  """Client `which`'s data as a one-client setting, so `build_raw` runs it alone."""

  def __init__(self, which, models):
    model, _, steps, batch = bench_rounds.SETTINGS['gru']
    super().__init__(model, 1, steps, batch)
    self.which, self.models, keras_fn = which, models, self.keras_fn
    self.keras_fn = lambda: models.append(keras_fn()) or models[-1]

  def client_tensors(self, seed):
    return super().client_tensors(self.which)


def raw_client_weights(clients):
  """Each client's weights after the raw loop's round, one `build_raw` per client."""
  out = []
  tf.get_logger().setLevel('ERROR')  # one trace per client is the point: no retracing warning
  for c in range(clients):
    models = []
    bench_rounds.build_raw(_OneClient(c, models))()
    out.append([v.numpy() for v in models[0].trainable_variables])
  return [np.stack(ws) for ws in zip(*out)]


def timed_first(fn):
  t0 = time.perf_counter()
  out = fn()
  return out, time.perf_counter() - t0


def median_of(fn, reps):
  fn()
  return statistics.median(bench_sections.interleaved({'f': fn}, reps)['f'])


def breakdown(setting, weights, x, y, unroll, jit, reps):
  """Per-step pieces of the round, each its own tf.function (seconds, medians)."""
  c, b, h = setting.clients, setting.batch, bench_models.GRU_UNITS
  t = setting.shape[0]
  x0, y0 = x[:, 0], y[:, 0]
  fwd = tf.function(lambda w: client_losses(w, x0, y0, unroll), jit_compile=jit)
  grad = tf.function(lambda w: gradients(w, x0, y0, unroll), jit_compile=jit)
  hs = tf.random.normal((c, b, h))
  rec = tf.random.normal((c, h, 3 * h))
  big = tf.random.normal((c, b * t, h))

  def matmul_loop(h0, r):
    def body(i, acc):
      return i + 1, acc + tf.matmul(h0, r)
    return tf.while_loop(lambda i, _: i < t, body, (0, tf.zeros((c, b, 3 * h))))[1]

  def matmul_grad_loop(h0, r):
    # A cell's recurrent matmul and the two its gradient needs (wrt h and wrt R).
    def body(i, dh, dr):
      g = tf.matmul(h0, r)
      return (i + 1, dh + tf.matmul(g, r, transpose_b=True),
              dr + tf.matmul(h0, g, transpose_a=True))
    return tf.while_loop(lambda i, *_: i < t, body, (0, tf.zeros_like(h0), tf.zeros_like(r)))[1:]

  def add_loop(h0):
    def body(i, acc):
      return i + 1, acc + h0
    return tf.while_loop(lambda i, _: i < t, body, (0, tf.zeros_like(h0)))[1]

  pieces = {
      'forward_step': lambda: fwd(weights),
      'forward_backward_step': lambda: grad(weights),
      'recurrent_matmuls_80': tf.function(lambda: matmul_loop(hs, rec), jit_compile=jit),
      'recurrent_matmuls_fwd_bwd_80': tf.function(lambda: matmul_grad_loop(hs, rec),
                                                  jit_compile=jit),
      'one_matmul_same_flops': tf.function(lambda: tf.matmul(big, rec), jit_compile=jit),
      'add_loop_80': tf.function(lambda: add_loop(tf.matmul(hs, rec)), jit_compile=jit),
  }
  out = {k: median_of(f, reps) for k, f in pieces.items()}
  if not jit and not unroll:
    out['ops_per_step_in_position_loops'] = t * loop_body_ops(grad.get_concrete_function(weights))
  flops = 2 * t * c * b * h * 3 * h
  out['recurrent_matmuls_80_gflops'] = flops / out['recurrent_matmuls_80'] / 1e9
  out['one_matmul_same_flops_gflops'] = flops / out['one_matmul_same_flops'] / 1e9
  return out


def loop_body_ops(concrete):
  """Ops one position costs: nodes of the while loops' bodies and conditions (the two
  layers' scans and their gradients), each run once per position."""
  library = concrete.graph.as_graph_def().library.function
  return sum(len(f.node_def) for f in library
             if 'while_body' in f.signature.name or 'while_cond' in f.signature.name)


def check(name, fn, reference):
  """First call (trace + compile) and the largest difference to the raw loop's weights."""
  out, first_s = timed_first(fn)
  diff = max(float(np.max(np.abs(a.numpy() - r))) for a, r in zip(out, reference))
  print(f'{name}: first call {first_s:.1f} s, max |diff| {diff:.2e}', flush=True)
  return first_s, diff


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--variants', default='scan,scan_xla,unrolled')
  parser.add_argument('--reps', type=int, default=7)
  parser.add_argument('--out', default=OUT)
  parser.add_argument('--breakdown', action=argparse.BooleanOptionalAction, default=True)
  args = parser.parse_args(argv)
  load_before = os.getloadavg()
  setting = bench_rounds.Setting(*bench_rounds.SETTINGS['gru'])
  weights, x, y = cohort_inputs(setting)
  reference = raw_client_weights(setting.clients)
  update = max(float(np.max(np.abs(r - w.numpy()))) for r, w in zip(reference, weights))
  raw = bench_rounds.build_raw(setting)
  _, raw_first = timed_first(raw)
  fns, rows = {'raw': raw}, {'raw': dict(first_call_s=raw_first, max_diff=0.0, agrees=True)}
  for name in args.variants.split(','):
    unroll, jit = VARIANTS[name]
    fn = build_round(setting.steps, unroll, jit)
    first_s, diff = check(name, lambda: fn(weights, x, y), reference)
    rows[name] = dict(first_call_s=first_s, max_diff=diff, agrees=diff <= TOLERANCE)
    if rows[name]['agrees']:
      fns[name] = lambda fn=fn: fn(weights, x, y)
  times = bench_sections.interleaved(fns, args.reps)
  raw_s = statistics.median(times['raw'])
  for name, ts in times.items():
    rows[name].update(round_s=statistics.median(ts), times_s=ts,
                      ratio_to_raw=statistics.median(ts) / raw_s)
    print(f"{name}: {rows[name]['round_s']:.3f} s/round, "
          f"{rows[name]['ratio_to_raw']:.2f}x raw", flush=True)
  best = min((n for n in times if n != 'raw'), key=lambda n: rows[n]['round_s'], default=None)
  pieces = None
  if best and args.breakdown:
    pieces = dict(variant=best, **breakdown(setting, weights, x, y, *VARIANTS[best], args.reps))
    print('breakdown', json.dumps(pieces, indent=1), flush=True)
  result = dict(setting='gru_10x10', clients=setting.clients, steps=setting.steps,
                batch=setting.batch, learning_rate=bench_rounds.LEARNING_RATE, reps=args.reps,
                tolerance=TOLERANCE, largest_update=update, rows=rows, breakdown=pieces,
                load_before=load_before, load_after=os.getloadavg(), nproc=os.cpu_count())
  with open(args.out, 'w') as f:
    json.dump(result, f, indent=1)
  print(f'wrote {args.out}; load {load_before} -> {result["load_after"]}')


if __name__ == '__main__':
  main()
