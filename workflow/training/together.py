"""bin/train --together: several runs of one shape as one process (a population).

  members  one bin/train command line each, with its own run directory and every
           file an ordinary run writes there (flags.json, metrics.csv, TensorBoard
           with HParams, checkpoints): bin/report, bin/plot and resume read them
           as they read any run
  process  the first member's cohort process, built once; each member starts from
           its own state: that process's initial state with the member's learning
           rates and its seed's task (data, initial weights)
  a round  each member's schedules, sampling and data (`program.Loop.prepare`),
           then one population round (`tff_adaptive.rounds.population`), then each
           member's measure, evaluation and metrics (`program.Loop.finish_round`),
           the members' TensorBoard scalars in one call, and their checkpoints,
           as its own run does them

What the members may differ in (`VARYING`): the client and server learning
rates, the server optimiser's β₁, β₂ and ε where the algorithm keeps them in
its state, FedProx's μ (`config.POPULATION_HPARAMS`: the flag table's `in_state`
entries, `IN_STATE`), the client and server learning-rate schedules
(`config.POPULATION_SCHEDULES`: each member's loop applies its own), the seed
and the run directory; everything else fixes the program.
A member that diverges stops alone (its run says so, exit 1 at the end); the
others go on. Ctrl-C and kill -9 lose what an ordinary run loses: each member
resumes from its own last checkpoint.
"""

import asyncio
import dataclasses
import json
import logging as std_logging
import sys
import time

import numpy as np

from workflow import errors
from workflow.flags import config
from workflow.flags import train_flags

# Where each of `config.POPULATION_HPARAMS` lives: flag → (settings group, state
# part, the keys it may have there).
IN_STATE = {f.name: (group_key, *f.in_state) for group_key, _, group in train_flags.GROUPS
            for f in group if f.in_state}
# (settings group, field) in which the members of one population may differ.
VARYING = tuple((group, flag) for flag, (group, _, _) in IN_STATE.items()) + tuple(
    ('schedules', flag) for flag in config.POPULATION_SCHEDULES) + (
    ('loop', 'seed'), ('loop', 'root_output_dir'), ('loop', 'experiment_name'),
    ('loop', 'together'))
VARIES = ', '.join(f'--{flag}' for flag in config.POPULATION_VARYING)


def shape_of(settings: config.Settings) -> config.Settings:
  """`settings` with the fields members may vary blanked: equal within a population."""
  for group, name in VARYING:
    part = getattr(settings, group)
    settings = dataclasses.replace(settings, **{group: dataclasses.replace(part, **{name: None})})
  return settings


def members_of(settings: config.Settings, flag_values, parse):
  """--together's members, (settings, notes) each; None without --together.
  `parse`: a command line's (settings, notes) (`cli.config_from_args`)."""
  if not settings.loop.together:
    return None
  from workflow.flags import train_flags  # pylint: disable=g-import-not-at-top
  others = sorted(train_flags.explicit_flags(flag_values) - {'together'})
  if others:
    raise errors.UsageError(f'--together takes every flag from its file: drop --{others[0]}')
  return read_members(settings.loop.together, parse)


def read_members(path: str, parse) -> list:
  """The members' (settings, notes) from the --together file; `parse`: a command line's."""
  try:
    with open(path) as f:
      lines = json.load(f)
  except (OSError, ValueError) as e:
    raise errors.UsageError(f'--together={path}: cannot read a JSON list of command lines '
                            f'({e})') from None
  if (not isinstance(lines, list) or len(lines) < 2 or
      not all(isinstance(l, list) and all(isinstance(a, str) for a in l) for l in lines)):
    raise errors.UsageError(f'--together={path}: must hold a JSON list of at least two '
                            'command lines, each a list of flags')
  members = [parse(line) for line in lines]
  check_members([m for m, _ in members], path)
  return members


def check_members(members, path: str) -> None:
  """One line naming the first flag in which a member's program would differ."""
  first = shape_of(members[0]).flag_values()
  for i, member in enumerate(members[1:], 1):
    other = shape_of(member).flag_values()
    differs = sorted(k for k in first if first[k] != other.get(k))
    if differs:
      raise errors.UsageError(
          f'--together={path}: member {i} differs from member 0 in --{differs[0]}, which fixes '
          f'the program (members may differ in {VARIES}, --seed and their directory): '
          'run it apart')
  from workflow.training import experiment  # pylint: disable=g-import-not-at-top
  dirs = [experiment.experiment_dir(m) for m in members]
  if len(set(dirs)) != len(dirs):
    twice = sorted({d for d in dirs if dirs.count(d) > 1})[0]
    raise errors.UsageError(f'--together={path}: two members would write {twice}')


class OneTracePerMember(std_logging.Filter):
  """Drops TensorFlow's "N out of the last N calls ... triggered tf.function
  retracing" warning: each seed's Keras evaluator traces its own function once
  (the members' TensorBoard scalars share one graph), which TF counts as
  retracing one function from the fifth on; it is not the per-call retracing
  the warning is for."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    return 'triggered tf.function retracing' not in record.getMessage()


def quiet_member_traces() -> None:
  """Installs `OneTracePerMember` on TensorFlow's logger (once)."""
  logger = std_logging.getLogger('tensorflow')
  if not any(isinstance(f, OneTracePerMember) for f in logger.filters):
    logger.addFilter(OneTracePerMember())


def initial_state(process, initial, first: config.Settings, settings: config.Settings, task):
  """A member's start: `initial` (`process.initialize()`'s, computed once) with its rates
  and its seed's weights.

  The rates (and the other `config.POPULATION_HPARAMS`) are set where the process
  keeps them (client η and μ in `client_work`, the server optimiser's in
  `finalizer`), and only where the flag reaches the state unchanged (checked
  on the first member): else UsageError.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  state = initial
  if settings.loop.seed != first.loop.seed:  # the seed's task builds the model
    weights = tff.learning.models.ModelWeights.from_model(task.model_fn())
    state = process.set_model_weights(state, tf.nest.map_structure(np.asarray, weights))
  hparams = process.get_hparams(state)
  for flag, (group, where, keys) in IN_STATE.items():
    value, first_value = (getattr(getattr(s, group), flag) for s in (settings, first))
    if value == first_value:
      continue
    key = next((k for k in keys if k in hparams[where]), keys[0])
    if np.float32(hparams[where].get(key, np.nan)) != np.float32(first_value):
      raise errors.UsageError(f'--together: the members differ in --{flag}, which '
                              f'{first.server.algorithm} does not keep as it is in its state: '
                              'run them apart')
    hparams[where][key] = np.float32(value)
  return process.set_hparams(state, hparams)


async def run_rounds(pop, loops, show_progress: bool, after_round=None) -> dict:
  """The population's rounds; {loop: why it stopped} of the members that diverged."""
  from tff_adaptive.rounds import population  # pylint: disable=g-import-not-at-top
  from workflow.training import divergence  # pylint: disable=g-import-not-at-top
  for loop in loops:
    await loop.resume()
  total = loops[0].config.total_rounds
  bar = _Bar(total, min(loop.start_round for loop in loops), show_progress)
  stopped = {}
  try:
    for round_num in range(bar.start + 1, total + 1):
      active = [l for l in loops if l.start_round < round_num and l not in stopped]
      if not active:
        break
      started = time.monotonic()
      prepared = [_prepare(loop, round_num) for loop in active]
      output = pop.next(population.stack([loop.state for loop in active]),
                        [data for _, data, _ in prepared])
      rows, finished = [], []
      for i, (loop, (sampled, _, schedule_row)) in enumerate(zip(active, prepared)):
        own = population.member_output(output, i)
        try:
          rows.append(await loop.finish_round(round_num, sampled, own, schedule_row, started))
          finished.append(loop)
        except divergence.TrainingDiverged as e:
          stopped[loop] = str(e)
          bar.write(f'{loop.config.output_dir}: {e}')
      for loop in finished:  # the first writes the members' shared batch of scalars
        loop.write_scalars(round_num)
      # After the round's scalars (a checkpoint's round is whole); the members'
      # saves at once: each waits on its files, not on the others'.
      saved = await asyncio.gather(*(loop.checkpoint_if_due(round_num) for loop in finished),
                                   return_exceptions=True)
      for error in saved:
        if isinstance(error, BaseException):
          raise error
      bar.update(rows)
      if after_round is not None:
        after_round()
  finally:
    bar.close()
  return stopped


def _prepare(loop, round_num: int):
  loop.config.progress.round_num = round_num
  sampled = loop.sample(round_num)
  data, schedule_row = loop.prepare(round_num, sampled)
  return sampled, data, schedule_row


class _Bar:
  """One progress bar for the population: the best and worst member's training loss."""

  def __init__(self, total: int, start: int, show: bool):
    import tqdm  # pylint: disable=g-import-not-at-top
    self.start, self.total, self.show = start, total, show
    self._bar = tqdm.tqdm(total=total, initial=start, unit='round', file=sys.stderr,
                          disable=not (show and sys.stderr.isatty()), dynamic_ncols=True)
    self._round = start

  def update(self, rows) -> None:
    self._round += 1
    losses = [r['train/client_work/train/loss'] for r in rows
              if 'train/client_work/train/loss' in r]
    shown = ({'best_loss': round(min(losses), 4), 'worst_loss': round(max(losses), 4)}
             if losses else {})
    self._bar.update(1)
    self._bar.set_postfix(shown, refresh=False)
    if self.show and not sys.stderr.isatty() and (self._round % 10 == 0
                                                   or self._round == self.total):
      print(f'round {self._round}/{self.total} {len(rows)} members ' +
            ' '.join(f'{k}={v:.4g}' for k, v in shown.items()), file=sys.stderr, flush=True)

  def write(self, line: str) -> None:
    self._bar.write(line, file=sys.stderr)

  def close(self) -> None:
    self._bar.close()


def population_of(process):
  """The population of `process`'s runs; UsageError when it has none."""
  from tff_adaptive.rounds import population  # pylint: disable=g-import-not-at-top
  try:
    return population.build_population(process)
  except (TypeError, ValueError) as e:
    raise errors.UsageError(f'--together: {e}') from None


def member_loop(process, task, loop_config, round_metrics_fn, start, shared: dict):
  """A member's loop (`program.Loop`): its task, run directory, feeder and start.
  Members of one seed (one task: its clients' batches, its test data) share
  `shared[seed]`: an evaluator, and the builder of the padded shards their
  feeders take (they sample the same clients: without it each member read
  every client from tf.data again, 3-4 s of a Shakespeare round of 8 members,
  and padded them again). All members share `shared['scalars']`: their
  TensorBoard scalars of a round are written by one graph call (one per member
  cost a 25-member digits sweep ~1.8 ms per member and round)."""
  from workflow.training import cohort_feed  # pylint: disable=g-import-not-at-top
  from workflow.training import program  # pylint: disable=g-import-not-at-top
  from workflow.training import run_files  # pylint: disable=g-import-not-at-top
  seed = loop_config.seed  # the one setting of the task members may differ in
  if seed not in shared:
    shared[seed] = (_Remembered(program.KerasEvaluator(task, loop_config.eval_stride)),
                    cohort_feed.ShardBuilder(task, process, keep=4))
  evaluate, builder = shared[seed]
  scalars = shared.setdefault('scalars', run_files.ScalarBatch())
  return program.Loop(process, task, loop_config, round_metrics_fn, None,
                      cohort_feed.CohortFeeder(task, process, builder=builder),
                      initial_state=start, evaluate=evaluate, scalars=scalars)


class _Remembered:
  """An evaluator that answers again for the weights it last evaluated (the
  members of one seed start from the same weights: one evaluation of them)."""

  def __init__(self, evaluate):
    self._evaluate, self._last = evaluate, (None, None)

  def __call__(self, model_weights):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    key = b''.join(np.asarray(w).tobytes() for w in tf.nest.flatten(model_weights))
    if self._last[0] != key:
      self._last = (key, self._evaluate(model_weights))
    return dict(self._last[1])


def run_members(pop, loops, show_progress: bool, after_round=None) -> None:
  """`run_rounds` to the end, the members' feeders closed however it ends; RunFailed
  naming the members that diverged (the others finished)."""
  try:
    stopped = asyncio.run(run_rounds(pop, loops, show_progress, after_round))
  finally:
    for loop in loops:
      loop.feeder.close()
  if stopped:
    which = '; '.join(f'{loop.config.output_dir}: {why}' for loop, why in stopped.items())
    raise errors.RunFailed(f'{len(stopped)} of {len(loops)} members diverged (the others '
                           f'finished): {which}')
