"""Peers side by side: the same FedAvg rounds in pfl-research, FedJAX, Flower, TFF and ours.

  make bench-peers                       # = nice -n 10 .venv/bin/python bench/peers.py
  .venv/bin/python bench/peers.py --settings=mlp_50x10 --reps=1
  .venv/bin/python bench/peers.py --dry_run --out_dir=/tmp/peers   # seconds, no peer env

For each setting (peer_common.SETTINGS: the digits MLP 50 × 10 × B20, the
EMNIST CNN 10 × 10 × B20, the Shakespeare GRU 10 × 10 × B4, pfl-research's
CIFAR-10 benchmark shape 50 × 5 × B10 with its small CNN), one process per
row, alternated row by row and repetition by repetition in one invocation
(the order rotated each repetition, so background load falls on every row
alike):

  ours_auto        FedAvg as bin/train builds and feeds it by default (cohort, auto)
  ours_per_client  the same with --execution=per_client
  tff_fedavg       TFF's tff.learning.algorithms.build_weighted_fed_avg
  pfl_fedavg       pfl-research's FederatedAveraging on its SimulatedBackend
  fedjax_fedavg    FedJAX's fed_avg with the models in Haiku
  flower_fedavg    Flower's FedAvg strategy in its Simulation Runtime (Ray), the clients
                   running the raw loop's client body (peer_flower.py)
  raw_main         the raw FedAvg loop (peer_common.RawLoop) in the package's environment
  raw_pfl          the same loop in pfl-research's environment
  raw_flower       the same loop in Flower's environment

pfl-research needs TensorFlow >= 2.16 and Flower protobuf >= 5, the package TF
2.14 (protobuf < 5): each peer has its own virtual environment under bench/peer_envs/ (gitignored), created and
installed here on first use (`PEER_ENVS`; pip, from the package index).
pfl 0.6.0's TFModel keys the model's variables by `variable.name`, which
Keras 3 does not make unique ('kernel', 'bias' for every layer): with Keras 3
it trains and averages only the last layer's variables. Its environment
therefore runs with TF_USE_LEGACY_KERAS=1 (tf_keras, which pfl's TensorFlow
extra installs), where every engine's final loss matches.

Same work, shown: every process loads one file per setting (initial weights
and every client's examples, written once by `peer_worker.py --engine=prepare`)
and reports the loss of its final global weights on all clients' examples and
its final weights; the JSON has every row's loss and its weights' largest
difference to ours_auto's, `loss_equal` within `loss_rtol`.

Writes `<out_dir>/peers.json` and the "Against other frameworks" table
between the markers in `--doc` (docs/performance.md).
"""

import argparse
import collections
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

import numpy as np

# BEGIN, END: re-exported for the tests.
import machine_info
from peers_report import BEGIN, END, REFERENCE  # pylint: disable=unused-import
from peers_report import markdown, update_doc

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, 'peer_worker.py')
SCHEMA_VERSION = 1
SETTINGS = ('mlp_50x10', 'cnn_10x10', 'gru_10x10', 'cifar10_50x5')

# Peer environments: pip requirements, environment variables of their
# processes, and the probe that says an existing environment is usable.
PEER_ENVS = collections.OrderedDict([
    ('pfl', dict(requirements=['pfl[tf]==0.6.0', 'tensorflow>=2.16'],
                 env={'TF_USE_LEGACY_KERAS': '1'},
                 probe=('import pfl, tensorflow as tf; '
                        "assert pfl.__version__ == '0.6.0', pfl.__version__; "
                        "assert tuple(map(int, tf.__version__.split('.')[:2])) >= (2, 16)"))),
    # fedjax 0.0.17 (its last release) calls jax.tree_map, which JAX removed in
    # 0.6: the JAX, Haiku and Optax of its time, pinned together.
    ('fedjax', dict(requirements=['fedjax==0.0.17', 'jax==0.4.30', 'jaxlib==0.4.30',
                                  'optax==0.2.2', 'dm-haiku==0.0.12', 'chex==0.1.86', 'numpy<2'],
                    env={},
                    probe=('import jax, fedjax, haiku; from fedjax.algorithms import fed_avg; '
                           'jax.tree_map'))),
    # flwr 1.42 needs protobuf >= 5, which TF 2.14 does not take: TF 2.21 with tf_keras,
    # as in pfl-research's environment, so the two TF 2.21 peers run the same Keras.
    # Telemetry and Ray's usage stats off: they would report over the network.
    ('flower', dict(requirements=['flwr[simulation]==1.42.0', 'tensorflow==2.21.0',
                                  'tf-keras==2.21.0'],
                    env={'TF_USE_LEGACY_KERAS': '1', 'FLWR_TELEMETRY_ENABLED': '0',
                         'RAY_USAGE_STATS_ENABLED': '0'},
                    probe=('import flwr, ray, tf_keras; from flwr.simulation import run_simulation; '
                           "assert flwr.__version__ == '1.42.0', flwr.__version__"))),
])
# (row, environment, engine of peer_worker.py), in the order of the first repetition.
ROWS = [('ours_auto', 'main', 'ours_auto'), ('pfl_fedavg', 'pfl', 'pfl_fedavg'),
        ('ours_per_client', 'main', 'ours_per_client'), ('raw_pfl', 'pfl', 'raw'),
        ('tff_fedavg', 'main', 'tff_fedavg'), ('fedjax_fedavg', 'fedjax', 'fedjax_fedavg'),
        ('raw_main', 'main', 'raw'), ('flower_fedavg', 'flower', 'flower_fedavg'),
        ('raw_flower', 'flower', 'raw')]
# Rows only some settings have: the recurrent model's clients in sequence beside
# bin/train's default, which vectorises them since the recurrent cohort change.
SETTING_ROWS = {'gru_10x10': [('ours_sequential', 'main', 'ours_sequential')]}
# The ratios' denominator when bin/train's default has no round (failed or not run).
FALLBACK_REFERENCE = 'ours_sequential'
PEER = 'pfl_fedavg'
TARGET = 0.5  # ours_auto's round at most this fraction of pfl-research's
LOSS_RTOL = 1e-4
# Settings whose rows cannot give the same loss, and why (a looser tolerance).
LOSS_EXCEPTIONS = {
    'cifar10_50x5': (1e-3, "dropout: each framework draws its own masks from its own random "
                           "generator, so the trajectories differ by the masks' noise (compare "
                           "the two raw loops: the same code, two generators)"),
}


def checkout() -> collections.OrderedDict:
  """The commit measured and the package files that differed from it (other work in
  the same checkout changes what `ours` runs)."""
  def git(*args):
    done = subprocess.run(['git', *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout.rstrip('\n')  # a porcelain line starts with its status columns
  changed = git('status', '--porcelain', '--', 'tff_adaptive', 'workflow', 'tasks')
  return collections.OrderedDict(commit=git('rev-parse', 'HEAD').strip(),
                                 uncommitted=[l[3:] for l in changed.splitlines() if l.strip()])


def env_python(envs_dir: str, name: str) -> str:
  return os.path.join(envs_dir, name, 'bin', 'python')


def ensure_env(envs_dir: str, name: str) -> str:
  """The python of peer environment `name`, created and installed if it is not usable."""
  spec = PEER_ENVS[name]
  python = env_python(envs_dir, name)
  if os.path.exists(python) and _probe(python, spec) is None:
    return python
  print(f'peers: creating {os.path.relpath(os.path.dirname(os.path.dirname(python)), ROOT)} '
        f"({' '.join(spec['requirements'])})", flush=True)
  subprocess.run([sys.executable, '-m', 'venv', '--clear', os.path.join(envs_dir, name)],
                 check=True)
  subprocess.run([python, '-m', 'pip', 'install', '-q', *spec['requirements']], check=True)
  error = _probe(python, spec)
  if error:
    raise SystemExit(f'peers: the {name} environment does not work after installing: {error}')
  return python


def _probe(python: str, spec) -> str:
  """None if the environment imports what it must, else the error's last line."""
  done = subprocess.run([python, '-c', spec['probe']], capture_output=True, text=True,
                        env=_child_env(spec['env']), check=False)
  lines = done.stderr.strip().splitlines()
  return None if done.returncode == 0 else (lines[-1] if lines else f'exit {done.returncode}')


def _child_env(extra) -> dict:
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', **extra)
  env.pop('PYTHONPATH', None)  # a peer's environment must not see the package's modules
  return env


def committed_source(commit: str, dest_root: str) -> str:
  """A copy of `commit`'s files (git archive) in dest_root/<commit>: its root."""
  dest = os.path.join(dest_root, commit)
  for old in os.listdir(dest_root) if os.path.isdir(dest_root) else []:
    if old != commit:  # earlier commits' copies: only the measured one is kept
      shutil.rmtree(os.path.join(dest_root, old), ignore_errors=True)
  if not os.path.exists(os.path.join(dest, 'bench', 'peer_worker.py')):
    os.makedirs(dest + '.tmp', exist_ok=True)
    archive = subprocess.run(['git', 'archive', '--format=tar', commit], cwd=ROOT,
                             capture_output=True, check=True).stdout
    subprocess.run(['tar', '-x', '-C', dest + '.tmp'], input=archive, check=True)
    os.replace(dest + '.tmp', dest)
  return dest


def run_worker(python: str, engine: str, args: list, log_path: str, extra_env, timeout: float):
  """(result dict or None, error line or None) of one peer_worker.py process."""
  with open(log_path, 'w') as log:
    # Its own process group: a worker that times out is killed with the processes it
    # started (Flower's Ray head and actors), which would otherwise outlive it.
    worker = subprocess.Popen([python, WORKER, f'--engine={engine}', *args], stdout=log,
                              stderr=subprocess.STDOUT, env=_child_env(extra_env), cwd=ROOT,
                              start_new_session=True)
    try:
      code = worker.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      os.killpg(worker.pid, signal.SIGKILL)
      worker.wait()
      return None, (f'killed after {timeout:.0f} s without a result (a worker writes it after '
                    'its last round)')
  if code == 0:
    return None, None
  with open(log_path) as f:
    lines = [l.strip() for l in f if l.strip()]
  return None, f"exit {code}: {lines[-1] if lines else ''}"[:300]


def prepare(settings, data_dir: str, tiny: bool, timeout: float) -> None:
  args = [f'--data_dir={data_dir}', f"--settings={','.join(settings)}"]
  args += ['--tiny'] if tiny else []
  _, error = run_worker(sys.executable, 'prepare', args, os.path.join(data_dir, 'prepare.log'), {},
                        timeout)
  if error:
    raise SystemExit(f'peers: writing the setting files failed ({error}); '
                     f'see {data_dir}/prepare.log')


def measure_setting(name: str, rows, pythons, data_dir: str, reps: int, rounds: int,
                    timeout: float) -> dict:
  """Every row of one setting, `reps` processes each, alternated; raw results per row."""
  load_before = machine_info.load_average()
  per_row = collections.OrderedDict((row, []) for row, _, _ in rows)
  errors = {}
  for rep in range(reps):
    shift = rep % max(1, len(rows))
    order = rows[shift:] + rows[:shift]
    for row, env, engine in order:
      if row in errors:
        continue
      out = os.path.join(data_dir, f'{name}.{row}.{rep}.json')
      extra = PEER_ENVS[env]['env'] if env in PEER_ENVS else {}
      t0 = time.perf_counter()
      _, error = run_worker(pythons[env], engine,
                            [f"--data={os.path.join(data_dir, name + '.npz')}",
                             f'--rounds={rounds}', f'--out={out}'],
                            out[:-5] + '.log', extra, timeout)
      if error:
        errors[row] = error
        print(f'peers: {name} {row} failed ({error})', flush=True)
        continue
      with open(out) as f:
        result = json.load(f)
      result['process_s'] = time.perf_counter() - t0
      result['weights_path'] = out[:-5] + '.npz'
      result['data_path'] = os.path.join(data_dir, name + '.npz')
      per_row[row].append(result)
      print(f"peers: {name} {row} rep {rep}: rounds "
            f"{', '.join(f'{t:.3f}' for t in result['round_times_s'])} s", flush=True)
  return dict(results=per_row, errors=errors, load_before=load_before,
              load_after=machine_info.load_average())


def _weights(path):
  with np.load(path) as f:
    return [f[k] for k in sorted(f.files, key=lambda k: int(k.split('_')[1]))]


def summarize(name: str, measured: dict, warmup: int, skipped: dict) -> collections.OrderedDict:
  """One setting's rows: median timed round, ratios to ours_auto, loss and weights checks."""
  rtol, why = LOSS_EXCEPTIONS.get(name, (LOSS_RTOL, ''))
  rows = collections.OrderedDict()
  reference_row = REFERENCE if measured['results'].get(REFERENCE) else FALLBACK_REFERENCE
  reference = measured['results'].get(reference_row) or []
  ref_weights = _weights(reference[0]['weights_path']) if reference else None
  if reference:  # the setting file's initial weights: how far ours moved them
    with np.load(reference[0]['data_path']) as f:
      ref_initial = [f[f'w{i}'] for i in range(len(ref_weights))]
  for row, results in measured['results'].items():
    if not results:
      rows[row] = dict(error=measured['errors'].get(row) or skipped.get(row, 'not run'))
      continue
    timed = [t for r in results for t in r['round_times_s'][warmup:]]
    first = results[0]
    entry = collections.OrderedDict(
        round_s=statistics.median(timed), timed_rounds_s=timed,
        warmup_rounds_s=[r['round_times_s'][:warmup] for r in results],
        build_s=[r['build_s'] for r in results], process_s=[r['process_s'] for r in results],
        initial_loss=first['initial_loss'], final_loss=first['final_loss'],
        final_loss_per_process=[r['final_loss'] for r in results],
        versions=first['versions'], notes=first['notes'])
    if reference:
      ref = reference[0]
      entry['ratio_to_ours'] = entry['round_s'] / statistics.median(
          [t for r in reference for t in r['round_times_s'][warmup:]])
      entry['loss_rel_diff'] = abs(first['final_loss'] - ref['final_loss']) / abs(ref['final_loss'])
      entry['loss_equal'] = bool(entry['loss_rel_diff'] <= rtol)
      weights = _weights(first['weights_path'])
      entry['weights_max_abs_diff'] = max(float(np.max(np.abs(a - b)))
                                          for a, b in zip(weights, ref_weights))
      entry['ours_update_max_abs'] = max(float(np.max(np.abs(a - b)))
                                         for a, b in zip(ref_weights, ref_initial))
    rows[row] = entry
  ours, peer = rows.get(REFERENCE, {}), rows.get(PEER, {})
  target = None
  if 'round_s' in ours and 'round_s' in peer:
    target = collections.OrderedDict(ours_over_pfl=ours['round_s'] / peer['round_s'],
                                     met=bool(ours['round_s'] <= TARGET * peer['round_s']))
  return collections.OrderedDict(rows=rows, reference_row=reference_row if reference else None,
                                 loss_rtol=rtol, loss_rtol_reason=why, target=target,
                                 load_before=measured['load_before'],
                                 load_after=measured['load_after'])


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--settings', default=','.join(SETTINGS))
  p.add_argument('--rows', default=','.join(
      [row for row, _, _ in ROWS] + [r for extra in SETTING_ROWS.values() for r, _, _ in extra]))
  p.add_argument('--reps', type=int, default=2, help='processes per row and setting')
  p.add_argument('--warmup', type=int, default=1,
                 help='untimed rounds at the start of a process (tracing, XLA compilation)')
  p.add_argument('--timed', type=int, default=2, help='timed rounds per process')
  p.add_argument('--out_dir', default=os.path.join(HERE, 'results'))
  p.add_argument('--doc', default=os.path.join(ROOT, 'docs', 'performance.md'))
  p.add_argument('--envs_dir', default=os.path.join(HERE, 'peer_envs'))
  p.add_argument('--data_dir', default=os.path.join(HERE, 'tmp', 'peers'))
  # The slowest process that finished took 114 s (CIFAR shape, ours, load 12).
  p.add_argument('--timeout', type=float, default=600.0, help='seconds per process')
  p.add_argument('--update', action='store_true',
                 help="keep <out_dir>/peers.json's other settings, and in the settings measured "
                      'the rows not in --rows (marked with the date they come from)')
  p.add_argument('--package', default='committed', choices=['committed', 'worktree'],
                 help="committed: run every worker from a copy of HEAD's files, so that "
                      'uncommitted edits in this checkout (other work in progress) do not change '
                      "what `ours` measures; worktree: this checkout's files")
  p.add_argument('--render_only', action='store_true',
                 help="rewrite --doc's table from <out_dir>/peers.json, measuring nothing")
  p.add_argument('--dry_run', action='store_true',
                 help='no peer environment: tiny settings, the raw loop of the first setting '
                      'in the package environment only, one process, one timed round; writes '
                      'to --out_dir and a standalone section (never --doc\'s default)')
  return p


def main(argv=None):
  p = _parser()
  args = p.parse_args(argv)
  if args.render_only:
    with open(os.path.join(args.out_dir, 'peers.json')) as f:
      result = json.load(f, object_pairs_hook=collections.OrderedDict)
    update_doc(args.doc, markdown(result))
    return result
  settings = [s for s in args.settings.split(',') if s]
  wanted = [r for r in args.rows.split(',') if r]
  if args.dry_run:
    args.reps, args.warmup, args.timed, args.update = 1, 1, 1, False
    if args.doc == p.get_default('doc'):
      args.doc = os.path.join(args.out_dir, 'peers_section.md')
    if args.data_dir == p.get_default('data_dir'):
      args.data_dir = os.path.join(args.out_dir, 'data')
  os.makedirs(args.out_dir, exist_ok=True)
  os.makedirs(args.data_dir, exist_ok=True)
  source = checkout()
  source['package'] = 'worktree' if args.dry_run else args.package
  if source['package'] == 'committed':
    global WORKER  # pylint: disable=global-statement
    WORKER = os.path.join(committed_source(source['commit'],
                                           os.path.join(HERE, 'tmp', 'peers_src')),
                          'bench', 'peer_worker.py')
  all_rows = ROWS + [r for extra in SETTING_ROWS.values() for r in extra]
  pythons, skipped = {'main': sys.executable}, {}
  for env in sorted({e for r, e, _ in all_rows if r in wanted} - {'main'}):
    if args.dry_run:
      skipped.update({r: 'dry run: no peer environment' for r, e, _ in all_rows if e == env})
    else:
      pythons[env] = ensure_env(args.envs_dir, env)
  result = collections.OrderedDict(
      # 'benchmark', not bench/run.py's 'section': run.py's results/README.md renders the
      # JSON files with a section, and this one has its own table.
      schema_version=SCHEMA_VERSION, benchmark='peers', machine=machine_info.machine(),
      checkout=source,
      date=datetime.datetime.now().strftime('%Y-%m-%d %H:%M'), dry_run=args.dry_run,
      reps=args.reps,
      warmup=args.warmup, rounds=args.warmup + args.timed, target=TARGET,
      load_before=machine_info.load_average(),
      settings=collections.OrderedDict())
  prepare(settings, args.data_dir, args.dry_run, args.timeout)
  for i, name in enumerate(settings):
    rows = ROWS + SETTING_ROWS.get(name, [])
    run_rows = [r for r in rows if r[0] in wanted and r[1] in pythons
                and (not args.dry_run or (i == 0 and r[0] == 'raw_main'))]
    not_run = {r: skipped.get(r, 'dry run: only raw_main of the first setting' if args.dry_run
                              else 'not asked for') for r, _, _ in rows}
    measured = measure_setting(name, run_rows, pythons, args.data_dir, args.reps,
                               args.warmup + args.timed, args.timeout)
    measured['results'] = collections.OrderedDict(
        (r, measured['results'].get(r, [])) for r, _, _ in rows)
    result['settings'][name] = summarize(name, measured, args.warmup, not_run)
  result['load_after'] = machine_info.load_average()
  path = os.path.join(args.out_dir, 'peers.json')
  if args.update and os.path.exists(path):
    result = _merged(path, result, wanted)
  result['versions'] = _versions(result)
  with open(path, 'w') as f:
    json.dump(result, f, indent=1)
  update_doc(args.doc, markdown(result))
  print(markdown(result))
  print('wrote', path, args.doc)
  return result


def _merged(path: str, new: dict, measured_rows) -> dict:
  """`new` with the previous run's settings it did not measure, and in the settings it
  did, the previous rows it did not run (marked with their run's date). The ratios of a
  kept row stay those of its own run."""
  with open(path) as f:
    old = json.load(f, object_pairs_hook=collections.OrderedDict)
  merged = collections.OrderedDict()
  for name in list(old['settings']) + [n for n in new['settings'] if n not in old['settings']]:
    if name not in new['settings']:
      merged[name] = old['settings'][name]
      merged[name].setdefault('date', old['date'])
      merged[name].setdefault('commit', old.get('checkout', {}).get('commit'))
      continue
    setting = new['settings'][name]
    setting['date'], setting['commit'] = new['date'], new.get('checkout', {}).get('commit')
    for row, entry in old['settings'].get(name, {}).get('rows', {}).items():
      if row not in measured_rows:
        setting['rows'][row] = dict(entry, from_run=entry.get('from_run', old['date']),
                                    from_commit=old.get('checkout', {}).get('commit'))
    merged[name] = setting
  new['settings'] = merged
  return new


def _versions(result) -> collections.OrderedDict:
  """Each environment's versions, from its first process that ran."""
  found = collections.OrderedDict()
  for s in result['settings'].values():
    for row, env, _ in ROWS + [r for extra in SETTING_ROWS.values() for r in extra]:
      entry = s['rows'].get(row, {})
      if 'versions' in entry and env not in found:
        found[env] = entry['versions']
  return found


if __name__ == '__main__':
  main()
