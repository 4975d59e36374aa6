"""Counts XLA compilations of the cohort program's jit-compiled client step.

  TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=device_compiler=1 \
    python bench/xla_recompile_repro.py --model=gru --rounds=3 2>&1 | grep -c "Compilation of XLA"

(device_compiler=3 prints each compilation's signature: `kind=constant` inputs
have their values in the cache key.)

Found (TF 2.14, Keras 2.14): with Keras' GRU (or LSTM) layers, the step
compiled at every call (4 clients x 3 steps x 3 rounds = 36 compilations,
rounds of 19-32 s against 0.3 s), because the layer's embedding and GRU
weights and the input tokens were compile-time constants. The cause is the
layers' cuDNN-swappable fast path (`_could_use_gpu_kernel`: a `tf.function`
call of `standard_gru`): differentiated under XLA, XLA's constant analysis
requires every input of that call as a constant. An MLP, SimpleRNN,
RNN(GRUCell), GRU(unroll=True) or a GRU on its generic path compile once,
called eagerly, from a tf.function or in a while_loop; the forward pass alone
compiles once too. Fixed by `functional._generic_rnn` under jit_compile: 1
compilation, rounds of 0.02 s after the first (0.07-0.10 s without XLA).
bench/run.py's tiny GRU row (--model=gru --clients=2 --local_steps=1 --batch=2,
fedavg, 3 reps, nice 10): before, 8 compilations and cohort_seq_xla rounds of
2.06 s against 0.126 s for cohort_seq (load 3.6-5.5); after, 1 compilation and
0.098 s for both (load 2.1).
"""

import argparse
import collections
import os
import sys
import time

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

# This checkout's package, not the installed one.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tff_adaptive.algorithms import fedopt  # pylint: disable=g-import-not-at-top,wrong-import-position
from tff_adaptive.execution import runtime
from tff_adaptive.rounds import cohort
from tff_adaptive.rounds import cohort_data

T, V, D, C = 10, 12, 5, 3


def gru_model_fn(units=8):
  spec = collections.OrderedDict(x=tf.TensorSpec([None, T], tf.int32),
                                 y=tf.TensorSpec([None, T], tf.int32))
  keras_model = tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(T,), dtype=tf.int32),
      tf.keras.layers.Embedding(V, 4, embeddings_initializer=tf.keras.initializers.RandomNormal(seed=1)),
      tf.keras.layers.GRU(units, return_sequences=True,
                          kernel_initializer=tf.keras.initializers.GlorotUniform(seed=2),
                          recurrent_initializer=tf.keras.initializers.Orthogonal(seed=3)),
      tf.keras.layers.GRU(units, return_sequences=True,
                          kernel_initializer=tf.keras.initializers.GlorotUniform(seed=4),
                          recurrent_initializer=tf.keras.initializers.Orthogonal(seed=5)),
      tf.keras.layers.Dense(V, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=6))])
  return tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=spec, metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])


def mlp_model_fn():
  spec = collections.OrderedDict(x=tf.TensorSpec([None, D], tf.float32),
                                 y=tf.TensorSpec([None], tf.int32))
  keras_model = tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(D,)),
      tf.keras.layers.Dense(7, activation='tanh',
                            kernel_initializer=tf.keras.initializers.RandomNormal(seed=1)),
      tf.keras.layers.Dense(C, kernel_initializer=tf.keras.initializers.RandomNormal(seed=2))])
  return tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=spec, metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])


def datasets(model, sizes, batch):
  rng = np.random.default_rng(0)
  out = []
  for n in sizes:
    if model == 'gru':
      x = rng.integers(1, V, (n, T)).astype(np.int32)
      y = rng.integers(0, V, (n, T)).astype(np.int32)
    else:
      x = rng.normal(size=(n, D)).astype(np.float32)
      y = rng.integers(0, C, n).astype(np.int32)
    out.append(tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(batch))
  return out


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--model', default='gru', choices=['gru', 'mlp'])
  parser.add_argument('--mode', default='sequential')
  parser.add_argument('--jit', default='true')
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--local_steps', type=int, default=3)
  parser.add_argument('--clients', type=int, default=4)
  args = parser.parse_args()
  runtime.use_local_cpp_context()
  model_fn = gru_model_fn if args.model == 'gru' else mlp_model_fn
  execution = cohort.CohortExecution(mode=args.mode, jit_compile=args.jit == 'true')
  process = fedopt.build_fedavg(model_fn, tff.learning.optimizers.build_sgdm(0.1),
                                local_steps=args.local_steps, execution=execution)
  sizes = [7, 13, 3, 10, 9, 5, 11, 8][:args.clients]
  data = datasets(args.model, sizes, 4)
  state = process.initialize()
  for r in range(args.rounds):
    shards = process.make_shards(
        [cohort_data.client_batches(ds, args.local_steps) for ds in data])
    start = time.perf_counter()
    state = process.next(state, shards).state
    print(f'round {r + 1}: {time.perf_counter() - start:.2f} s, shards '
          f'{[tuple(s["mask"].shape) for s in shards]}', flush=True)
  runtime.shutdown_workers()


if __name__ == '__main__':
  main()
