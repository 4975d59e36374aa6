"""Runs a sweep's trials as `bin/train` processes, in parallel, resumably.

Each trial runs `bin/train.py` as its own process in `<sweep_dir>/trials/<name>`,
its output appended to `<sweep_dir>/logs/<name>.log`. Finished trials are
skipped, and an interrupted trial is simply started again: bin/train resumes it
from its last checkpoint. A failing trial does not stop the others; failures
are listed at the end. Trials get SIGTERM if the sweep dies
(`parent_death`), so none outlives it.
"""

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Optional

from tff_adaptive.execution import parent_death
from workflow import sweep

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_PY = os.path.join(REPO_ROOT, 'bin', 'train.py')


@dataclasses.dataclass
class TrialOutcome:
  trial: sweep.Trial
  status: str  # 'finished' (ran now), 'skipped' (finished before), 'failed'
  log: str
  returncode: Optional[int] = None
  seconds: float = 0.0
  cpu_seconds: Optional[float] = None  # User + system time of the trial and its children.
  message: str = ''


def _last_line(path: str) -> str:
  try:
    with open(path, errors='replace') as f:
      lines = [l.strip() for l in f.read()[-20000:].splitlines() if l.strip()]
  except OSError:
    return ''
  errors = [l for l in lines if 'error' in l.lower()]
  return (errors or lines or [''])[-1][:300]


def _start(argv: Sequence[str], log_file: str) -> subprocess.Popen:
  """Starts one trial process, its output appended to `log_file`; OSError if it cannot."""
  with open(log_file, 'ab') as out:
    out.write(f'\n=== {time.strftime("%Y-%m-%d %H:%M:%S")} {" ".join(argv)}\n'.encode())
    out.flush()
    try:
      return subprocess.Popen(  # pylint: disable=consider-using-with
          argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT,
          start_new_session=True,  # Ctrl-C reaches the sweep only; it stops trials itself
          preexec_fn=parent_death.preexec_fn(signal.SIGTERM))  # bin/train stops cleanly
    except OSError as e:  # The trial program itself cannot start.
      out.write(f'error: cannot start {argv[0]}: {e}\n'.encode())
      raise


def run_sweep(trials: Sequence[sweep.Trial], sweep_dir: str, *,
              fixed: Optional[Mapping[str, str]] = None,
              max_parallel: int = 1, command: Optional[Sequence[str]] = None,
              poll_seconds: float = 0.2,
              log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)
              ) -> list[TrialOutcome]:
  """Runs every unfinished trial, at most `max_parallel` at a time.

  Args:
    trials: from `expand`.
    sweep_dir: where trials/, logs/ and sweep.json go.
    fixed: flags every trial gets.
    max_parallel: concurrent trial processes.
    command: the trial program, default `[python, bin/train.py]`; it gets
      `--flag=value` arguments and must write `<root_output_dir>/
      <experiment_name>/metrics.csv` (tests pass a fake one).
    poll_seconds: how often finished processes are reaped.
    log: progress lines.

  Returns:
    One outcome per trial, in `trials` order. On Ctrl-C (or SIGTERM) the
    running trials are stopped with SIGTERM (bin/train exits cleanly; the next
    run resumes them from their checkpoints) and KeyboardInterrupt propagates.
  """
  fixed = dict(fixed or {})
  if max_parallel < 1:
    raise sweep.SpecError(f'--max_parallel must be a positive integer; got {max_parallel}')
  command = list(command or [sys.executable, TRAIN_PY])
  try:
    os.makedirs(os.path.join(sweep_dir, 'logs'), exist_ok=True)
    os.makedirs(sweep.trials_dir(sweep_dir), exist_ok=True)
    sweep.write_manifest(sweep_dir, trials, fixed)
  except OSError as e:  # what os.access allowed and the kernel refused (check_sweep_dir)
    raise sweep.SpecError(f'--sweep_dir={sweep_dir}: cannot write '
                          f'{e.filename or sweep_dir}: {e.strerror}') from None
  outcomes: dict[str, TrialOutcome] = {}
  pending = []
  for trial in trials:
    if sweep.is_finished(sweep_dir, trial, fixed):
      outcomes[trial.name] = TrialOutcome(trial, 'skipped', sweep.log_path(sweep_dir, trial))
    else:
      pending.append(trial)
  done_before = len(outcomes)
  log(f'sweep: {len(trials)} trials, {done_before} already finished, {len(pending)} to run '
      f'({max_parallel} at a time) in {sweep_dir}')
  running: dict[str, tuple[subprocess.Popen, float, int]] = {}
  pending.reverse()  # pop() from the end keeps the given order
  completed = 0

  def reap(name, proc, started, cpu, start_round):
    nonlocal completed
    trial = next(t for t in trials if t.name == name)
    seconds = time.monotonic() - started
    path = sweep.log_path(sweep_dir, trial)
    if proc.returncode == 0 and sweep.is_finished(sweep_dir, trial, fixed):
      outcome = TrialOutcome(trial, 'finished', path, 0, seconds, cpu_seconds=cpu)
      sweep.record_trial_seconds(sweep_dir, name, seconds, cpu, start_round)
    else:
      why = (f'exit status {proc.returncode}' if proc.returncode != 0
             else 'exited 0 but metrics.csv does not reach the final round')
      outcome = TrialOutcome(trial, 'failed', path, proc.returncode, seconds,
                             cpu_seconds=cpu, message=f'{why}: {_last_line(path)}')
    outcomes[name] = outcome
    completed += 1
    cpu_text = '' if cpu is None else f', {cpu:.0f} s CPU'
    log(f'[{completed + done_before}/{len(trials)}] {outcome.status} {name} '
        f'({seconds:.0f} s{cpu_text})' +
        (f': {outcome.message}' if outcome.status == 'failed' else ''))

  try:
    while pending or running:
      while pending and len(running) < max_parallel:
        trial = pending.pop()
        argv = sweep.trial_argv(sweep_dir, trial, fixed, command)
        start_round = sweep.last_round(
            os.path.join(sweep.trial_dir(sweep_dir, trial), 'metrics.csv'))
        try:
          proc = _start(argv, sweep.log_path(sweep_dir, trial))
        except OSError as e:
          outcomes[trial.name] = TrialOutcome(trial, 'failed', sweep.log_path(sweep_dir, trial),
                                              message=f'cannot start {argv[0]}: {e}')
          completed += 1
          log(f'[{completed + done_before}/{len(trials)}] failed {trial.name}: '
              f'{outcomes[trial.name].message}')
          continue
        running[trial.name] = (proc, time.monotonic(), start_round)
      time.sleep(poll_seconds)
      for name, (proc, started, start_round) in list(running.items()):
        cpu = _try_wait(proc)
        if proc.returncode is not None:
          del running[name]
          reap(name, proc, started, cpu, start_round)
  except BaseException:
    _stop(running, log)
    raise
  return [outcomes[t.name] for t in trials]


def _try_wait(proc: subprocess.Popen) -> Optional[float]:
  """Reaps `proc` if it has exited (sets returncode); returns its CPU seconds.

  os.wait4 instead of Popen.poll: its rusage gives the trial's user + system
  time (with the TFF worker it waited for), which the report quotes because
  wall time on a shared machine says little.
  """
  if not hasattr(os, 'wait4'):  # pragma: no cover - not POSIX
    proc.poll()
    return None
  try:
    pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
  except ChildProcessError:  # Already reaped elsewhere.
    proc.poll()
    return None
  if pid == 0:
    return None
  proc.returncode = os.waitstatus_to_exitcode(status)
  return usage.ru_utime + usage.ru_stime


def _stop(running, log, timeout: float = 60.0) -> None:
  if not running:
    return
  log(f'sweep: stopping {len(running)} running trials; rerun the same command to resume them')
  for proc, *_ in running.values():
    if proc.poll() is None:
      proc.send_signal(signal.SIGTERM)
  deadline = time.monotonic() + timeout
  for proc, *_ in running.values():
    try:
      proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()


def failure_report(outcomes: Sequence[TrialOutcome]) -> str:
  failed = [o for o in outcomes if o.status == 'failed']
  if not failed:
    return ''
  lines = [f'{len(failed)} trial(s) failed:']
  for o in failed:
    lines.append(f'  {o.trial.name}: {o.message}\n    log: {o.log}')
  return '\n'.join(lines)

