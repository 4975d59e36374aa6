"""bin/train's schedule flags turned into schedules, validated with messages naming the flags.

`make_local_steps_schedule` (`--local_steps_schedule` and its parameters),
`make_lr_schedule` (`--{client,server}_lr_schedule` and theirs) and
`from_settings` (the whole K / η / η_s driver from a run's settings) build the
library's schedules (`tff_adaptive.schedules`); every ValueError they raise
names the flag to fix. The library itself speaks in parameters: the driver's
`ScheduleError`s name `RoundSchedules`' arguments (`local_steps`, `client_lr`,
`server_lr`), and `workflow.flags.library_flags` names the flags whose table
entries feed them.
"""

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from tff_adaptive.accounting import runtime_model
from tff_adaptive.schedules import core
from tff_adaptive.schedules import driver as round_schedules
from tff_adaptive.schedules import learning_rate
from tff_adaptive.schedules import local_steps

LOCAL_STEPS_SCHEDULES = ('constant', 'exp', 'rounds', 'error', 'step', 'theory')
LR_SCHEDULES = ('constant', 'exp_decay', 'inv_lin_decay', 'inv_sqrt_decay', 'exp',
                'rounds', 'error', 'step')


def watching_evaluations(schedules) -> list[str]:
  """The `--<schedule>=step` flags set in `schedules` (a `config.ScheduleSettings`): these
  schedules decay on evaluations, so which rounds evaluate is part of the run's computation."""
  return [f'--{name}=step' for name in ('local_steps_schedule', 'client_lr_schedule',
                                        'server_lr_schedule') if getattr(schedules, name) == 'step']


def _is_real(x: Any) -> bool:
  return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_int(value: Any, flag: str, minimum: int) -> int:
  if not _is_real(value) or not float(value).is_integer() or value < minimum:
    raise ValueError(f'{flag} must be an integer >= {minimum}; got {value!r}')
  return int(value)


def _check_decay_factor(value: Any, flag: str) -> float:
  if not _is_real(value) or not 0.0 < float(value) <= 1.0:
    raise ValueError(f'{flag} must be a decay factor in (0, 1]; got {value!r}')
  return float(value)


def _check_nonnegative(value: Any, flag: str) -> float:
  if not _is_real(value) or not 0.0 <= float(value) < math.inf:
    raise ValueError(f'{flag} must be a finite number >= 0; got {value!r}')
  return float(value)


def _reject_unused(schedule_flag: str, name: str, given: Mapping[str, Any],
                   accepted: Sequence[str], flags: Mapping[str, str]) -> None:
  for param, value in given.items():
    if value is not None and param not in accepted:
      raise ValueError(f'{flags[param]} is not used by {schedule_flag}={name}; '
                       f'got {flags[param]}={value!r}')


def _window(window: Optional[int], total_rounds: Optional[int]) -> int:
  window = _check_int(local_steps.DEFAULT_SCHEDULE_WINDOW if window is None else window,
                      '--schedule_window', 1)
  if total_rounds is not None and window > total_rounds:
    raise ValueError(f'--schedule_window={window} is larger than --total_rounds='
                     f'{total_rounds}: the error schedule would never leave K_0/eta_0')
  return window


def _plateau(patience: Optional[int], min_delta: Optional[float]) -> tuple[int, float]:
  patience = _check_int(local_steps.DEFAULT_PLATEAU_PATIENCE if patience is None else patience,
                        '--plateau_patience', 1)
  min_delta = _check_nonnegative(
      local_steps.DEFAULT_PLATEAU_MIN_DELTA if min_delta is None else min_delta,
      '--plateau_min_delta')
  return patience, min_delta


def make_local_steps_schedule(name: str, k0: int, *, decay: Optional[float] = None,
                              window: Optional[int] = None,
                              patience: Optional[int] = None,
                              min_delta: Optional[float] = None,
                              b: Optional[float] = None,
                              total_rounds: Optional[int] = None) -> core.Schedule:
  """Builds a local-steps (K) schedule of docs/algorithms.md#schedules from flag values.

  Args:
    name: `--local_steps_schedule`: constant | exp | rounds | error | step | theory.
    k0: `--local_steps`, K_0 (an integer >= 1).
    decay: `--local_steps_decay`, d_K in (0, 1] (`exp` only; required there).
    window: `--schedule_window`, s (`error` only; default 100).
    patience: `--plateau_patience` (`step` only; default 10 evaluations).
    min_delta: `--plateau_min_delta` (`step` only; default 1e-4).
    b: `--local_steps_theory_b`, b > 0 of decaying-K paper eq. 11 (`theory`; required).
    total_rounds: `--total_rounds`, used to validate `window` when given.

  Returns:
    A `Schedule` whose values are ints >= 1.

  Raises:
    ValueError: naming the offending flag.
  """
  flags = {'decay': '--local_steps_decay', 'window': '--schedule_window',
           'patience': '--plateau_patience', 'min_delta': '--plateau_min_delta',
           'b': '--local_steps_theory_b'}
  accepted = {'constant': (), 'exp': ('decay',), 'rounds': (), 'error': ('window',),
              'step': ('patience', 'min_delta'), 'theory': ('b',)}
  if name not in accepted:
    raise ValueError(f'--local_steps_schedule must be one of {LOCAL_STEPS_SCHEDULES}; '
                     f'got {name!r}')
  k0 = _check_int(k0, '--local_steps', 1)
  if total_rounds is not None:
    total_rounds = _check_int(total_rounds, '--total_rounds', 1)
  _reject_unused('--local_steps_schedule', name,
                 {'decay': decay, 'window': window, 'patience': patience,
                  'min_delta': min_delta, 'b': b}, accepted[name], flags)
  if name == 'constant':
    return core.ConstantSchedule(k0, core.LOCAL_STEPS)
  if name == 'exp':
    if decay is None:
      raise ValueError('--local_steps_schedule=exp needs --local_steps_decay')
    return learning_rate.ExponentialDecay(k0, _check_decay_factor(decay, flags['decay']),
                                          quantity=core.LOCAL_STEPS)
  if name == 'rounds':
    return local_steps.RoundsDecay(k0, core.LOCAL_STEPS)
  if name == 'error':
    return local_steps.ErrorDrivenDecay(k0, _window(window, total_rounds), core.LOCAL_STEPS)
  if name == 'step':
    return local_steps.PlateauStepDecay(k0, *_plateau(patience, min_delta),
                                        quantity=core.LOCAL_STEPS)
  if b is None:
    raise ValueError('--local_steps_schedule=theory needs --local_steps_theory_b')
  if not _is_real(b) or not 0.0 < float(b) < math.inf:
    raise ValueError(f'--local_steps_theory_b must be a finite number > 0; got {b!r}')
  return local_steps.TheoryDecay(k0, float(b))


def make_lr_schedule(name: str, base: float, *, decay_rate: Optional[float] = None,
                     decay_steps: Optional[int] = None,
                     staircase: Optional[bool] = None,
                     warmup_rounds: Optional[int] = None,
                     window: Optional[int] = None,
                     patience: Optional[int] = None,
                     min_delta: Optional[float] = None,
                     total_rounds: Optional[int] = None,
                     flag_prefix: str = 'client') -> core.Schedule:
  """Builds a learning-rate schedule of docs/algorithms.md#fedopt or #schedules from flag values.

  Flags are `--{flag_prefix}_...`, e.g. `--client_lr_decay_rate`,
  `--server_lr_schedule`.

  Args:
    name: `--{p}_lr_schedule`: constant | exp_decay | inv_lin_decay |
      inv_sqrt_decay (docs/algorithms.md#fedopt) | exp | rounds | error | step (docs/algorithms.md#schedules).
      `exp` is gamma_0 * d**t, i.e. exp_decay with steps 1.
    base: `--{p}_learning_rate` (> 0).
    decay_rate: `--{p}_lr_decay_rate`: in (0, 1] for exp_decay/exp, >= 0 for
      inv_lin_decay/inv_sqrt_decay (required by all four).
    decay_steps: `--{p}_lr_decay_steps` (>= 1, default 1; docs/algorithms.md#fedopt only).
    staircase: `--{p}_lr_staircase` (default False; docs/algorithms.md#fedopt only).
    warmup_rounds: `--{p}_lr_warmup_rounds` (>= 0; 0/None = no warm-up).
    window: `--schedule_window` (`error` only; default 100).
    patience: `--plateau_patience` (`step` only; default 10).
    min_delta: `--plateau_min_delta` (`step` only; default 1e-4).
    total_rounds: `--total_rounds`, used to validate `window` when given.
    flag_prefix: `client` or `server` (only changes the flag names in errors).

  Returns:
    A `Schedule` whose values are floats.

  Raises:
    ValueError: naming the offending flag.
  """
  p = flag_prefix
  flags = {'decay_rate': f'--{p}_lr_decay_rate', 'decay_steps': f'--{p}_lr_decay_steps',
           'staircase': f'--{p}_lr_staircase', 'window': '--schedule_window',
           'patience': '--plateau_patience', 'min_delta': '--plateau_min_delta'}
  sec1 = ('decay_rate', 'decay_steps', 'staircase')
  accepted = {'constant': (), 'exp_decay': sec1, 'inv_lin_decay': sec1,
              'inv_sqrt_decay': sec1, 'exp': ('decay_rate',), 'rounds': (),
              'error': ('window',), 'step': ('patience', 'min_delta')}
  if name not in accepted:
    raise ValueError(f'--{p}_lr_schedule must be one of {LR_SCHEDULES}; got {name!r}')
  if not _is_real(base) or not 0.0 < float(base) < math.inf:
    raise ValueError(f'--{p}_learning_rate must be a finite number > 0; got {base!r}')
  base = float(base)
  if total_rounds is not None:
    total_rounds = _check_int(total_rounds, '--total_rounds', 1)
  _reject_unused(f'--{p}_lr_schedule', name,
                 {'decay_rate': decay_rate, 'decay_steps': decay_steps,
                  'staircase': staircase, 'window': window, 'patience': patience,
                  'min_delta': min_delta}, accepted[name], flags)
  if accepted[name] and accepted[name][0] == 'decay_rate' and decay_rate is None:
    raise ValueError(f'--{p}_lr_schedule={name} needs {flags["decay_rate"]}')
  steps = 1 if decay_steps is None else _check_int(decay_steps, flags['decay_steps'], 1)
  stair = bool(staircase) if staircase is not None else False
  schedule = _lr_schedule(name, base, decay_rate, steps, stair, flags,
                          window=window, total_rounds=total_rounds, patience=patience,
                          min_delta=min_delta)
  if warmup_rounds is not None:
    warmup_rounds = _check_int(warmup_rounds, f'--{p}_lr_warmup_rounds', 0)
    if warmup_rounds > 0:
      schedule = learning_rate.LinearWarmup(schedule, warmup_rounds)
  return schedule


def _lr_schedule(name: str, base: float, decay_rate: Optional[float], steps: int, stair: bool,
                 flags: Mapping[str, str], *, window: Optional[int],
                 total_rounds: Optional[int], patience: Optional[int],
                 min_delta: Optional[float]) -> core.Schedule:
  """`make_lr_schedule`'s schedule before warm-up, from the flag values it has checked."""
  if name == 'constant':
    return core.ConstantSchedule(base, core.LEARNING_RATE)
  if name in ('exp_decay', 'exp'):
    return learning_rate.ExponentialDecay(
        base, _check_decay_factor(decay_rate, flags['decay_rate']), steps, stair,
        core.LEARNING_RATE)
  if name in ('inv_lin_decay', 'inv_sqrt_decay'):
    return learning_rate.InverseDecay(
        base, _check_nonnegative(decay_rate, flags['decay_rate']), steps, stair,
        1.0 if name == 'inv_lin_decay' else 0.5, core.LEARNING_RATE)
  if name == 'rounds':
    return local_steps.RoundsDecay(base, core.LEARNING_RATE)
  if name == 'error':
    return local_steps.ErrorDrivenDecay(base, _window(window, total_rounds), core.LEARNING_RATE)
  return local_steps.PlateauStepDecay(base, *_plateau(patience, min_delta),
                                      quantity=core.LEARNING_RATE)


# `settings` below is a `workflow.flags.config.Settings`, not imported: workflow.flags.config
# reads the flag table (train_flags), which imports this module.
def from_settings(settings) -> round_schedules.RoundSchedules:
  """Builds the driver from bin/train's settings; ValueError names the bad flag."""
  sched = settings.schedules
  total = settings.loop.total_rounds
  shared = dict(window=sched.schedule_window, patience=sched.plateau_patience,
                min_delta=sched.plateau_min_delta)
  feedback_params = {'error': ('window',), 'step': ('patience', 'min_delta')}
  names = [sched.local_steps_schedule or 'constant', sched.client_lr_schedule or 'constant',
           sched.server_lr_schedule or 'constant']
  # --schedule_window / --plateau_* belong to whichever schedules are
  # feedback-driven; given with none of them, they are an error.
  for param, flag in (('window', '--schedule_window'), ('patience', '--plateau_patience'),
                      ('min_delta', '--plateau_min_delta')):
    if shared[param] is not None and not any(param in feedback_params.get(n, ()) for n in names):
      users = 'error' if param == 'window' else 'step'
      raise ValueError(
          f'{flag} is only used by a {users} schedule (--local_steps_schedule, '
          f'--client_lr_schedule or --server_lr_schedule={users}); got {flag}={shared[param]!r}')

  def only(name):
    return {k: v for k, v in shared.items() if k in feedback_params.get(name, ())}

  local = _local_steps(settings, names[0], total, only(names[0]))
  lrs = {}
  for prefix, name, base in (('client', names[1], settings.client.client_learning_rate),
                             ('server', names[2], settings.server.server_learning_rate)):
    lrs[prefix] = _lr(sched, prefix, name, base, total, only(name))
  return round_schedules.RoundSchedules(
      local_steps=local, client_lr=lrs['client'], server_lr=lrs['server'],
      step_seconds=sched.step_time_seconds or 0.0,
      down_mbps=sched.download_mbps or runtime_model.DEFAULT_DOWN_MBPS,
      up_mbps=sched.upload_mbps or runtime_model.DEFAULT_UP_MBPS,
      rounds_per_eval=settings.loop.rounds_per_eval)


def _local_steps(settings, k_name: str, total: int,
                 feedback: Mapping[str, Any]) -> Optional[core.Schedule]:
  """The K schedule (None: the algorithm's own epochs or constant K)."""
  sched = settings.schedules
  k0 = settings.client.local_steps
  if k0 is not None and k0 < 1 and k_name != 'constant':
    raise ValueError(f'--local_steps (K_0) must be an integer >= 1 for '
                     f'--local_steps_schedule={k_name}; got {k0}')
  if k0:
    return make_local_steps_schedule(
        k_name, k0, decay=sched.local_steps_decay, b=sched.local_steps_theory_b,
        total_rounds=total, **feedback)
  if k_name != 'constant':
    raise ValueError(
        f'--local_steps_schedule={k_name} needs --local_steps (K_0 >= 1)')
  for flag, value in (('local_steps_decay', sched.local_steps_decay),
                      ('local_steps_theory_b', sched.local_steps_theory_b)):
    if value is not None:
      raise ValueError(
          f'--{flag} is not used by --local_steps_schedule=constant; got --{flag}={value!r}')
  return None


def _lr(sched, prefix: str, name: str, base: float, total: int,
        feedback: Mapping[str, Any]) -> Optional[core.Schedule]:
  """The `--{prefix}_lr_schedule` (None: constant, nothing to write each round)."""
  # The client and server schedules are one set of fields told apart by the
  # prefix of their flag names (ScheduleSettings' fields are the flags).
  params = dict(decay_rate=getattr(sched, f'{prefix}_lr_decay_rate'),
                decay_steps=getattr(sched, f'{prefix}_lr_decay_steps'),
                staircase=getattr(sched, f'{prefix}_lr_staircase'))
  warmup = getattr(sched, f'{prefix}_lr_warmup_rounds')
  if name == 'constant' and not warmup:
    # Constant: parameters for another schedule are still a mistake.
    make_lr_schedule('constant', 1.0 if base is None else base, flag_prefix=prefix, **params)
    return None
  return make_lr_schedule(name, base, warmup_rounds=warmup, total_rounds=total,
                          flag_prefix=prefix, **params, **feedback)
