"""What `bin/train` does with its flags: validate, prepare the output, run.

Kept out of the binary so that tests (and users' own scripts) can call
`run_training(config)` in-process with a plain dict.
"""

import json
import os
import sys
from collections.abc import Mapping
from typing import Any, NoReturn

from absl import flags
from absl import logging

# Flags whose change does not alter the computation: allowed on resume.
RESUMABLE_CHANGES = frozenset({'total_rounds', 'rounds_per_eval', 'rounds_per_checkpoint',
                               'show_progress', 'execution_concurrency', 'root_output_dir',
                               # Where rounds run, not what they compute: a run
                               # may resume on other or fewer workers.
                               'workers', 'worker_retry', 'data_on_workers'})
TRAIN_FLAG_NAMES = (
    'task', 'partition', 'num_clients', 'dirichlet_alpha', 'digits_model', 'synthetic_alpha',
    'synthetic_beta', 'data_dir', 'max_client_examples', 'cifar100_image_model',
    'emnist_character_model', 'shakespeare_character_model', 'femnist_model',
    'shakespeare_leaf_model', 'mnist_model', 'cifar10_model',
    'clients_per_round', 'client_batch_size', 'client_epochs_per_round',
    'local_steps', 'client_optimizer', 'client_learning_rate', 'client_beta_1', 'client_beta_2',
    'client_epsilon', 'client_weighting', 'algorithm', 'server_optimizer',
    'server_learning_rate', 'server_optimizer_semantics', 'server_beta_1', 'server_beta_2',
    'server_epsilon', 'fedgbo_upload', 'mfl_bias_correction', 'fedprox_mu', 'fedmax_beta',
    'total_rounds', 'rounds_per_eval', 'rounds_per_checkpoint',
    'root_output_dir', 'experiment_name', 'seed', 'execution_concurrency', 'show_progress',
    'workers', 'worker_retry', 'data_on_workers')
POSITIVE_INTS = ('clients_per_round', 'client_batch_size', 'client_epochs_per_round',
                 'total_rounds', 'rounds_per_eval', 'rounds_per_checkpoint')
NON_NEGATIVE_INTS = ('num_clients', 'local_steps', 'max_client_examples')
POSITIVE_FLOATS = ('client_learning_rate', 'server_learning_rate', 'server_epsilon',
                   'client_epsilon', 'dirichlet_alpha')
NON_NEGATIVE_FLOATS = ('fedprox_mu', 'fedmax_beta')
UNIT_INTERVAL = ('server_beta_1', 'server_beta_2', 'client_beta_1', 'client_beta_2')  # [0, 1)


class UsageError(ValueError):
  pass


def fail(message: str) -> NoReturn:
  """One line on stderr, exit status 2 (bad usage), nothing written."""
  print(f'{os.path.basename(sys.argv[0])}: error: {message}', file=sys.stderr)
  sys.exit(2)


def parse_flags_or_exit(argv):
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    fail(str(e))


def validate(cfg: Mapping[str, Any]) -> None:
  """Raises UsageError naming the first bad flag."""
  from tasks import registry as task_registry  # pylint: disable=g-import-not-at-top
  from tff_adaptive.algorithms import registry as algorithm_registry  # pylint: disable=g-import-not-at-top
  if cfg['task'] not in task_registry.TASKS:
    raise UsageError(f'--task must be one of {", ".join(sorted(task_registry.TASKS))}; '
                     f'got {cfg["task"]!r}')
  if cfg['algorithm'] not in algorithm_registry.ALGORITHMS:
    raise UsageError(f'--algorithm must be one of '
                     f'{", ".join(sorted(algorithm_registry.ALGORITHMS))}; got {cfg["algorithm"]!r}')
  for name in POSITIVE_INTS:
    if name in cfg and cfg[name] < 1:
      raise UsageError(f'--{name} must be a positive integer; got {cfg[name]}')
  for name in NON_NEGATIVE_INTS:
    if name in cfg and cfg[name] < 0:
      raise UsageError(f'--{name} must be a non-negative integer; got {cfg[name]}')
  for name in POSITIVE_FLOATS:
    value = cfg.get(name)
    if value is not None and not (value > 0 and value < float('inf')):
      raise UsageError(f'--{name} must be a positive number; got {value}')
  for name in NON_NEGATIVE_FLOATS:
    value = cfg.get(name)
    if value is not None and not 0 <= value < float('inf'):
      raise UsageError(f'--{name} must be a non-negative number; got {value}')
  for name in UNIT_INTERVAL:
    value = cfg.get(name)
    if value is not None and not 0 <= value < 1:
      raise UsageError(f'--{name} must be in [0, 1); got {value}')
  from tff_adaptive.algorithms import fedopt  # pylint: disable=g-import-not-at-top
  if cfg.get('server_optimizer') and cfg['server_optimizer'] not in fedopt.SERVER_OPTIMIZERS:
    raise UsageError(f'--server_optimizer must be one of {", ".join(fedopt.SERVER_OPTIMIZERS)}; '
                     f'got {cfg["server_optimizer"]!r}')
  entry = algorithm_registry.ALGORITHMS[cfg['algorithm']]
  if cfg['client_optimizer'] not in entry.client_optimizers:
    raise UsageError(f'--client_optimizer={cfg["client_optimizer"]} is not supported by '
                     f'--algorithm={cfg["algorithm"]}; it takes {", ".join(entry.client_optimizers)}')
  if entry.needs_local_steps and not cfg.get('local_steps'):
    raise UsageError(f'--algorithm={cfg["algorithm"]} needs exactly K local steps: set --local_steps')
  from tff_adaptive import workers  # pylint: disable=g-import-not-at-top
  try:
    addresses = workers.parse_addresses(cfg.get('workers') or '')
  except ValueError as e:
    raise UsageError(str(e)) from None
  if cfg.get('worker_retry') and len(addresses) < 2:
    raise UsageError('--worker_retry needs at least two --workers')


def experiment_dir(cfg: Mapping[str, Any]) -> str:
  name = cfg.get('experiment_name') or f'{cfg["task"]}_{cfg["algorithm"]}'
  return os.path.join(cfg['root_output_dir'], name)


def prepare_output_dir(cfg: Mapping[str, Any]) -> str:
  """Checks writability and resume compatibility, then records the flags."""
  out = experiment_dir(cfg)
  flags_path = os.path.join(out, 'flags.json')
  if os.path.exists(flags_path):
    with open(flags_path) as f:
      saved = json.load(f)
    changed = sorted(k for k in set(saved) | set(cfg)
                     if k not in RESUMABLE_CHANGES and saved.get(k) != cfg.get(k))
    if changed:
      diffs = ', '.join(f'--{k}={cfg.get(k)!r} (saved {saved.get(k)!r})' for k in changed)
      raise UsageError(f'{out} holds a run with different flags: {diffs}; use another '
                       f'--experiment_name or --root_output_dir, or rerun with the saved flags')
  try:
    os.makedirs(out, exist_ok=True)
    probe = os.path.join(out, '.write_probe')
    with open(probe, 'w') as f:
      f.write('ok')
    os.remove(probe)
  except OSError as e:
    raise UsageError(f'--root_output_dir={cfg["root_output_dir"]!r} is not writable '
                     f'({e.strerror}: {out})') from None
  with open(flags_path + '.tmp', 'w') as f:
    json.dump(dict(cfg), f, indent=1, sort_keys=True)
  os.replace(flags_path + '.tmp', flags_path)
  return out


def run_training(cfg: Mapping[str, Any]):
  """Validates `cfg`, builds task and algorithm, trains; returns (state, last metrics)."""
  try:
    validate(cfg)
  except UsageError as e:
    fail(str(e))
  from tasks import registry as task_registry  # pylint: disable=g-import-not-at-top
  from tff_adaptive import program  # pylint: disable=g-import-not-at-top
  from tff_adaptive import runtime  # pylint: disable=g-import-not-at-top
  from tff_adaptive import workers  # pylint: disable=g-import-not-at-top
  from tff_adaptive.algorithms import registry as algorithm_registry  # pylint: disable=g-import-not-at-top
  addresses = workers.parse_addresses(cfg.get('workers') or '')
  if addresses:
    # Before building anything: an unreachable worker should fail in seconds.
    try:
      workers.set_workers_context(addresses, retry=cfg.get('worker_retry', False))
    except workers.WorkerError as e:
      print(f'error: {e}', file=sys.stderr)
      sys.exit(1)
  try:
    task = task_registry.create_task(cfg['task'], cfg)
    process = algorithm_registry.build(cfg['algorithm'], task, cfg)
    client_data_fn = None
    if cfg.get('data_on_workers'):
      process, data_steps = workers.compose_data_on_workers(
          process, task, cfg.get('local_steps') or None)
      client_data_fn = workers.client_ids_fn(data_steps)
    out = prepare_output_dir(cfg)
  except (UsageError, ValueError) as e:
    fail(str(e))
  logging.set_verbosity(logging.WARNING)  # TFF logs every checkpoint at INFO
  if not addresses:
    runtime.use_local_cpp_context(cfg.get('execution_concurrency', -1))
  loop = program.LoopConfig(
      total_rounds=cfg['total_rounds'], clients_per_round=cfg['clients_per_round'],
      rounds_per_eval=cfg['rounds_per_eval'], rounds_per_checkpoint=cfg['rounds_per_checkpoint'],
      output_dir=out, seed=cfg['seed'], local_steps=cfg.get('local_steps') or None,
      show_progress=cfg.get('show_progress', True))
  where = f' on {len(addresses)} workers ({", ".join(addresses)})' if addresses else ''
  print(f'Training {cfg["algorithm"]} on {cfg["task"]}{where}: output in {out}', file=sys.stderr)
  try:
    result = program.run(process, task, loop, client_data_fn=client_data_fn)
  except program.TrainingDiverged as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(1)
  except workers.WorkerError as e:
    # One readable message, no TFF traceback: the fix is operational.
    print(f'error: {e}', file=sys.stderr)
    for note in getattr(e, '__notes__', ()):
      print(note, file=sys.stderr)
    print('Rerun the same command once the worker is back (or without it in --workers) to '
          'resume from the last checkpoint.', file=sys.stderr)
    sys.exit(1)
  finally:
    runtime.shutdown_workers()
  return result
