"""Cohort rows of bench/run.py: the round as one compiled program.

Row `<algorithm>@<execution>`, data `arrays`:

  cohort_vec       CohortExecution(mode='vectorized'), in process (tf.function)
  cohort_seq       CohortExecution(mode='sequential'), in process
  cohort_vec_cpp   CohortExecution(mode='vectorized', in_process=False): the same
                   shard program called through TFF's C++ executor (fedavg only)
  cohort_seq_xla   CohortExecution(mode='sequential', jit_compile=True): client
                   steps compiled by XLA; the compilation falls in the first round
                   (fedavg only)
  cohort_vec_xlaprog, cohort_seq_xlaprog
                   CohortExecution(mode=..., jit_compile='program'): the whole
                   shard program one XLA computation (compiled in the first round)
  cohort_vec_xlaprog_bg, cohort_seq_xlaprog_bg
                   the same, with the next round's padding on a background thread
                   while this round trains, as bin/train's feed does
                   (`cohort_data.Prefetcher`): the round as bin/train runs it
  cohort_vec_bg    cohort_vec with the background padding, as bin/train feeds
                   rounds (fedavg only)

Data: each client's K batches are read once from the bench's in-memory
datasets into NumPy arrays (`cohort_data.client_batches`, what the workflow's
`ClientCache` keeps between rounds; seconds in `data_s`, not in the round).
A timed round is `process.make_shards(arrays)` (padding into the
[clients, steps, batch, ...] tensors; seconds also in `pad_s`) plus
`process.next`; in the `_bg` rows the padding ran on a background thread during
the previous round, so a timed round is the wait for it plus `process.next`
(on 2 cores the thread competes with the round's own TF threads).

Equality: every cohort process starts from the per-client process's initial
state, and its first round's update must equal that process's first round
(same state, same batches) within `TOLERANCE`; the rows carry the difference.
"""

import collections
import concurrent.futures
import time
import warnings

import numpy as np
import tensorflow as tf

from tff_adaptive.algorithms import composer
from tff_adaptive.rounds import cohort
from tff_adaptive.rounds import cohort_data
from workflow.flags import algorithms as registry
from workflow.training import algorithm_builders as builders

EXECUTIONS = collections.OrderedDict([
    ('cohort_vec', dict(mode='vectorized')),
    ('cohort_seq', dict(mode='sequential')),
    ('cohort_vec_cpp', dict(mode='vectorized', in_process=False)),
    ('cohort_seq_xla', dict(mode='sequential', jit_compile=True)),
    ('cohort_vec_xlaprog', dict(mode='vectorized', jit_compile='program')),
    ('cohort_seq_xlaprog', dict(mode='sequential', jit_compile='program')),
    ('cohort_vec_xlaprog_bg', dict(mode='vectorized', jit_compile='program')),
    ('cohort_seq_xlaprog_bg', dict(mode='sequential', jit_compile='program')),
    ('cohort_vec_bg', dict(mode='vectorized')),
])
BACKGROUND = ('cohort_vec_xlaprog_bg', 'cohort_seq_xlaprog_bg', 'cohort_vec_bg')
FEDAVG_ONLY = ('cohort_vec_cpp', 'cohort_seq_xla', *BACKGROUND)
DATA = 'arrays'
TOLERANCE = 1e-5


def row_specs(names, executions, algorithms):
  """(row name, bench algorithm, execution) for the cohort rows of `names`."""
  for name in names:
    if name not in algorithms:  # TFF's own FedAvg: no cohort form
      continue
    for key in executions:
      if key not in EXECUTIONS:
        raise ValueError(f'unknown cohort execution {key!r}; one of {", ".join(EXECUTIONS)}')
      if key in FEDAVG_ONLY and name != 'fedavg':
        continue
      yield f'{name}@{key}', name, key


def build(algorithm: str, task, settings, key: str):
  """(CohortProcess, None), or (None, why the algorithm runs per client)."""
  entry = registry.ALGORITHMS[algorithm]
  if not entry.cohort:
    return None, entry.cohort.why
  execution = cohort.CohortExecution(**EXECUTIONS[key])
  # What builders.build does for --execution=cohort, with the execution given
  # whole (the registry's flags do not reach in_process).
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', cohort.CohortDoesNotApply)  # returned as `why_per_client`
    built = composer.built_by(lambda: builders.entry_builder(algorithm)(
        task, settings, execution=execution, measure_client_drift=False))
  if cohort.is_cohort(built.process):
    return built.process, None
  return None, built.why_per_client or 'the builder returned a per-client process'


def client_arrays(setting):
  """(each client's K batches as NumPy arrays, seconds): read once per setting."""
  t0 = time.perf_counter()
  batches = [cohort_data.client_batches(ds, setting.steps) for ds in setting.python_datasets()]
  return batches, time.perf_counter() - t0


class CohortRunner:
  """A cohort process fed the padded arrays; same interface as run.Runner."""

  def __init__(self, process, build_s: float, arrays, data_s: float, initial_state=None,
               background: bool = False, tests=None):
    """`tests`: each client's test batches, for a process whose clients measure
    user accuracy (`with_test_batches`)."""
    self.process = process
    self.tests = tests
    self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1) if background else None
    self._next_shards = None
    self.build_s = build_s
    self.arrays = arrays
    self.data_s = data_s
    t0 = time.perf_counter()
    state = process.initialize()
    self.init_s = time.perf_counter() - t0
    # The per-client row's initial state: same weights, same layout.
    self.initial_state = state if initial_state is None else initial_state
    self.state = self.initial_state
    self.first_round_s = None
    self.first_state = None
    self.pad_times_s = []

  def __call__(self):
    t0 = time.perf_counter()
    if self._pool is None:
      shards = self._shards()
    else:
      shards = self._next_shards.result() if self._next_shards else self._shards()
      self._next_shards = self._pool.submit(self._shards)
    self.pad_times_s.append(time.perf_counter() - t0)
    out = self.process.next(self.state, shards)
    if self._next_shards is not None:
      # Interleaved with other rows, the padding must not run in their time:
      # the next round's padding overlaps this round's program, then is awaited.
      concurrent.futures.wait([self._next_shards])
    self.state = out.state
    return out.metrics

  def _shards(self):
    shards = self.process.make_shards(self.arrays)
    if self.tests is None:
      return shards
    return self.process.with_test_batches(
        shards, self.tests, [initial_private_state(self.process)] * len(self.tests))

  def first(self):
    first_round(self)
    self.pad_times_s.clear()  # the timed rounds' only

  def close(self):
    if self._pool is not None:
      self._pool.shutdown(wait=True)


def initial_private_state(process):
  """A client's private state for a round of a personalised `process` (MTFL's
  patches): the initial one, every round, as for a client seen for the first
  time (the per-client and cohort rows do the same work); None without one."""
  return process.client_state_initial if getattr(process, 'has_private_state', False) else None


def first_round(runner):
  """One round of `runner`, timed (build/first-round column), its state kept for
  the equality check."""
  t0 = time.perf_counter()
  runner()
  runner.first_round_s = time.perf_counter() - t0
  runner.first_state = runner.state


def trainable(state):
  return [np.asarray(t, np.float64) for t in tf.nest.flatten(state.global_model_weights.trainable)]


def state_update_difference(start, expected_end, actual_end, actual_start=None):
  """Max |Δ_actual − Δ_expected| of the trainable weights (each update from its own
  start; `actual_start` defaults to `start`) and max |Δ_expected|."""
  actual_start = start if actual_start is None else actual_start
  expected = [w - s for w, s in zip(trainable(expected_end), trainable(start))]
  actual = [w - s for w, s in zip(trainable(actual_end), trainable(actual_start))]
  diff = max(float(np.max(np.abs(a - e))) for a, e in zip(actual, expected))
  scale = max(float(np.max(np.abs(e))) for e in expected)
  return diff, scale


def update_difference(reference, runner):
  """Max |Δ_cohort − Δ_per_client| of the first round and max |Δ_per_client|."""
  return state_update_difference(reference.initial_state, reference.first_state,
                                 runner.first_state)


def row_fields(runner, reference) -> collections.OrderedDict:
  """The cohort-only fields of a row."""
  diff, scale = update_difference(reference, runner)
  return collections.OrderedDict(
      execution_mode='vectorized' if runner.process.vectorized else 'sequential',
      in_process=runner.process.execution.in_process,
      jit_compile=runner.process.execution.jit_compile,
      data_s=runner.data_s,
      pad_s=float(np.median(runner.pad_times_s)) if runner.pad_times_s else float('nan'),
      padding_waste=runner.process.shard_stats.waste,
      update_max_abs_diff=diff, update_max_abs=scale,
      update_equal=bool(diff <= TOLERANCE * max(1.0, scale)))


def targets(rows, tff_reference: str) -> collections.OrderedDict:
  """The cohort acceptance ratios from one section's rows (None: not measured)."""
  fedavg = [r for r in rows if r['algorithm'].startswith('fedavg@')]
  best = min(fedavg, key=lambda r: r['round_s'], default=None)
  tff = [r for r in rows if r['algorithm'] == tff_reference]
  adaptive = collections.OrderedDict(
      (r['algorithm'], r['ratio_to_fedavg']) for r in rows
      if '@' in r['algorithm'] and not r['algorithm'].startswith('fedavg@'))
  return collections.OrderedDict(
      best_fedavg_cohort=best['algorithm'] if best else None,
      best_fedavg_cohort_over_raw=best['ratio'] if best else None,
      adaptive_over_fedavg_cohort=adaptive,
      tff_fedavg_over_best_cohort=(min(r['round_s'] for r in tff) / best['round_s']
                                   if best and tff else None),
      all_updates_equal=all(r['update_equal'] for r in rows if 'update_equal' in r))
