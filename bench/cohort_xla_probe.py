"""Where a cohort round's time goes (the shard program alone) and what XLA over the whole
shard program gives, for the digits MLP at 5 x 100 and 50 x 10 (docs/performance.md).

  .venv/bin/python bench/cohort_xla_probe.py
"""
import sys, time
ROOT = __import__('os').path.dirname(__import__('os').path.dirname(__import__('os').path.abspath(__file__)))
sys.path[:0] = [ROOT, __import__('os').path.join(ROOT, 'bench')]
import numpy as np
import tensorflow as tf
import bench_rounds
import bench_cohort
from tff_adaptive.rounds import cohort

def med(fn, reps=7):
  fn(); ts = []
  for _ in range(reps):
    t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
  return float(np.median(ts))

for model, clients, steps, batch in [('mlp', 5, 100, 20), ('mlp', 50, 10, 20)]:
  s = bench_rounds.Setting(model, clients, steps, batch)
  raw = bench_rounds.build_raw(s); raw()
  arrays, _ = bench_cohort.client_arrays(s)
  out = {'raw': med(raw)}
  for key in ('cohort_seq', 'cohort_vec'):
    process, _ = bench_cohort.build('fedavg', s.task(), bench_rounds.run_config('fedavg', s), key)
    r = bench_cohort.CohortRunner(process, 0, arrays, 0)
    out[key] = med(r)
    nxt = process.next
    shards = process.make_shards(arrays)
    w, st, hp = cohort._as_tensors((r.state.global_model_weights, r.state.finalizer, r.state.client_work))
    import tensorflow_federated as tff
    w = tff.learning.models.ModelWeights(*w)
    msg = nxt._message(w, st, hp)
    out[key + ':shard'] = med(lambda: nxt._shard(msg, shards[0]))
    prog = nxt._shard.python_function
    xla = tf.function(prog, jit_compile=True)
    out[key + ':shard_xla'] = med(lambda: xla(msg, shards[0]))
    a = nxt._shard(msg, shards[0]); b = xla(msg, shards[0])
    out[key + ':xla_diff'] = max(float(np.max(np.abs(x - y))) for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)))
  print(model, clients, steps, {k: (round(v, 4) if 'diff' not in k else v) for k, v in out.items()}, flush=True)
