"""Simulation round time against the raw compute it contains .

Example (the committed numbers; see bench/README.md):
  .venv/bin/python bench/run.py --out_dir=bench/results

Every measurement is a RATIO taken inside one process with interleaved
repetitions (raw, A, B, ..., raw, A, B, ...) and medians, so that background
load on a shared machine slows both sides of a ratio alike; the load average
(`os.getloadavg`) is recorded next to each section.

Sections (each writes `<out_dir>/<section>.json`; `results/README.md` is the
markdown table of all of them):
  overhead:  round time ÷ raw compute time for fedavg, fedadam, fedgbo-adam,
             mfl-adam, fedada2 (SM3-Adam clients), mimelite, fedprox and TFF's own
             `build_weighted_fed_avg`, with client data passed from Python
             (`python`) and built on the executor from client seeds (`ids`,
             `tff.simulation.compose_dataset_computation_with_learning_process`),
             and as one compiled program over the cohort (rows
             `<algorithm>@cohort_vec|cohort_seq|cohort_vec_cpp|cohort_seq_xla`,
             bench_cohort.py: vectorised or in sequence, in process, through
             TFF's C++ executor, XLA), each checked equal to the per-client
             round. Raw compute = one `tf.function` running the same C clients
             × K SGD minibatch steps on the same model and the same (in-memory)
             batches, resetting the weights per client.
  scaling:   the same ratio for FedAvg (ours per client and as a cohort, TFF's)
             at 10/50/200 clients per round and for three model sizes
             (synthetic linear, digits MLP, EMNIST-shaped CNN).
  memory:    resident memory after every round over many rounds; slope of the
             second half (KiB/round) and peak.
  first_round: seconds to build the process, to initialise it, and for the
             first round (tracing + compilation) against a later round.
  profile:   cProfile of `process.next` (top functions by cumulative time).

Models (bench_models.py): linear, mlp (digits), cnn (EMNIST-shaped), so_lr
(Stack-Overflow-LR shaped, 10,000 → 500 multi-hot), gru (Shakespeare GRU
2 × 128 over 80 characters). The data is synthetic: client c's examples are
`tf.random.stateless_*` draws seeded by c, so the executor can rebuild them
from the seed alone.
"""

import argparse
import collections
import cProfile
import io
import json
import os
import pstats
import resource
import statistics
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Its siblings, also when imported as `bench.run`.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# pylint: disable=g-import-not-at-top
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

import bench_cohort
import machine_info
import bench_models
from tff_adaptive.execution import runtime
from tff_adaptive.rounds import cohort_data
from workflow import algorithm_builders as registry

SCHEMA_VERSION = 1
OTHER_SCRIPTS = ('conditioning', 'client_step_cost')
LEARNING_RATE = 0.02

# Registry name and config per benchmarked algorithm (equal local work: K steps).
ALGORITHMS = collections.OrderedDict([
    ('fedavg', ('fedavg', {})),
    ('fedadam', ('fedadam', {'server_learning_rate': 0.01})),
    ('fedgbo-adam', ('fedgbo', {'client_optimizer': 'adam'})),
    ('mfl-adam', ('mfl', {'client_optimizer': 'adam'})),
    ('fedada2-sm3', ('fedada2', {'client_optimizer': 'sm3_adam'})),
    ('mimelite', ('mimelite', {'client_optimizer': 'adam'})),
    ('fedprox', ('fedprox', {})),
    ('perfedavg', ('perfedavg', {})),
    ('pfedme', ('pfedme', {})),
    ('mtfl', ('mtfl', {})),  # private batch-norm patches: the mlp_bn settings
])
TFF_REFERENCE = 'tff_fedavg'
# Clients that also measure user accuracy: asked for by --algorithms only (their
# rounds read a test split: here each client's training batches, the timing's
# only concern), in the `python` data mode (their input is not a dataset alone).
PERSONALISED = ('perfedavg', 'pfedme', 'mtfl')


# ---------------------------------------------------------------------------
# Models and data (bench_models.py).

# name → ModelSpec (keras builder, example and label shapes and dtypes, classes)
MODELS = bench_models.MODELS

# The benchmark settings: --setting=NAME → (model, clients, local steps, batch).
SETTINGS = collections.OrderedDict([
    ('mlp_50x10', ('mlp', 50, 10, 20)),
    ('mlp_bn_50x10', ('mlp_bn', 50, 10, 20)),  # MTFL's (batch-norm patches)
    ('mlp_5x100', ('mlp', 5, 100, 20)),
    ('mlp_200x10', ('mlp', 200, 10, 20)),
    ('so_lr', ('so_lr', 10, 10, 20)),
    ('cnn', ('cnn', 10, 10, 20)),
    ('gru', ('gru', 10, 10, 4)),
])


class Setting:
  """A model and a round shape: C clients × K steps × batch B."""

  def __init__(self, model: str, clients: int, steps: int, batch: int):
    self.model, self.clients, self.steps, self.batch = model, clients, steps, batch
    self.spec = MODELS[model]
    self.keras_fn, self.shape, self.classes = self.spec.keras_fn, self.spec.x_shape, self.spec.classes
    self.input_spec = (tf.TensorSpec((None,) + self.shape, self.spec.x_dtype),
                       tf.TensorSpec((None,) + self.spec.y_shape, self.spec.y_dtype))

  def loss_fn(self) -> tf.keras.losses.Loss:
    return bench_models.loss_fn(self.spec)

  def model_fn(self) -> tff.learning.models.VariableModel:
    return tff.learning.models.from_keras_model(
        self.keras_fn(), input_spec=self.input_spec, loss=self.loss_fn(),
        metrics=bench_models.metrics(self.spec))

  def task(self):
    # The registry's builders read model_fn, keras_model_fn and name only.
    return types.SimpleNamespace(name=f'bench_{self.model}', model_fn=self.model_fn,
                                 keras_model_fn=self.keras_fn)

  def client_tensors(self, seed):
    """Client `seed`'s K·B examples (also traced inside the executor's dataset fn)."""
    return bench_models.examples(self.spec, seed, self.steps * self.batch)

  def client_dataset(self, seed) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(self.client_tensors(seed)).batch(self.batch)

  def python_datasets(self):
    return [self.client_dataset(c) for c in range(self.clients)]

  def seeds(self):
    return [np.int32(c) for c in range(self.clients)]


def build_raw(setting: Setting):
  """The compute limit: a plain tf.function doing the round's minibatch steps."""
  model = setting.keras_fn()
  loss_fn = setting.loss_fn()
  variables = model.trainable_variables
  initial = [tf.constant(v.numpy()) for v in variables]
  xs, ys = zip(*(setting.client_tensors(c) for c in range(setting.clients)))
  b = setting.batch
  x = tf.reshape(tf.stack(xs), (setting.clients, setting.steps, b) + setting.shape)
  y = tf.reshape(tf.stack(ys), (setting.clients, setting.steps, b) + setting.spec.y_shape)

  @tf.function
  def raw_round():
    for c in tf.range(setting.clients):
      for v, w in zip(variables, initial):
        v.assign(w)
      for k in tf.range(setting.steps):
        with tf.GradientTape() as tape:
          loss = loss_fn(y[c, k], model(x[c, k], training=True))
        for v, g in zip(variables, tape.gradient(loss, variables)):
          v.assign_sub(LEARNING_RATE * tf.convert_to_tensor(g))  # Embedding grads are IndexedSlices
    return loss

  return lambda: raw_round().numpy()


def build_raw_pipeline(setting: Setting):
  """Raw compute fed by tf.data: the same steps, each client's batches read from
  `from_tensor_slices(client examples).batch(B)` (the rounds' own pipeline,
  `Setting.client_dataset`) inside the same `tf.function`, so that round ÷
  raw_pipeline is the executor's cost alone and raw_pipeline ÷ raw the data
  pipeline's."""
  model = setting.keras_fn()
  loss_fn = setting.loss_fn()
  variables = model.trainable_variables
  initial = [tf.constant(v.numpy()) for v in variables]
  xs, ys = zip(*(setting.client_tensors(c) for c in range(setting.clients)))
  clients = tf.data.Dataset.from_tensor_slices((tf.stack(xs), tf.stack(ys)))

  @tf.function
  def raw_round():
    loss = tf.constant(0.0)
    for xc, yc in clients:
      for v, w in zip(variables, initial):
        v.assign(w)
      for xb, yb in iter(tf.data.Dataset.from_tensor_slices((xc, yc)).batch(setting.batch)):
        with tf.GradientTape() as tape:
          loss = loss_fn(yb, model(xb, training=True))
        for v, g in zip(variables, tape.gradient(loss, variables)):
          v.assign_sub(LEARNING_RATE * tf.convert_to_tensor(g))  # Embedding grads are IndexedSlices
    return loss

  return lambda: raw_round().numpy()


def build_process(name: str, setting: Setting):
  if name == TFF_REFERENCE:
    return tff.learning.algorithms.build_weighted_fed_avg(
        setting.model_fn,
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(LEARNING_RATE),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0))
  algorithm, _ = ALGORITHMS[name]
  return registry.build(setting.task(), _config(name, setting))


def _config(name: str, setting: Setting):
  from workflow import config  # pylint: disable=g-import-not-at-top
  algorithm, extra = ALGORITHMS[name]
  # per client, as the flag dict without --execution was built (bench_cohort builds cohorts)
  return config.from_flags(dict(algorithm=algorithm, client_learning_rate=LEARNING_RATE,
                                local_steps=setting.steps, execution='per_client', **extra))


class Runner:
  """One process driven one way ('python' datasets or client 'ids')."""

  def __init__(self, name: str, setting: Setting, data: str):
    t0 = time.perf_counter()
    process = build_process(name, setting)
    if data == 'ids':
      @tff.tensorflow.computation(tf.int32)
      def dataset_fn(seed):
        return setting.client_dataset(seed)
      process = tff.simulation.compose_dataset_computation_with_learning_process(
          dataset_fn, process)
      self.client_data = setting.seeds
    elif name in PERSONALISED:
      inputs = [process.client_input(d, bench_cohort.initial_private_state(process), test=d)
                for d in setting.python_datasets()]
      self.client_data = lambda: inputs
    else:
      datasets = setting.python_datasets()
      self.client_data = lambda: datasets
    self.build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    self.state = process.initialize()
    self.init_s = time.perf_counter() - t0
    self.initial_state = self.state
    self.process = process
    self.first_round_s = None
    self.first_state = None

  def __call__(self):
    out = self.process.next(self.state, self.client_data())
    self.state = out.state
    return out.metrics

  def first(self):
    bench_cohort.first_round(self)


def build_cohort_runners(setting: Setting, names, executions, runners):
  """Cohort runners (row key → runner), the rows skipped (row → why the
  algorithm runs per client) and the rows that failed (row → the error).

  Each starts from the state of the per-client runner of its algorithm in
  `runners` (one is built, untimed, if none was asked for) and records its
  first round's difference to that runner's first round.
  """
  specs = list(bench_cohort.row_specs(names, executions, ALGORITHMS))
  cohort_runners, skipped, failed, references = collections.OrderedDict(), {}, {}, {}
  arrays = data_s = None
  for row, name, key in specs:
    algorithm, _ = ALGORITHMS[name]
    if name not in references:
      references[name] = next((r for k, r in runners.items() if k.split('/')[0] == name), None)
    if arrays is None:
      arrays, data_s = bench_cohort.client_arrays(setting)
    try:
      t0 = time.perf_counter()
      process, reason = bench_cohort.build(algorithm, setting.task(), _config(name, setting), key)
      build_s = time.perf_counter() - t0
      if process is None:
        skipped[row] = reason
        print(f'{row}: not run ({reason})', file=sys.stderr, flush=True)
        continue
      if references[name] is None:
        references[name] = Runner(name, setting, 'python')
        references[name].first()
      train, tests = arrays, None
      if name in PERSONALISED:  # 2K batches for Per-FedAvg's K meta-steps; test = the K
        train = [cohort_data.client_batches(d, process.batches_per_client(setting.steps))
                 for d in setting.python_datasets()]
        tests = arrays
      runner = bench_cohort.CohortRunner(process, build_s, train, data_s,
                                         references[name].initial_state,
                                         background=key in bench_cohort.BACKGROUND, tests=tests)
      runner.first()
    # A combination the cohort program cannot build (tf.vectorized_map of a
    # GRU) is a result of the run, not the end of it.
    except Exception as e:  # pylint: disable=broad-except
      failed[row] = f'{type(e).__name__}: {_first_line(e)}'
      print(f'{row}: failed ({failed[row]})', file=sys.stderr, flush=True)
      continue
    runner.reference = references[name]
    cohort_runners[f'{row}/{bench_cohort.DATA}'] = runner
  return cohort_runners, skipped, failed


def _first_line(error: Exception) -> str:
  lines = [l.strip() for l in str(error).splitlines() if l.strip()]
  return (lines[-1] if lines else '')[:300]


def interleaved(fns: dict, reps: int) -> dict:
  """Times each callable `reps` times, interleaved and rotated; returns lists."""
  names = list(fns)
  times = {n: [] for n in names}
  for r in range(reps):
    order = names[r % len(names):] + names[:r % len(names)]
    for n in order:
      t0 = time.perf_counter()
      fns[n]()
      times[n].append(time.perf_counter() - t0)
  return times


def _finite_ratio(a, b):
  return float(a / b) if b > 0 else float('nan')


def overhead_section(setting: Setting, names, data_modes, reps, profile_rounds=0,
                     cohort_executions=()):
  """Ratios to raw compute for `names` under each data mode and each cohort
  execution (bench_cohort.py), all interleaved."""
  load_before = machine_info.load_average()
  fns = {'raw': build_raw(setting), 'raw_pipeline': build_raw_pipeline(setting)}
  fns['raw']()  # trace
  fns['raw_pipeline']()
  runners = {}
  for name in names:
    for mode in data_modes:
      runner = Runner(name, setting, mode)
      runner.first()
      runners[f'{name}/{mode}'] = runner
      fns[f'{name}/{mode}'] = runner
  cohort_runners, cohort_skipped, cohort_failed = build_cohort_runners(
      setting, names, cohort_executions, runners)
  runners.update(cohort_runners)
  fns.update(cohort_runners)
  times = interleaved(fns, reps)
  raw = statistics.median(times['raw'])
  raw_pipeline = statistics.median(times['raw_pipeline'])
  rows = []
  for key, runner in runners.items():
    name, mode = key.split('/')
    med = statistics.median(times[key])
    per_rep = [t / r for t, r in zip(times[key], times['raw'])]
    rows.append(collections.OrderedDict(
        algorithm=name, data=mode,
        execution=name.split('@')[1] if '@' in name else 'per_client',
        round_s=med, raw_s=raw, ratio=_finite_ratio(med, raw),
        raw_pipeline_s=raw_pipeline, ratio_to_raw_pipeline=_finite_ratio(med, raw_pipeline),
        ratio_per_rep_median=statistics.median(per_rep),
        build_s=runner.build_s, init_s=runner.init_s, first_round_s=runner.first_round_s,
        first_round_over_round=_finite_ratio(runner.first_round_s, med)))
    if key in cohort_runners:
      rows[-1].update(bench_cohort.row_fields(runner, runner.reference))
      if not rows[-1]['update_equal']:
        print(f"{name}: round update differs from the per-client one by "
              f"{rows[-1]['update_max_abs_diff']:.3g}", file=sys.stderr, flush=True)
  for row in rows:
    # Same data and execution: cohort rows against FedAvg run the same way.
    base = [r for r in rows if r['algorithm'].split('@')[0] == 'fedavg' and
            r['data'] == row['data'] and r['execution'] == row['execution']]
    row['ratio_to_fedavg'] = _finite_ratio(row['round_s'], base[0]['round_s']) if base else None
  for runner in cohort_runners.values():
    runner.close()
  profiles = {}
  if profile_rounds:
    for key in runners:
      if key.startswith(('fedavg/', TFF_REFERENCE + '/')):
        profiles[key] = profile(runners[key], profile_rounds)
  return collections.OrderedDict(
      setting=vars_of(setting), reps=reps, load_before=load_before,
      load_after=machine_info.load_average(),
      raw_times_s=times['raw'], raw_pipeline_times_s=times['raw_pipeline'],
      raw_pipeline_over_raw=_finite_ratio(raw_pipeline, raw), rows=rows, times_s=times,
      cohort_skipped=cohort_skipped, cohort_failed=cohort_failed, targets=bench_cohort.targets(rows, TFF_REFERENCE),
      profiles=profiles)


SCALING_COLUMNS = ['model', 'clients', 'algorithm', 'data', 'raw_s', 'raw_pipeline_s', 'round_s',
                   'ratio', 'ratio_to_raw_pipeline', 'first_round_s', 'update_max_abs_diff',
                   'rss_mib', 'worker_rss_mib', 'peak_rss_mib', 'load']


def scaling_entry(model: str, clients: int, row, load: float) -> collections.OrderedDict:
  """One row of an overhead section as an entry of the scaling table."""
  entry = collections.OrderedDict(
      model=model, clients=clients, algorithm=row['algorithm'], data=row['data'],
      raw_s=row['raw_s'], raw_pipeline_s=row['raw_pipeline_s'], round_s=row['round_s'],
      ratio=row['ratio'], ratio_to_raw_pipeline=row['ratio_to_raw_pipeline'],
      first_round_s=row['first_round_s'],
      rss_mib=_rss_kib() / 1024, worker_rss_mib=_worker_rss_kib() / 1024,
      peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, load=load)
  if 'update_max_abs_diff' in row:  # a cohort row: its equality to the per-client round
    entry['update_max_abs_diff'] = row['update_max_abs_diff']
  return entry


def vars_of(setting):
  return collections.OrderedDict(model=setting.model, clients=setting.clients,
                                 local_steps=setting.steps, batch=setting.batch)


def profile(runner, rounds: int, top: int = 25) -> str:
  prof = cProfile.Profile()
  prof.enable()
  for _ in range(rounds):
    runner()
  prof.disable()
  s = io.StringIO()
  pstats.Stats(prof, stream=s).sort_stats('cumulative').print_stats(top)
  return s.getvalue()


def _rss_kib() -> float:
  with open('/proc/self/statm') as f:
    return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 1024


def _worker_rss_kib() -> float:
  """RSS of TFF's worker_binary children (where the executor holds values)."""
  total = 0.0
  for pid in runtime.live_workers():
    try:
      with open(f'/proc/{pid}/statm') as f:
        total += int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 1024
    except OSError:
      pass
  return total


def _second_half_slope(series) -> float:
  half = series[len(series) // 2:]
  return float(np.polyfit(np.arange(len(half)), half, 1)[0]) if len(half) > 1 else 0.0


def memory_section(setting: Setting, name: str, data: str, rounds: int):
  load_before = machine_info.load_average()
  runner = Runner(name, setting, data)
  rss, worker_rss = [], []
  t0 = time.perf_counter()
  for _ in range(rounds):
    runner()
    rss.append(_rss_kib())
    worker_rss.append(_worker_rss_kib())
  return collections.OrderedDict(
      setting=vars_of(setting), algorithm=name, data=data, rounds=rounds,
      seconds=time.perf_counter() - t0, rss_kib=rss, rss_first_kib=rss[0], rss_last_kib=rss[-1],
      peak_rss_kib=float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss),
      slope_second_half_kib_per_round=_second_half_slope(rss),
      worker_rss_kib=worker_rss, worker_rss_first_kib=worker_rss[0],
      worker_rss_last_kib=worker_rss[-1], worker_peak_rss_kib=max(worker_rss),
      worker_slope_second_half_kib_per_round=_second_half_slope(worker_rss),
      load_before=load_before, load_after=machine_info.load_average())


def memory_cohort_section(setting: Setting, name: str, rounds: int, min_clients: int,
                          seed: int = 0):
  """Resident memory over `rounds` cohort rounds whose size is drawn from
  [min_clients, setting.clients] each round (the cohort program is
  traced once for every size, and padding, shards and metrics must not grow).

  The arrays of `setting.clients` clients are read once (as the workflow's
  ClientCache keeps them); round r trains on a random subset of them.
  """
  load_before = machine_info.load_average()
  algorithm, _ = ALGORITHMS[name]
  process, reason = bench_cohort.build(algorithm, setting.task(), _config(name, setting),
                                       'cohort_vec' if setting.model != 'cnn' else 'cohort_seq')
  if process is None:
    raise SystemExit(f'memory: {name} runs per client ({reason})')
  arrays, _ = bench_cohort.client_arrays(setting)
  runner = bench_cohort.CohortRunner(process, 0.0, arrays, 0.0)
  rng = np.random.default_rng(seed)
  rss, sizes = [], []
  t0 = time.perf_counter()
  for _ in range(rounds):
    size = int(rng.integers(min_clients, setting.clients + 1))
    runner.arrays = [arrays[i] for i in rng.choice(setting.clients, size, replace=False)]
    runner()
    rss.append(_rss_kib())
    sizes.append(size)
  return collections.OrderedDict(
      setting=vars_of(setting), algorithm=name, execution=type(process).__name__,
      vectorized=process.vectorized, rounds=rounds, cohort_sizes=sizes,
      min_clients=min_clients, max_clients=setting.clients,
      seconds=time.perf_counter() - t0, rss_kib=rss, rss_first_kib=rss[0], rss_last_kib=rss[-1],
      peak_rss_kib=float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss),
      slope_second_half_kib_per_round=_second_half_slope(rss),
      slope_all_kib_per_round=float(np.polyfit(np.arange(len(rss)), rss, 1)[0]),
      padding_waste=process.shard_stats.waste,
      load_before=load_before, load_after=machine_info.load_average())


def machine():
  return machine_info.machine(tensorflow=tf.__version__, tff=tff.__version__)


def write(out_dir, section, payload):
  os.makedirs(out_dir, exist_ok=True)
  payload = collections.OrderedDict(schema_version=SCHEMA_VERSION, section=section,
                                    machine=machine(), **payload)
  path = os.path.join(out_dir, f'{section}.json')
  with open(path, 'w') as f:
    json.dump(payload, f, indent=1)
  return path


def markdown(out_dir) -> str:
  """results/README.md from every section JSON in `out_dir`."""
  lines = ['# Benchmark results', '',
           'Generated by `bench/run.py` (see `bench/README.md`). Ratios are medians of',
           'interleaved repetitions in one process; load average = 1/5/15-minute',
           '`os.getloadavg()` before and after each section.', '']
  loaded = {}
  for fname in sorted(os.listdir(out_dir)):
    if fname.endswith('.json'):
      with open(os.path.join(out_dir, fname)) as f:
        data = json.load(f)
      # Other scripts' JSONs (conditioning.py, client_step_cost.py) share the
      # machine record but not the layout: their own docs read them.
      if (data.get('schema_version') == SCHEMA_VERSION and 'section' in data
          and not data['section'].startswith(OTHER_SCRIPTS)):
        loaded[fname[:-5]] = data
  if loaded:
    m = next(iter(loaded.values()))['machine']
    lines += ['Machine: ' + ', '.join(f'{k}={v}' for k, v in m.items()), '']
  for key, data in loaded.items():
    lines.append(f'## {key}')
    lines.append('')
    if 'rows' in data:
      s = data['setting']
      lines.append(f"{s['model']}, {s['clients']} clients × {s['local_steps']} steps × batch "
                   f"{s['batch']}; {data['reps']} interleaved reps; raw compute "
                   f"{statistics.median(data['raw_times_s']):.3f} s; load "
                   f"{data['load_before']} → {data['load_after']}")
      lines.append('')
      if 'raw_pipeline_times_s' in data:
        lines.append(f"raw compute fed by tf.data (raw_pipeline) "
                     f"{statistics.median(data['raw_pipeline_times_s']):.3f} s "
                     f"({data['raw_pipeline_over_raw']:.2f}× raw)")
        lines.append('')
      lines.append('| algorithm | data | round s | ÷ raw | ÷ raw_pipeline | '
                   '÷ FedAvg (same data, execution) | build s | init s | first round s | '
                   'first ÷ later | of which padding s | update − per-client update |')
      lines.append('|---|---|---|---|---|---|---|---|---|---|---|---|')
      for r in data['rows']:
        fa = f"{r['ratio_to_fedavg']:.2f}" if r.get('ratio_to_fedavg') else '–'
        rp = f"{r['ratio_to_raw_pipeline']:.2f}" if r.get('ratio_to_raw_pipeline') else '–'
        pad = f"{r['pad_s']:.3f}" if 'pad_s' in r else '–'
        diff = (f"{r['update_max_abs_diff']:.1e}" + ('' if r['update_equal'] else ' **differs**')
                if 'update_max_abs_diff' in r else '–')
        lines.append(f"| {r['algorithm']} | {r['data']} | {r['round_s']:.3f} | "
                     f"{r['ratio']:.2f} | {rp} | {fa} | {r['build_s']:.1f} | {r['init_s']:.1f} | "
                     f"{r['first_round_s']:.1f} | {r['first_round_over_round']:.1f} | {pad} | "
                     f"{diff} |")
      lines += _markdown_cohort_notes(data)
    elif data['section'].startswith('native_profile'):
      s = data['setting']
      lines.append(f"`perf` samples of this process and its worker_binary, {s['model']}, "
                   f"{s['clients']} clients × {s['local_steps']} steps × batch {s['batch']}, "
                   f"{data['rounds']} rounds each, concurrency "
                   f"{data['execution_concurrency']}; load {data['load_before']} → "
                   f"{data['load_after']}")
      lines.append('')
      lines.append('| measured | wall s/round | CPU s/round | cores used | CPU ÷ raw CPU | '
                   'largest shares of CPU samples |')
      lines.append('|---|---|---|---|---|---|')
      for name, r in data['profiles'].items():
        top = '; '.join(f'{k} {v:.0f}%' for k, v in list(r['categories_percent'].items())[:6])
        lines.append(f"| {name} | {r['wall_s_per_round']:.3f} | {r['cpu_s_per_round']:.3f} | "
                     f"{r['cores_used']:.2f} | {r['cpu_over_raw_cpu']:.2f} | {top} |")
    elif 'rss_kib' in data:
      s = data['setting']
      clients = (f"{data['min_clients']}–{data['max_clients']} clients (drawn per round), "
                 f"{'vectorised' if data['vectorized'] else 'in sequence'}, padding waste "
                 f"{data['padding_waste']:.1%}" if 'cohort_sizes' in data
                 else f"{s['clients']} clients")
      lines.append(f"{data['algorithm']} ({data.get('data', data.get('execution'))}), "
                   f"{s['model']}, {clients}, "
                   f"{data['rounds']} rounds in {data['seconds']:.0f} s: RSS "
                   f"{data['rss_first_kib'] / 1024:.0f} → {data['rss_last_kib'] / 1024:.0f} MiB, "
                   f"peak {data['peak_rss_kib'] / 1024:.0f} MiB, slope over the second half "
                   f"{data['slope_second_half_kib_per_round']:.1f} KiB/round; load "
                   f"{data['load_before']} → {data['load_after']}")
      if 'worker_rss_kib' in data:
        lines.append('')
        lines.append(f"worker_binary (the executor): RSS {data['worker_rss_first_kib'] / 1024:.0f} "
                     f"→ {data['worker_rss_last_kib'] / 1024:.0f} MiB, peak "
                     f"{data['worker_peak_rss_kib'] / 1024:.0f} MiB, slope over the second half "
                     f"{data['worker_slope_second_half_kib_per_round']:.1f} KiB/round")
    elif 'entries' in data:
      lines.append('| ' + ' | '.join(data['columns']) + ' |')
      lines.append('|' + '---|' * len(data['columns']))
      for e in data['entries']:
        lines.append('| ' + ' | '.join(
            _cell(e[c]) if c in e else '–' for c in data['columns']) + ' |')
    elif 'create' in data:  # bench/data_path.py
      lines.append(f"Stand-ins in {data['data_dir']}; K = {data['local_steps']} steps × batch "
                   f"{data['batch']}; load {data['load_before']} → {data['load_after']}")
      lines.append('')
      if data['create']:
        lines.append('| task | loading | train clients | create s | RSS after imports MiB | '
                     'peak RSS MiB |')
        lines.append('|---|---|---|---|---|---|')
        for c in data['create']:
          how = "TFF's load_data" if c.get('baseline') else 'ours'
          lines.append(f"| {c['task']} | {how} | {c['train_clients']} | {c['create_s']:.2f} | "
                       f"{c['rss_after_import_mib']:.0f} | {c['peak_rss_mib']:.0f} |")
        lines.append('')
      if data['rounds']:
        lines.append('| task | clients | sample s | build s | pipeline s | round s | '
                     'round (in-memory data) s | (sample + build) share | pipeline ÷ round | '
                     'peak RSS MiB |')
        lines.append('|---|---|---|---|---|---|---|---|---|---|')
        for r in data['rounds']:
          m = r['medians']
          lines.append(f"| {r['task']} | {r['clients']} | {m['sample_s']:.4f} | "
                       f"{m['build_s']:.3f} | {m['pipeline_s']:.3f} | {m['round_s']:.2f} | "
                       f"{m['round_mem_s']:.2f} | {100 * r['python_data_share']:.1f}% | "
                       f"{r['pipeline_over_round']:.2f} | {r['peak_rss_mib']:.0f} |")
    lines.append('')
  text = '\n'.join(lines) + '\n'
  with open(os.path.join(out_dir, 'README.md'), 'w') as f:
    f.write(text)
  return text


def _cell(value) -> str:
  if isinstance(value, float):
    return f'{value:.1e}' if 0 < abs(value) < 0.005 else f'{value:.2f}'
  return str(value)


def _markdown_cohort_notes(data) -> list:
  """The cohort targets and the cohort rows not run, under an overhead table."""
  lines = []
  t = data.get('targets') or {}
  if t.get('best_fedavg_cohort'):
    lines += ['', f"Targets: fastest FedAvg cohort row {t['best_fedavg_cohort']} "
                  f"{t['best_fedavg_cohort_over_raw']:.2f}× raw"]
    if t.get('tff_fedavg_over_best_cohort'):
      lines[-1] += f"; TFF's FedAvg takes {t['tff_fedavg_over_best_cohort']:.1f}× its round"
    if t.get('adaptive_over_fedavg_cohort'):
      lines[-1] += '; ÷ FedAvg (cohort, same execution): ' + ', '.join(
          f'{k} {v:.2f}' for k, v in t['adaptive_over_fedavg_cohort'].items() if v)
    lines[-1] += ('; every cohort update equals the per-client one' if t['all_updates_equal']
                  else '; **a cohort update differs from the per-client one**')
  skipped = data.get('cohort_skipped') or {}
  if skipped:
    lines += ['', 'Cohort rows not run (the algorithm runs per client): ' + '; '.join(
        f'{row} ({reason})' for row, reason in skipped.items())]
  failed = data.get('cohort_failed') or {}
  if failed:
    lines += ['', '**Cohort rows that failed** (build or first round): ' + '; '.join(
        f'{row} ({error})' for row, error in failed.items())]
  return lines


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--out_dir', default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   'results'))
  p.add_argument('--sections', default='overhead,scaling,memory',
                 help='comma list of overhead, scaling, memory')
  p.add_argument('--setting', default='', choices=[''] + list(SETTINGS),
                 help='one of the benchmark settings: sets --model, --clients, --local_steps, '
                      '--batch and (unless given) --tag')
  p.add_argument('--model', default='cnn', choices=sorted(MODELS))
  p.add_argument('--clients', type=int, default=10)
  p.add_argument('--local_steps', type=int, default=10)
  p.add_argument('--batch', type=int, default=20)
  p.add_argument('--reps', type=int, default=5)
  p.add_argument('--algorithms', default=','.join(
      [a for a in ALGORITHMS if a not in PERSONALISED] + [TFF_REFERENCE]),
                 help=f'also: {", ".join(PERSONALISED)} (personalised; --data=python)')
  p.add_argument('--data', default='python,ids', help='client data modes: python, ids')
  p.add_argument('--cohort_executions', default=','.join(bench_cohort.EXECUTIONS),
                 help='cohort rows (bench/bench_cohort.py) for every algorithm the cohort '
                      'execution supports, in overhead and scaling; %s only for fedavg; '
                      'empty: none' % ', '.join(bench_cohort.FEDAVG_ONLY))
  p.add_argument('--profile_rounds', type=int, default=2, help='0: no profile')
  p.add_argument('--scaling_clients', default='10,50,200')
  p.add_argument('--scaling_models', default='linear,mlp,cnn')
  p.add_argument('--scaling_algorithms', default=f'fedavg,{TFF_REFERENCE}')
  p.add_argument('--scaling_max_steps', type=int, default=2000,
                 help='skip scaling points with more than this many minibatch steps per round')
  p.add_argument('--memory_rounds', type=int, default=300)
  p.add_argument('--memory_model', default='mlp', choices=sorted(MODELS))
  p.add_argument('--memory_algorithm', default='fedavg')
  p.add_argument('--memory_execution', default='per_client', choices=['per_client', 'cohort'],
                 help="cohort: the cohort program, the round's size drawn from "
                      '[--memory_min_clients, --clients] (in-process arrays; --data ignored)')
  p.add_argument('--memory_min_clients', type=int, default=5)
  p.add_argument('--execution_concurrency', type=int, default=0,
                 help="TFF C++ executor's max_concurrent_computation_calls (0: the package's "
                      "default, two per CPU core; -1: unlimited, TFF's default)")
  p.add_argument('--tag', default='', help='suffix of the JSON file names')
  args = p.parse_args(argv)
  if args.setting:
    args.model, args.clients, args.local_steps, args.batch = SETTINGS[args.setting]
    args.tag = args.tag or args.setting
  runtime.use_local_cpp_context(max_concurrent_computation_calls=args.execution_concurrency)
  concurrency = runtime.resolve_concurrency(args.execution_concurrency)  # -1: unlimited
  sections = [s for s in args.sections.split(',') if s]
  modes = [m for m in args.data.split(',') if m]
  names = [a for a in args.algorithms.split(',') if a]
  cohort_executions = [c for c in args.cohort_executions.split(',') if c]
  tag = f'_{args.tag}' if args.tag else ''
  written = []
  if 'overhead' in sections:
    setting = Setting(args.model, args.clients, args.local_steps, args.batch)
    result = overhead_section(setting, names, modes, args.reps, args.profile_rounds,
                              cohort_executions)
    result['execution_concurrency'] = concurrency
    written.append(write(args.out_dir, f'overhead{tag}', result))
    print(json.dumps(result['rows'], indent=1), flush=True)
  if 'scaling' in sections:
    entries = []
    load_before = machine_info.load_average()
    for model in args.scaling_models.split(','):
      for clients in (int(c) for c in args.scaling_clients.split(',')):
        if clients * args.local_steps > args.scaling_max_steps:
          continue
        setting = Setting(model, clients, args.local_steps, args.batch)
        res = overhead_section(setting, args.scaling_algorithms.split(','), modes,
                               max(2, args.reps // 2), cohort_executions=cohort_executions)
        entries += [scaling_entry(model, clients, r, res['load_after'][0]) for r in res['rows']]
        print(entries[-len(res['rows']):], flush=True)
    written.append(write(args.out_dir, f'scaling{tag}', collections.OrderedDict(
        columns=SCALING_COLUMNS,
        entries=entries, load_before=load_before, load_after=machine_info.load_average(),
        execution_concurrency=concurrency)))
  if 'memory' in sections:
    setting = Setting(args.memory_model, args.clients, args.local_steps, args.batch)
    if args.memory_execution == 'cohort':
      result = memory_cohort_section(setting, args.memory_algorithm, args.memory_rounds,
                                     args.memory_min_clients)
      written.append(write(args.out_dir, f'memory_cohort{tag}', result))
      modes = []
    for mode in modes:
      result = memory_section(setting, args.memory_algorithm, mode, args.memory_rounds)
      result['execution_concurrency'] = concurrency
      written.append(write(args.out_dir, f'memory_{mode}{tag}', result))
  markdown(args.out_dir)
  runtime.shutdown_workers()
  print('wrote', *written)
  return written


if __name__ == '__main__':
  main()
