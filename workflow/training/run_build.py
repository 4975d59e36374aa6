"""A run's parts before its rounds: the task, the process, the round schedules,
and the prepared run directory (`build`), in two steps for --together
(`build_process` writes nothing, `open_run` prepares the directory) so that a
population refused for its members' values writes nothing.
"""

import contextlib
import os
import sys
from collections.abc import Mapping

from workflow import errors
from workflow.flags import config
from workflow.flags import library_flags
from workflow.flags import validation
from workflow.training import experiment
from workflow.training import workers_setup


def build(settings: config.Settings, status: dict, process=None):
  """Task, process, schedules and client set-up, and the prepared run directory.
  `process`: a population's, built for its first member (None: built here).

  Returns (task, process, schedules, client_data_fn, client_state, out, the line that says
  how rounds run).
  """
  task, process, schedules, client_data_fn, line = build_process(settings, process)
  task, client_state, out = open_run(settings, status, task, process)
  return task, process, schedules, client_data_fn, client_state, out, line


def build_process(settings: config.Settings, process=None, task=None):
  """(task, process, schedules, client_data_fn, line) of `build`; nothing written.
  `process` and `task`, when given, are taken as they are (a population's)."""
  from tasks import registry as task_registry  # pylint: disable=g-import-not-at-top
  from tff_adaptive.execution import runtime  # pylint: disable=g-import-not-at-top
  from workflow.training import algorithm_builders  # pylint: disable=g-import-not-at-top
  runtime.set_intra_op_threads(algorithm_builders.intra_op_threads(settings))  # before any op
  run_dir = experiment.experiment_dir(settings)
  with _build_errors(settings, run_dir):
    if task is None:
      task = task_registry.create_task(
          settings.task, batch_size=settings.client.client_batch_size,
          num_epochs=config.num_epochs(settings), seed=settings.loop.seed, run_dir=run_dir)
    validation.check_task_counts(settings, task)
    line = ''
    if process is None:
      built = algorithm_builders.built(task, settings)
      process = built.process
      line = algorithm_builders.execution_line(built, bool(settings.execution.data_on_workers))
    schedules = _round_schedules(settings, task, process)
    client_data_fn = None
    if settings.execution.data_on_workers:
      process, client_data_fn = workers_setup.with_data_on_workers(settings, task, process)
  return task, process, schedules, client_data_fn, line


def open_run(settings: config.Settings, status: dict, task, process):
  """The prepared run directory of `build`: (task, client_state, out)."""
  from tff_adaptive.execution import runtime  # pylint: disable=g-import-not-at-top
  from workflow.training import personalization  # pylint: disable=g-import-not-at-top
  run_dir = experiment.experiment_dir(settings)
  with _build_errors(settings, run_dir):
    fresh = not os.path.exists(os.path.join(run_dir, 'flags.json'))
    out = experiment.prepare_output_dir(settings)
    status['out'] = status['out'] or out
    status['outs'].append(out)
    if fresh:  # the run's settings in TensorBoard's HParams table (once per run)
      from workflow.training import tensorboard_hparams  # pylint: disable=g-import-not-at-top
      tensorboard_hparams.write_hparams(out, settings)
    runtime.set_worker_log_dir(out)  # worker.log beside the run's other files
    # Personalised algorithms: noisy clients, the per-client state store
    # (a ClientStateError, a ValueError, names a foreign directory).
    task, client_state = personalization.setup(settings, task, process, out,
                                               experiment.RESUMABLE_CHANGES)
  return task, client_state, out


@contextlib.contextmanager
def _build_errors(settings: config.Settings, run_dir: str):
  """A build's errors as UsageError, in one line."""
  try:
    yield
  except errors.UsageError:
    raise
  except ValueError as e:  # the cause: user code's traceback (TFF_ADAPTIVE_TRACEBACK)
    raise errors.UsageError(library_flags.flag_message(e, settings)) from e
  except OSError as e:  # the client-state store (its directory was checked: a race or a full disk)
    raise errors.UsageError(f'cannot write {e.filename or run_dir}: {e.strerror}') from e


def _round_schedules(settings: config.Settings, task, process):
  """The K/η/η_s schedule driver; UsageError (naming the flag) if `process` cannot follow it."""
  from tff_adaptive.schedules import driver as round_schedules  # pylint: disable=g-import-not-at-top
  from workflow.flags import schedule_flags  # pylint: disable=g-import-not-at-top
  driver = schedule_flags.from_settings(settings)
  try:
    driver.check_process(process, data_on_workers=settings.execution.data_on_workers)
  except round_schedules.ScheduleError as e:
    raise errors.UsageError(library_flags.flag_message(e)) from None
  if settings.schedules.measure_step_time:
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
  batch = next(iter(task.preprocess_train(task.train_data.create_tf_dataset_for_client(cid), cid)))
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
