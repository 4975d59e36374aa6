"""Runs a sweep's trials as `bin/train` processes, in parallel, resumably.

Each trial runs `bin/train.py` as its own process in `<sweep_dir>/trials/<name>`,
its output appended to `<sweep_dir>/logs/<name>.log`. Finished trials are
skipped, and an interrupted trial is simply started again: bin/train resumes it
from its last checkpoint. A trial whose run diverged (its `diverged.json`) is
skipped too unless asked to retry: the same seed and rates would most likely
diverge again. A failing trial does not stop the others; failures and skipped
diverged trials are listed at the end. Trials get SIGTERM if the sweep dies
(`parent_death`), so none outlives it.
"""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Optional

from tff_adaptive.execution import parent_death
from workflow.flags import config
from workflow.sweeps import sweep

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_PY = os.path.join(REPO_ROOT, 'bin', 'train.py')


@dataclasses.dataclass
class TrialOutcome:
  trial: sweep.Trial
  # 'finished' (ran now), 'skipped' (finished before), 'failed', 'diverged' (before: not run)
  status: str
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
    # SIGTERM when the sweep dies: bin/train stops cleanly.
    args, preexec_fn = parent_death.popen_args(argv, signal.SIGTERM)
    try:
      return subprocess.Popen(  # pylint: disable=consider-using-with
          args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT,
          start_new_session=True,  # Ctrl-C reaches the sweep only; it stops trials itself
          preexec_fn=preexec_fn)
    except OSError as e:  # The trial program itself cannot start.
      out.write(f'error: cannot start {argv[0]}: {e}\n'.encode())
      raise


def run_sweep(trials: Sequence[sweep.Trial], sweep_dir: str, *,
              fixed: Optional[Mapping[str, str]] = None,
              max_parallel: int = 1, command: Optional[Sequence[str]] = None,
              together: bool = False, retry_diverged: bool = False,
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
    together: the unfinished trials that differ only in `TOGETHER` flags run
      as one `command --together=<file>` process (a population,
      workflow/training/together.py), the file in <sweep_dir>/together/. A
      population the command refuses (exit 2 before any round: an aggregator
      with no population form, ...) runs its trials apart, each its own process.
    retry_diverged: run the trials whose last run diverged again (else they
      are reported, not run).
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
  _prepare(sweep_dir, trials, fixed)
  runner = _Runner(trials, sweep_dir, fixed, command, log, together, retry_diverged)
  diverged = (f'{len(runner.diverged_before)} diverged before (not run again), '
              if runner.diverged_before else '')
  log(f'sweep: {len(trials)} trials, {runner.done_before - len(runner.diverged_before)} '
      f'already finished, {diverged}'
      f'{sum(map(len, runner.pending))} to run in {len(runner.pending)} processes '
      f'({max_parallel} at a time) in {sweep_dir}')
  try:
    while runner.pending or runner.running:
      while runner.pending and len(runner.running) < max_parallel:
        runner.start(runner.pending.pop())
      time.sleep(poll_seconds)
      runner.reap_exited()
  except BaseException:
    _stop(runner.running, log)
    raise
  return [runner.outcomes[t.name] for t in trials]


def _prepare(sweep_dir: str, trials: Sequence[sweep.Trial], fixed: Mapping[str, str]):
  """The sweep's directories and manifest; SpecError when they cannot be written."""
  try:
    os.makedirs(os.path.join(sweep_dir, 'logs'), exist_ok=True)
    os.makedirs(sweep.trials_dir(sweep_dir), exist_ok=True)
    sweep.write_manifest(sweep_dir, trials, fixed)
  except OSError as e:  # what os.access allowed and the kernel refused (check_sweep_dir)
    raise sweep.SpecError(f'--sweep_dir={sweep_dir}: cannot write '
                          f'{e.filename or sweep_dir}: {e.strerror}') from None


# The flags in which the trials of one --together process may differ (and the seed).
TOGETHER = config.POPULATION_VARYING


def _jobs(trials: Sequence[sweep.Trial], together: bool) -> list[list[sweep.Trial]]:
  """The processes to run: one trial each, or (together) the trials of one program shape."""
  if not together:
    return [[t] for t in trials]
  jobs: dict[tuple, list] = {}
  for trial in trials:
    jobs.setdefault(tuple(sorted((k, v) for k, v in trial.flags if k not in TOGETHER)),
                    []).append(trial)
  return list(jobs.values())


class _Runner:
  """A sweep's trials by where they are: pending, running or with an outcome.
  A job is the trials one process runs (one, or a --together population)."""

  def __init__(self, trials, sweep_dir, fixed, command, log, together=False,
               retry_diverged=False):
    self.trials, self.sweep_dir, self.fixed, self.command, self.log = (trials, sweep_dir, fixed,
                                                                       command, log)
    self.outcomes: dict[str, TrialOutcome] = {}
    self.diverged_before = []
    todo = []
    for trial in trials:
      where, record = sweep.standing(sweep_dir, trial, fixed, retry_diverged)
      if where == 'finished':
        self.outcomes[trial.name] = TrialOutcome(trial, 'skipped',
                                                 sweep.log_path(sweep_dir, trial))
      elif where == 'diverged':
        self.outcomes[trial.name] = TrialOutcome(
            trial, 'diverged', sweep.log_path(sweep_dir, trial),
            message=f'diverged at round {record["round"]} when last run (not run again; '
                    '--retry_diverged runs it)')
        self.diverged_before.append(trial)
      else:
        todo.append(trial)
    self.pending = _jobs(todo, together)
    self.pending.reverse()  # pop() from the end keeps the given order
    self.done_before = len(self.outcomes)
    # first trial's name -> (process, start time, the trials, the last round each
    # one's metrics.csv had at the start, the process's log)
    self.running: dict[str, tuple[subprocess.Popen, float, list, list[int], str]] = {}
    self.completed = 0

  def _record(self, outcome: TrialOutcome) -> str:
    """Stores a trial's outcome; returns the '[done/total]' its log line starts with."""
    self.outcomes[outcome.trial.name] = outcome
    self.completed += 1
    return f'[{self.completed + self.done_before}/{len(self.trials)}]'

  def start(self, job: list):
    argvs = [sweep.trial_argv(self.sweep_dir, t, self.fixed, self.command) for t in job]
    argv, path = argvs[0], sweep.log_path(self.sweep_dir, job[0])
    if len(job) > 1:
      argv, path = self._together(job, argvs)
    start_rounds = [sweep.last_round(os.path.join(sweep.trial_dir(self.sweep_dir, t),
                                                  'metrics.csv')) for t in job]
    try:
      proc = _start(argv, path)
    except OSError as e:
      for trial in job:
        outcome = TrialOutcome(trial, 'failed', path, message=f'cannot start {argv[0]}: {e}')
        self.log(f'{self._record(outcome)} failed {trial.name}: {outcome.message}')
      return
    self.running[job[0].name] = (proc, time.monotonic(), job, start_rounds, path)

  def _together(self, job, argvs):
    """(the --together command, its log) of a job of several trials."""
    folder = os.path.join(self.sweep_dir, 'together')
    os.makedirs(folder, exist_ok=True)
    name = f'{job[0].name}+{len(job) - 1}'
    members = os.path.abspath(os.path.join(folder, f'{name}.json'))
    with open(members, 'w') as f:
      json.dump([a[len(self.command):] for a in argvs], f, indent=1)
    return ([*self.command, f'--together={members}'],
            os.path.join(self.sweep_dir, 'logs', f'{name}.log'))

  def reap_exited(self):
    for name, (proc, started, job, start_rounds, path) in list(self.running.items()):
      cpu = _try_wait(proc)
      if proc.returncode is not None:
        del self.running[name]
        if self._refused_together(proc, job, start_rounds, path):
          continue
        for trial, start_round in zip(job, start_rounds):
          self._reap(trial, proc, started, cpu and cpu / len(job), start_round, path, len(job))

  def _refused_together(self, proc, job, start_rounds, path) -> bool:
    """A population refused before its first round (exit 2, no trial moved): its
    trials go back to the pending ones, each its own process."""
    if len(job) < 2 or proc.returncode != 2 or any(
        sweep.last_round(os.path.join(sweep.trial_dir(self.sweep_dir, t), 'metrics.csv')) != r
        for t, r in zip(job, start_rounds)):
      return False
    self.log(f'sweep: {len(job)} trials cannot run together ({_last_line(path)}): '
             'each runs as its own process')
    self.pending.extend([t] for t in reversed(job))
    return True

  def _reap(self, trial, proc, started, cpu, start_round, path, members=1):
    """A trial's outcome (a member of a population: finished when its own run is)."""
    seconds = time.monotonic() - started
    if sweep.is_finished(self.sweep_dir, trial, self.fixed) and (proc.returncode == 0
                                                                  or members > 1):
      outcome = TrialOutcome(trial, 'finished', path, 0, seconds, cpu_seconds=cpu)
      sweep.record_trial_seconds(self.sweep_dir, trial.name, seconds, cpu, start_round)
    else:
      why = (f'exit status {proc.returncode}' if proc.returncode != 0
             else 'exited 0 but metrics.csv does not reach the final round')
      outcome = TrialOutcome(trial, 'failed', path, proc.returncode, seconds,
                             cpu_seconds=cpu, message=f'{why}: {_last_line(path)}')
    cpu_text = '' if cpu is None else f', {cpu:.0f} s CPU'
    shared = f', one of {members} in one process' if members > 1 else ''
    self.log(f'{self._record(outcome)} {outcome.status} {trial.name} ({seconds:.0f} s'
             f'{cpu_text}{shared})' + (f': {outcome.message}' if outcome.status == 'failed'
                                        else ''))


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
  """The trials that failed now or diverged before, one entry each; '' if none."""
  failed = [o for o in outcomes if o.status in ('failed', 'diverged')]
  if not failed:
    return ''
  lines = [f'{len(failed)} trial(s) failed:']
  for o in failed:
    lines.append(f'  {o.trial.name}: {o.message}\n    log: {o.log}')
  return '\n'.join(lines)

