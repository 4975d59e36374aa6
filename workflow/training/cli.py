"""What `bin/train` does with its flags: resolve, validate, prepare the output, run.

Kept out of the binary so that tests (and users' own scripts) can call
`run_training(settings)` in-process with `config.from_flags({...})` or the
settings of `config_from_args([...])`. It returns the result or
raises a `workflow.errors.RunError` (a usage error, a failed run, a stop by
signal) that says what to print and with which status to exit; only bin/train
exits. The flag checks are workflow/flags/validation.py's, the run's name and
directory workflow/training/experiment.py's.
"""

import contextlib
import logging as std_logging
import os
import signal
import sys

from absl import flags
from absl import logging

from workflow import errors
from workflow.flags import config
from workflow.flags import flagfiles
from workflow.flags import train_flags
from workflow.flags import validation
from workflow.training import experiment
from workflow.training import run_build
from workflow.training import workers_setup


HELP_ARGS = ('--help', '-help', '-h', '-?', '--helpshort', '-helpshort')


def wants_help(argv) -> bool:
  return any(a in HELP_ARGS for a in argv[1:])


def parse_flags(argv, flag_values: flags.FlagValues = flags.FLAGS):
  """absl's parse of a command line; UsageError (one line) for a bad one.

  Also for a --flagfile that is not text (absl reads it as UTF-8), and for
  flagfiles that include themselves (absl would skip them with a warning).
  """
  chain = flagfiles.cycle(argv[1:])
  if chain:
    raise errors.UsageError(f'--flagfile: {chain}: a flagfile may not include itself, directly or '
                            'through others')
  try:
    return flag_values(argv)
  except flags.Error as e:
    raise errors.UsageError(str(e)) from None
  except UnicodeDecodeError as e:
    files = [a.split('=', 1)[1] for a in argv[1:] if a.startswith(('--flagfile=', '-flagfile='))]
    raise errors.UsageError(f'--flagfile={",".join(files) or "?"}: not a text file of flags (byte '
                            f'{e.start} is not UTF-8)') from None


def flags_parser(program: str, flag_values: flags.FlagValues = flags.FLAGS):
  """absl's `app.run(main, flags_parser=...)` for a binary other than bin/train:
  `parse_flags`, a refusal printed as `<program>: error: ...`, exit 2."""

  def parse(argv):
    try:
      return parse_flags(argv, flag_values)
    except errors.UsageError as e:  # a bad value, a flagfile that is not text or includes itself
      print(f'{program}: error: {e}', file=sys.stderr)
      sys.exit(2)

  return parse


def resolve_flags(flag_values: flags.FlagValues) -> tuple[config.Settings, list[str]]:
  """The settings of parsed bin/train flags: --preset, then the algorithm's defaults.

  Flags given on the command line win over the preset, and both over the
  algorithm's defaults (`workflow.flags.algorithms.AlgorithmEntry.defaults`).
  Returns (settings, notes): what the preset and the defaults set, one line
  each, for `run_training` to print once the settings are known to be valid.
  Raises UsageError for an unknown preset.
  """
  from workflow.flags import algorithms as algorithm_registry  # pylint: disable=g-import-not-at-top
  from workflow.flags import presets  # pylint: disable=g-import-not-at-top
  explicit = train_flags.explicit_flags(flag_values)
  notes = []
  if flag_values['preset'].value:
    name = flag_values['preset'].value
    try:
      applied = presets.apply(name, flag_values)
    except presets.UnknownPresetError as e:
      raise errors.UsageError(str(e)) from None
    notes.append(f'--preset={name} sets {" ".join(applied) or "nothing (all given)"}')
    explicit |= {a[2:].split('=', 1)[0] for a in applied}
  settings = config.from_flags(train_flags.config_from_flags(flag_values))
  settings, applied = algorithm_registry.apply_defaults(settings, explicit)
  notes += [f'{settings.server.algorithm}: {a} (this algorithm\'s default)' for a in applied]
  return settings, notes


def config_from_args(args, program: str = 'bin/train.py') -> tuple[config.Settings, list[str]]:
  """`resolve_flags` of a bin/train command line (without the program), parsed on its own
  FlagValues: what bin/train would run, for tests and scripts that run in-process."""
  return resolve_flags(parsed_args(args, program))


def parsed_args(args, program: str = 'bin/train.py') -> flags.FlagValues:
  """bin/train's flags parsed from a command line (without the program), on their own."""
  values = flags.FlagValues()
  train_flags.define_flags(values)
  try:
    values([program, *args])
  except flags.Error as e:
    raise errors.UsageError(str(e)) from None
  return values


def check_settings(settings: config.Settings) -> None:
  """Every check of a run's settings that needs neither TensorFlow nor the built task.

  The flags (`validation.validate`), the data directory, the output paths and the run
  directory's lock: UsageError naming the first bad one, before anything is
  written. bin/train calls it before it imports TensorFlow; `run_training`
  calls it first.
  """
  validation.validate(settings)
  experiment.check_data_dir(settings)
  experiment.check_output_paths(settings)
  experiment.check_not_busy(experiment.experiment_dir(settings))


def _dp_metrics_fn(settings: config.Settings, task):
  """ε spent so far (RDP accountant), added to each round's metrics."""
  aggregation = settings.aggregation
  if not aggregation.dp:
    return None
  from tff_adaptive.accounting import privacy  # pylint: disable=g-import-not-at-top
  population = len(task.train_data.client_ids)
  rate = min(1.0, settings.client.clients_per_round / population)
  delta = aggregation.dp_delta or 1.0 / population
  sigma = aggregation.dp_noise_multiplier
  return lambda round_num, output: {
      'dp/epsilon': privacy.epsilon(sigma, rate, round_num, delta), 'dp/delta': delta}


# The signals delivered since `install_signal_handlers`. A handler's Interrupted
# raised inside NumPy's or TensorFlow's C code comes back as another error: a
# SystemError caused by it (Ctrl-C in a metric finalizer's tensor conversion),
# or a TypeError with no cause or context (in a TensorBoard summary write). So
# the run asks what was delivered, not what the error says.
_received: list = []


def _raise_interrupted(signum, frame):
  del frame
  from workflow.training import program  # pylint: disable=g-import-not-at-top
  _received.append(signum)
  raise program.Interrupted(signum)


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def install_signal_handlers() -> dict:
  """SIGINT and SIGTERM raise `program.Interrupted` (main thread only).

  Returns the handlers they replace, for `restore_signal_handlers`: a process
  that goes on after the run (a report's pool worker, a test, a notebook) must
  not keep raising `Interrupted` outside it.
  """
  import threading  # pylint: disable=g-import-not-at-top
  if threading.current_thread() is not threading.main_thread():
    return {}
  previous = {s: signal.getsignal(s) for s in _SIGNALS}
  _received.clear()
  for s in _SIGNALS:
    signal.signal(s, _raise_interrupted)
  return previous


def restore_signal_handlers(previous: dict) -> None:
  for s, handler in previous.items():
    if handler is not None:  # None: set outside Python, cannot be put back
      signal.signal(s, handler)


@contextlib.contextmanager
def _keep_swallowed_interrupts():
  """Within the block, an Interrupted the interpreter swallowed is not printed.

  A handler that runs inside a weakref callback or a `__del__` (TensorFlow
  drops objects all the time) raises there, and Python prints "Exception
  ignored in ..." and goes on: a Ctrl-C while the task is built would be
  printed that way and the run would train to its end. The signal is in
  `_received`; `_raise_if_signalled` stops the run at its next check.
  """
  previous = sys.unraisablehook

  def hook(unraisable):
    if not (_received and isinstance(unraisable.exc_value, KeyboardInterrupt)):
      previous(unraisable)

  sys.unraisablehook = hook
  try:
    yield
  finally:
    sys.unraisablehook = previous


def _raise_if_signalled() -> None:
  """Stops the run if a signal came whose Interrupted was swallowed (after the build,
  after each round)."""
  if _received:
    from workflow.training import program  # pylint: disable=g-import-not-at-top
    raise program.Interrupted(_received[0])


def _drop_abandoned_tasks(record) -> bool:
  return not record.getMessage().startswith('Task was destroyed but it is pending!')


def _stopped(signum: int, out, progress) -> errors.Stopped:
  """The error of SIGINT/SIGTERM: one line, exit status 128 + signal number (130, 143)."""
  # A second signal now ends the process at once, without a traceback.
  for s in _SIGNALS:
    signal.signal(s, signal.SIG_DFL)
  # The stop abandons what TFF had in flight (a value being materialised);
  # asyncio would report each such task when it is destroyed (at teardown,
  # after this one line). Only that report is dropped: a process that goes on
  # keeps asyncio's other errors.
  asyncio_log = std_logging.getLogger('asyncio')
  if _drop_abandoned_tasks not in asyncio_log.filters:
    asyncio_log.addFilter(_drop_abandoned_tasks)
  from workflow.training import run_files  # pylint: disable=g-import-not-at-top
  if out is not None:
    run_files.remove_partial_checkpoints(os.path.join(out, 'checkpoints'))
    # The checkpoints on disk, not what the loop last noted: the signal may
    # land between a save and the note of it.
    when = (f'at round {progress.round_num}' if progress is not None and progress.round_num
            else 'before its first round')
    where = f'stopped {when} ({run_files.checkpoint_phrase(out)})'
  else:
    where = 'stopped before the first round'
  return errors.Stopped(signum, where)


def stopped_before_start(signum: int) -> errors.Stopped:
  """The error of SIGINT/SIGTERM before `run_training` handles signals (bin/train's start)."""
  return _stopped(signum, None, None)


def run_training(settings: config.Settings, notes=(), members=None):
  """Validates `settings`, builds task and algorithm, trains; returns (state, last metrics).

  `notes` (from `resolve_flags`: what a preset and the algorithm's defaults
  set) are printed once the run is known to start.

  Raises:
    UsageError: bad flags or files, found before anything is written.
    RunFailed: the run diverged, could not write, or lost a worker.
    Stopped: SIGINT or SIGTERM (the checkpoint kept says where a rerun resumes).
  """
  from tff_adaptive.execution import runtime  # pylint: disable=g-import-not-at-top
  # Explicit, not at import: worker_binary children die with this process,
  # values serialise without TFF's nested copies, and TFF's exit-time noise is
  # disarmed even when the command is refused (tff_adaptive.execution.runtime).
  runtime.track_tff_workers()
  check_settings(settings)
  from workflow.training import program  # pylint: disable=g-import-not-at-top
  previous_handlers = install_signal_handlers()
  state = {'out': None, 'outs': [], 'progress': None}
  stopped = False
  try:
    with _keep_swallowed_interrupts():
      if members:  # --together: `members` are their (settings, notes)
        return _run_together([m for m, _ in members], state, [n for _, ns in members for n in ns])
      return _run_training(settings, state, notes)
  except program.Interrupted as e:
    stopped = True
    raise _stopped(e.signum, state['out'], state['progress']) from None
  except KeyboardInterrupt:
    stopped = True
    raise _stopped(signal.SIGINT, state['out'], state['progress']) from None
  except Exception:  # pylint: disable=broad-except
    if not _received:
      raise
    stopped = True  # the signal, reported by a C call as another error: a stop all the same
    raise _stopped(_received[0], state['out'], state['progress']) from None
  finally:
    for out in state['outs']:
      experiment.unlock_run_dir(out)
    if not stopped:  # after a stop they stay the default action (`_stopped`)
      restore_signal_handlers(previous_handlers)


def _loop_config(settings: config.Settings, out: str, schedules, client_state, line: str):
  from workflow.training import program  # pylint: disable=g-import-not-at-top
  loop, reliability = settings.loop, settings.reliability
  return program.LoopConfig(
      total_rounds=loop.total_rounds, clients_per_round=settings.client.clients_per_round,
      rounds_per_eval=loop.rounds_per_eval, first_eval_round=loop.first_eval_round or 0,
      rounds_per_checkpoint=loop.rounds_per_checkpoint,
      eval_stride=loop.eval_stride, output_dir=out, seed=loop.seed,
      local_steps=settings.client.local_steps or None, show_progress=loop.show_progress,
      schedules=schedules, client_state=client_state,
      divergence_factor=reliability.divergence_factor,
      divergence_rounds=reliability.divergence_rounds, after_round=_raise_if_signalled,
      execution_line=line)


@contextlib.contextmanager
def _run_errors():
  """A run's own failures as bin/train's errors: a checkpoint that cannot resume
  (UsageError), a diverged run or a failed write (RunFailed)."""
  from workflow.training import divergence  # pylint: disable=g-import-not-at-top
  from workflow.training import program  # pylint: disable=g-import-not-at-top
  from workflow.training import run_files  # pylint: disable=g-import-not-at-top
  try:
    yield
  except (run_files.IncompatibleCheckpoint, run_files.NoIntactCheckpoint) as e:
    raise errors.UsageError(str(e)) from None
  except (divergence.TrainingDiverged, program.WriteFailed) as e:
    raise errors.RunFailed(str(e)) from None


def _run_training(settings: config.Settings, status: dict, notes=()):
  from workflow.training import program  # pylint: disable=g-import-not-at-top
  from tff_adaptive.execution import runtime  # pylint: disable=g-import-not-at-top
  from tff_adaptive.execution import worker_process  # pylint: disable=g-import-not-at-top
  from workflow.flags import algorithms as algorithm_registry  # pylint: disable=g-import-not-at-top
  addresses = workers_setup.connect(settings.execution)
  # Before building: TFF logs at INFO while it wraps Keras models, which would
  # bury the one-line error of a flag that only the built process can refute.
  logging.set_verbosity(logging.WARNING)
  task, process, schedules, client_data_fn, client_state, out, line = run_build.build(settings, status)
  _raise_if_signalled()
  logging.set_verbosity(logging.WARNING)  # TFF logs every checkpoint at INFO too
  if not addresses:
    runtime.use_local_cpp_context(
        settings.execution.execution_concurrency,
        secure_intrinsics=algorithm_registry.needs_secure_context(settings))
  loop = _loop_config(settings, out, schedules, client_state, line)
  status['progress'] = loop.progress
  for note in notes:
    print(note, file=sys.stderr)
  where = f' on {len(addresses)} workers ({", ".join(addresses)})' if addresses else ''
  print(f'Training {settings.server.algorithm} on {settings.task.task}{where}: output in {out}',
        file=sys.stderr)
  try:
    with _run_errors():
      result = program.run(process, task, loop, round_metrics_fn=_dp_metrics_fn(settings, task),
                           client_data_fn=client_data_fn)
  except worker_process.WorkerError as e:
    # One readable message, no TFF traceback: the fix is operational.
    raise errors.RunFailed(str(e), [*getattr(e, '__notes__', ()),
                                    workers_setup.WORKER_BACK]) from None
  finally:
    runtime.shutdown_workers()
  return result


def _built_members(members):
  """(the population, each member's `run_build.build_process`). The members of
  one seed read one task (25 digits tasks cost a sweep 2 s), unless the task
  keeps files in its run directory (its factory names `run_dir`)."""
  from tasks import registry as task_registry  # pylint: disable=g-import-not-at-top
  from workflow.training import together  # pylint: disable=g-import-not-at-top
  first = run_build.build_process(members[0])
  pop = together.population_of(first[1])
  shared = 'run_dir' not in task_registry.arguments_named(members[0].task.task)
  built, tasks = [first], {members[0].loop.seed: first[0]}
  for settings in members[1:]:
    task = tasks.get(settings.loop.seed) if shared else None
    built.append(run_build.build_process(settings, pop.process, task))
    tasks.setdefault(settings.loop.seed, built[-1][0])
  return pop, built


def _run_together(members, status: dict, notes=()):
  """--together: the members' runs as one population (workflow/training/together.py)."""
  from tff_adaptive.execution import runtime  # pylint: disable=g-import-not-at-top
  from tff_adaptive.execution import worker_process  # pylint: disable=g-import-not-at-top
  from workflow.training import together  # pylint: disable=g-import-not-at-top
  if members[0].execution.data_on_workers:
    raise errors.UsageError('--together: drop --data_on_workers (a population\'s members of '
                            'one seed share their clients\' batches, read in this process); '
                            '--workers alone splits every member\'s clients over the workers')
  addresses = workers_setup.connect(members[0].execution)
  logging.set_verbosity(logging.WARNING)
  together.quiet_member_traces()
  pop, built = _built_members(members)
  if not addresses:
    runtime.use_local_cpp_context(members[0].execution.execution_concurrency)
  shared, initial = {}, pop.process.initialize()
  # Every member's start before any run directory is written: a refusal writes nothing.
  starts = [together.initial_state(pop.process, initial, members[0], settings, parts[0])
            for settings, parts in zip(members, built)]
  opened = [run_build.open_run(settings, status, parts[0], pop.process)
            for settings, parts in zip(members, built)]
  loops = [together.member_loop(
      pop.process, task, _loop_config(settings, out, schedules, client_state, line),
      _dp_metrics_fn(settings, task), start, shared)
           for settings, (_, _, schedules, _, line), (task, client_state, out), start
           in zip(members, built, opened, starts)]
  status['progress'] = loops[0].config.progress
  for note in dict.fromkeys(notes):
    print(note, file=sys.stderr)
  where = f' on {len(addresses)} workers ({", ".join(addresses)})' if addresses else ''
  print(f'Training {len(members)} runs of {members[0].server.algorithm} on {members[0].task.task}'
        f' together{where}: outputs in {", ".join(status["outs"])}', file=sys.stderr)
  try:
    with _run_errors():  # RunFailed naming the members that diverged, once the others finished
      together.run_members(pop, loops, members[0].loop.show_progress, _raise_if_signalled)
  except worker_process.WorkerError as e:
    raise errors.RunFailed(str(e), [*getattr(e, '__notes__', ()),
                                    workers_setup.WORKER_BACK]) from None
  finally:
    runtime.shutdown_workers()
