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
    'shakespeare_leaf_model', 'mnist_model', 'cifar10_model', 'finetune', 'pretrained_weights',
    'allow_random_init', 'measure_client_drift',
    'clients_per_round', 'client_batch_size', 'client_epochs_per_round',
    'local_steps', 'client_optimizer', 'client_learning_rate', 'client_beta_1', 'client_beta_2',
    'client_epsilon', 'client_weighting', 'algorithm', 'server_optimizer',
    'server_learning_rate', 'server_optimizer_semantics', 'server_beta_1', 'server_beta_2',
    'server_epsilon', 'fedgbo_upload', 'mfl_bias_correction', 'fedprox_mu', 'fedmax_beta',
    'preconditioner', 'client_lr_warmup', 'sm3_variant', 'sm3_delay', 'client_bias_correction',
    'upload_compression', 'sparsity', 'dp', 'dp_clip_norm', 'dp_noise_multiplier', 'dp_delta', 'local_steps_schedule',
    'local_steps_decay', 'local_steps_theory_b', 'schedule_window', 'plateau_patience',
    'plateau_min_delta', 'client_lr_schedule', 'client_lr_decay_rate', 'client_lr_decay_steps',
    'client_lr_staircase', 'client_lr_warmup_rounds', 'server_lr_schedule',
    'server_lr_decay_rate', 'server_lr_decay_steps', 'server_lr_staircase',
    'server_lr_warmup_rounds', 'step_time_seconds', 'measure_step_time', 'download_mbps',
    'upload_mbps', 'total_rounds', 'rounds_per_eval', 'rounds_per_checkpoint',
    'root_output_dir', 'experiment_name', 'seed', 'execution_concurrency', 'show_progress',
    'workers', 'worker_retry', 'data_on_workers',
    # Personalised FL (thesis ch. 4): MTFL, Per-FedAvg, pFedMe.
    'private', 'mtfl_strategy', 'perfedavg_beta', 'pfedme_lambda', 'pfedme_personal_learning_rate',
    'pfedme_inner_steps', 'pfedme_beta', 'noisy_client_fraction', 'noise_stddev',
    'client_state_dir')
POSITIVE_INTS = ('clients_per_round', 'client_batch_size', 'client_epochs_per_round',
                 'total_rounds', 'rounds_per_eval', 'rounds_per_checkpoint')
NON_NEGATIVE_INTS = ('num_clients', 'local_steps', 'max_client_examples')
POSITIVE_FLOATS = ('client_learning_rate', 'server_learning_rate', 'server_epsilon',
                   'client_epsilon', 'dirichlet_alpha', 'download_mbps', 'upload_mbps')
NON_NEGATIVE_FLOATS = ('fedprox_mu', 'fedmax_beta', 'step_time_seconds')
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
  from workflow import algorithms as algorithm_registry  # pylint: disable=g-import-not-at-top
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
  if cfg.get('dp'):
    if not cfg.get('dp_clip_norm') or cfg['dp_clip_norm'] <= 0:
      raise UsageError('--dp needs --dp_clip_norm, a positive L2 clip norm C')
    if cfg.get('dp_noise_multiplier') is None or cfg['dp_noise_multiplier'] < 0:
      raise UsageError('--dp needs --dp_noise_multiplier, a non-negative noise multiplier σ')
  if cfg.get('sm3_delay', 1) < 1:
    raise UsageError(f'--sm3_delay must be a positive integer; got {cfg["sm3_delay"]}')
  if (cfg.get('upload_compression') or 'none') != 'none':
    if cfg['algorithm'] in algorithm_registry.NOT_COMPRESSIBLE:
      raise UsageError(f'--upload_compression is not available for --algorithm={cfg["algorithm"]}'
                       ' (its upload is aggregated inside TFF\'s own builder)')
    if cfg.get('dp'):
      raise UsageError('--upload_compression cannot be combined with --dp')
  if not 0 <= cfg.get('sparsity', 0.0) < 1:
    raise UsageError(f'--sparsity must be in [0, 1); got {cfg["sparsity"]}')
  from tff_adaptive.schedules import driver as round_schedules  # pylint: disable=g-import-not-at-top
  try:
    round_schedules.from_config(cfg)
  except ValueError as e:
    raise UsageError(str(e)) from None
  entry = algorithm_registry.ALGORITHMS[cfg['algorithm']]
  if cfg['client_optimizer'] not in entry.client_optimizers:
    raise UsageError(f'--client_optimizer={cfg["client_optimizer"]} is not supported by '
                     f'--algorithm={cfg["algorithm"]}; it takes {", ".join(entry.client_optimizers)}')
  if entry.needs_local_steps and not cfg.get('local_steps'):
    raise UsageError(f'--algorithm={cfg["algorithm"]} needs exactly K local steps: set --local_steps')
  from tff_adaptive.execution import workers  # pylint: disable=g-import-not-at-top
  try:
    addresses = workers.parse_addresses(cfg.get('workers') or '')
  except ValueError as e:
    raise UsageError(str(e)) from None
  if cfg.get('worker_retry') and len(addresses) < 2:
    raise UsageError('--worker_retry needs at least two --workers')
  from workflow import personalization  # pylint: disable=g-import-not-at-top
  try:
    personalization.validate(cfg)
  except ValueError as e:
    raise UsageError(str(e)) from None


def experiment_dir(cfg: Mapping[str, Any]) -> str:
  name = cfg.get('experiment_name') or f'{cfg["task"]}_{cfg["algorithm"]}'
  return os.path.join(cfg['root_output_dir'], name)


_NO_DEFAULT = object()


def _flag_default(name: str) -> Any:
  """bin/train's default of flag `name` (a sentinel when bin/train's flags are not defined)."""
  try:
    return flags.FLAGS[name].default
  except KeyError:
    return _NO_DEFAULT


def prepare_output_dir(cfg: Mapping[str, Any]) -> str:
  """Checks writability and resume compatibility, then records the flags."""
  out = experiment_dir(cfg)
  flags_path = os.path.join(out, 'flags.json')
  if os.path.exists(flags_path):
    with open(flags_path) as f:
      saved = json.load(f)
    # A flag added to bin/train after the run was made is absent from its
    # flags.json: at its default it changes nothing, so the run resumes.
    changed = sorted(k for k in set(saved) | set(cfg)
                     if k not in RESUMABLE_CHANGES and saved.get(k) != cfg.get(k)
                     and not (k not in saved and cfg.get(k) == _flag_default(k)))
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


def _round_schedules(cfg, task, process):
  """The K/η/η_s schedule driver; ValueError (naming the flag) if `process` cannot follow it."""
  from tff_adaptive.schedules import driver as round_schedules  # pylint: disable=g-import-not-at-top
  driver = round_schedules.from_config(cfg)
  driver.check_process(process, data_on_workers=bool(cfg.get('data_on_workers')))
  if cfg.get('measure_step_time'):
    driver.step_seconds = measure_step_seconds(task)
    print(f'Measured β = {driver.step_seconds * 1e3:.2f} ms per minibatch step', file=sys.stderr)
  return driver


def measure_step_seconds(task, repeats: int = 30) -> float:
  """Seconds of one minibatch SGD step of the task's Keras model on this machine."""
  import time  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  model = task.keras_model_fn()
  loss_fn = task.keras_evaluation().loss_fn()  # the loss the task trains with
  optimizer = tf.keras.optimizers.SGD(0.0)
  cid = task.train_data.client_ids[0]
  batch = next(iter(task.preprocess_train(task.train_data.create_tf_dataset_for_client(cid))))
  # Tasks batch as {'x', 'y'} dicts or (x, y) tuples.
  x, y = (batch['x'], batch['y']) if isinstance(batch, Mapping) else batch

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      loss = loss_fn(y, model(x, training=True))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                  model.trainable_variables))

  step()
  start = time.perf_counter()
  for _ in range(repeats):
    step()
  return (time.perf_counter() - start) / repeats


def _dp_metrics_fn(cfg, task):
  """ε spent so far (RDP accountant), added to each round's metrics."""
  if not cfg.get('dp'):
    return None
  from tff_adaptive.accounting import privacy  # pylint: disable=g-import-not-at-top
  population = len(task.train_data.client_ids)
  rate = min(1.0, cfg['clients_per_round'] / population)
  delta = cfg.get('dp_delta') or 1.0 / population
  return lambda round_num, output: {
      'dp/epsilon': privacy.epsilon(cfg['dp_noise_multiplier'], rate, round_num, delta),
      'dp/delta': delta}


def run_training(cfg: Mapping[str, Any]):
  """Validates `cfg`, builds task and algorithm, trains; returns (state, last metrics)."""
  try:
    validate(cfg)
  except UsageError as e:
    fail(str(e))
  from tasks import registry as task_registry  # pylint: disable=g-import-not-at-top
  from workflow import program  # pylint: disable=g-import-not-at-top
  from tff_adaptive.execution import runtime  # pylint: disable=g-import-not-at-top
  from tff_adaptive.execution import workers  # pylint: disable=g-import-not-at-top
  from workflow import algorithms as algorithm_registry  # pylint: disable=g-import-not-at-top
  # Explicit, not at import: worker_binary children die with this process,
  # values serialise without TFF's nested copies (tff_adaptive.execution.runtime).
  runtime.track_tff_workers()
  addresses = workers.parse_addresses(cfg.get('workers') or '')
  if addresses:
    # Before building anything: an unreachable worker should fail in seconds.
    try:
      workers.set_workers_context(addresses, retry=cfg.get('worker_retry', False))
    except workers.WorkerError as e:
      print(f'error: {e}', file=sys.stderr)
      sys.exit(1)
  # Before building: TFF logs at INFO while it wraps Keras models, which would
  # bury the one-line error of a flag that only the built process can refute.
  logging.set_verbosity(logging.WARNING)
  try:
    task = task_registry.create_task(cfg['task'], {**cfg, 'run_dir': experiment_dir(cfg)})
    process = algorithm_registry.build(cfg['algorithm'], task, cfg)
    schedules = _round_schedules(cfg, task, process)
    client_data_fn = None
    if cfg.get('data_on_workers'):
      process, data_steps = workers.compose_data_on_workers(
          process, task, cfg.get('local_steps') or None)
      client_data_fn = workers.client_ids_fn(data_steps)
    out = prepare_output_dir(cfg)
    runtime.set_worker_log_dir(out)  # worker.log beside the run's other files
    # Personalised algorithms: noisy clients, the per-client state store
    # (a ClientStateError, a ValueError, names a foreign directory).
    from workflow import personalization  # pylint: disable=g-import-not-at-top
    task, client_state = personalization.setup(cfg, task, process, out, RESUMABLE_CHANGES)
  except (UsageError, ValueError) as e:
    fail(str(e))
  logging.set_verbosity(logging.WARNING)  # TFF logs every checkpoint at INFO too
  if not addresses:
    runtime.use_local_cpp_context(cfg.get('execution_concurrency', 0))
  loop = program.LoopConfig(
      total_rounds=cfg['total_rounds'], clients_per_round=cfg['clients_per_round'],
      rounds_per_eval=cfg['rounds_per_eval'], rounds_per_checkpoint=cfg['rounds_per_checkpoint'],
      output_dir=out, seed=cfg['seed'], local_steps=cfg.get('local_steps') or None,
      show_progress=cfg.get('show_progress', True),
      schedules=schedules, client_state=client_state)
  where = f' on {len(addresses)} workers ({", ".join(addresses)})' if addresses else ''
  print(f'Training {cfg["algorithm"]} on {cfg["task"]}{where}: output in {out}', file=sys.stderr)
  try:
    result = program.run(process, task, loop, round_metrics_fn=_dp_metrics_fn(cfg, task),
                         client_data_fn=client_data_fn)
  except program.IncompatibleCheckpoint as e:
    fail(str(e))
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
