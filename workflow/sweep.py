"""Hyperparameter sweeps over `bin/train`: grids, seeds, parallel trials, resume, selection.

A sweep is a list of *groups*; each group is a grid (the Cartesian product of
per-flag value lists) over any `bin/train` flags, and every configuration runs
once per seed. Groups make a list of grids, so that, for example, FedAvg is
tuned over its client learning rate while FedAdam is tuned over its server
learning rate (the papers tune each algorithm on its own grid: seed 001
Table 4, seed 002 Appendix H, seed 003 Appendix D).

Spec syntax (no JSON/YAML), on the command line:
    --grid='client_learning_rate=0.01,0.1; server_learning_rate=0.1,1'
    --grid='fedavg: algorithm=fedavg; client_learning_rate=0.1,0.3 |
            fedadam: algorithm=fedadam; server_learning_rate=0.01,0.03'
`|` separates groups, an optional `label:` names one, `;` separates flags and
`,` separates a flag's values. In a file (`--spec`), one flag per line:
    # comment
    total_rounds = 30             <- before any header: applies to every group
    [fedavg]
    algorithm = fedavg
    client_learning_rate = 0.1, 0.3
Values are passed to bin/train verbatim (`--name=value`); a value that holds a
comma goes in `--fixed` (`name=value;name=value`), which every trial gets.

Each trial runs `bin/train.py` as its own process in
`<sweep_dir>/trials/<name>`, with its output in `<sweep_dir>/logs/<name>.log`.
The name is built from the trial's grid flags and seed only, so it is stable
across reruns and extended grids. A trial is *finished* when its metrics.csv
holds the final round; finished trials are skipped, and an interrupted trial
is simply started again: bin/train resumes it from its last checkpoint. A
failing trial does not stop the others; failures are listed at the end.

Selection follows the papers: a configuration's score is a statistic of a
metric per seed (e.g. the mean of the last N evaluations, seed 001: "highest
average test accuracy over the last 500 rounds"; seed 002: "running average of
the last 10 logged datapoints"), averaged over seeds; the best configuration
of each group maximises (or minimises) it.
"""

import csv
import dataclasses
import hashlib
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Optional

from workflow import stats

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_PY = os.path.join(REPO_ROOT, 'bin', 'train.py')
# bin/train's default --total_rounds: how many rounds a trial that does not set
# the flag must reach to count as finished.
DEFAULT_TOTAL_ROUNDS = 100
# Set by the sweep for each trial; a grid or --fixed may not set them.
MANAGED_FLAGS = ('seed', 'experiment_name', 'root_output_dir')
MANIFEST = 'sweep.json'
MAX_NAME_LENGTH = 120  # Longer trial names are shortened with a hash.

_FLAG_NAME = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*$')
_LABEL = re.compile(r'^\s*([A-Za-z0-9_.+()-]+)\s*:(?!=)')


class SpecError(ValueError):
  """A malformed grid, spec file or flag; the message says which part."""


# ---------------------------------------------------------------------------
# Specs.

@dataclasses.dataclass(frozen=True)
class Group:
  """A labelled grid: flag name -> values, in the order given."""
  label: str
  axes: tuple[tuple[str, tuple[str, ...]], ...]

  def configurations(self) -> list[tuple[tuple[str, str], ...]]:
    names = [name for name, _ in self.axes]
    return [tuple(zip(names, values))
            for values in itertools.product(*(v for _, v in self.axes))]


def _known_flags() -> Optional[frozenset]:
  try:
    from workflow import cli  # pylint: disable=g-import-not-at-top
  except ImportError:  # pragma: no cover - absl missing
    return None
  return frozenset(cli.TRAIN_FLAG_NAMES)


def _check_flag(name: str, where: str, known: Optional[frozenset]) -> None:
  if not _FLAG_NAME.match(name):
    raise SpecError(f'{where}: {name!r} is not a flag name')
  if name in MANAGED_FLAGS:
    raise SpecError(f'{where}: --{name} is set by the sweep for each trial '
                    '(use --seeds / --num_seeds and --sweep_dir)')
  if known is not None and name not in known:
    raise SpecError(f'{where}: --{name} is not a bin/train flag')


def _default_label(axes) -> str:
  single = [f'{name}={values[0]}' for name, values in axes if len(values) == 1]
  return ','.join(single) or 'grid'


def _parse_assignment(text: str, where: str, known) -> tuple[str, tuple[str, ...]]:
  if '=' not in text:
    raise SpecError(f'{where}: expected name=value[,value...]; got {text.strip()!r}')
  name, _, values = text.partition('=')
  name = name.strip().removeprefix('--')
  _check_flag(name, where, known)
  parsed = tuple(v.strip() for v in values.split(','))
  if not parsed or any(v == '' for v in parsed):
    raise SpecError(f'{where}: --{name} has an empty value in {values.strip()!r}')
  if len(set(parsed)) != len(parsed):
    raise SpecError(f'{where}: --{name} repeats a value in {values.strip()!r}')
  return name, parsed


def _make_group(label: Optional[str], axes, where: str) -> Group:
  names = [n for n, _ in axes]
  repeated = sorted({n for n in names if names.count(n) > 1})
  if repeated:
    raise SpecError(f'{where}: --{repeated[0]} is given twice')
  return Group(label or _default_label(axes), tuple(axes))


def parse_grid(text: str, known_flags: Optional[frozenset] = None) -> list[Group]:
  """Groups of a `--grid` string (see the module docstring)."""
  known = _known_flags() if known_flags is None else known_flags
  groups = []
  for i, part in enumerate(text.split('|')):
    where = f'--grid group {i + 1}'
    label = None
    match = _LABEL.match(part)
    if match:
      label, part = match.group(1), part[match.end():]
    axes = [_parse_assignment(a, where, known) for a in part.split(';') if a.strip()]
    if not axes:
      raise SpecError(f'{where}: no flags')
    groups.append(_make_group(label, axes, where))
  labels = [g.label for g in groups]
  repeated = sorted({l for l in labels if labels.count(l) > 1})
  if repeated:
    raise SpecError(f'--grid: two groups are labelled {repeated[0]!r}; name them '
                    "('label: name=...')")
  return groups


def parse_spec_file(path: str, known_flags: Optional[frozenset] = None) -> list[Group]:
  """Groups of a spec file: `[label]` headers, `name = v1, v2` lines, `#` comments."""
  known = _known_flags() if known_flags is None else known_flags
  try:
    with open(path) as f:
      lines = f.read().splitlines()
  except OSError as e:
    raise SpecError(f'--spec: cannot read {path}: {e.strerror}') from None
  common, sections = [], []  # sections: [label, axes, first line]
  for number, raw in enumerate(lines, 1):
    line = raw.split('#', 1)[0].strip()
    if not line:
      continue
    where = f'{path}:{number}'
    if line.startswith('['):
      if not line.endswith(']') or not line[1:-1].strip():
        raise SpecError(f'{where}: a group header looks like [label]; got {line!r}')
      sections.append([line[1:-1].strip(), [], where])
    else:
      (sections[-1][1] if sections else common).append(_parse_assignment(line, where, known))
  if not sections:
    if not common:
      raise SpecError(f'{path}: no flags')
    return [_make_group(None, common, path)]
  labels = [s[0] for s in sections]
  repeated = sorted({l for l in labels if labels.count(l) > 1})
  if repeated:
    raise SpecError(f'{path}: group [{repeated[0]}] appears twice')
  return [_make_group(label, common + axes, where) for label, axes, where in sections]


def parse_fixed(text: str, known_flags: Optional[frozenset] = None) -> dict[str, str]:
  """`name=value;name=value` (values may hold commas) -> dict."""
  known = _known_flags() if known_flags is None else known_flags
  fixed = {}
  for item in text.split(';'):
    if not item.strip():
      continue
    if '=' not in item:
      raise SpecError(f'--fixed: expected name=value; got {item.strip()!r}')
    name, _, value = item.partition('=')
    name = name.strip().removeprefix('--')
    _check_flag(name, '--fixed', known)
    if name in fixed:
      raise SpecError(f'--fixed: --{name} is given twice')
    fixed[name] = value.strip()
  return fixed


# ---------------------------------------------------------------------------
# Trials.

def _safe(text: str) -> str:
  return re.sub(r'[^A-Za-z0-9._=+-]', '_', text)


def trial_name(group: str, tuned: Sequence[tuple[str, str]], seed: int) -> str:
  """Stable directory name: the group label, the tuned flags' values, the seed.

  Only flags with several values in the group (the tuned ones) are spelled
  out; the group's single-valued flags are what its label stands for. A rerun
  that changes one of those reuses the name, and bin/train then refuses the
  directory ("holds a run with different flags") instead of mixing results.
  """
  parts = [_safe(group)] + [f'{k}={_safe(v)}' for k, v in sorted(tuned)] + [f'seed={seed}']
  name = ','.join(parts)
  if len(name) > MAX_NAME_LENGTH:
    digest = hashlib.sha1(name.encode()).hexdigest()[:10]
    suffix = f'seed={seed}'
    name = f'{name[:MAX_NAME_LENGTH - len(suffix) - 13]}-{digest},{suffix}'
  return name


@dataclasses.dataclass(frozen=True)
class Trial:
  group: str
  flags: tuple[tuple[str, str], ...]  # The group's flags (not --fixed, not the seed).
  seed: int
  tuned: tuple[str, ...] = ()  # Flags with several values in the group.

  @property
  def name(self) -> str:
    return trial_name(self.group, [(k, v) for k, v in self.flags if k in self.tuned], self.seed)

  @property
  def tuned_values(self) -> tuple[tuple[str, str], ...]:
    return tuple((k, v) for k, v in self.flags if k in self.tuned)

  @property
  def config(self) -> tuple[tuple[str, str], ...]:
    """The configuration the trial belongs to: its flags, seed excluded."""
    return tuple(sorted(self.flags))


def expand(groups: Sequence[Group], seeds: Sequence[int],
           fixed: Optional[Mapping[str, str]] = None) -> list[Trial]:
  """Every (group, configuration, seed) as a Trial; names must be unique."""
  fixed = fixed or {}
  if not seeds:
    raise SpecError('--num_seeds / --seeds: at least one seed')
  trials, seen = [], set()
  for group in groups:
    clash = sorted(set(fixed) & {n for n, _ in group.axes})
    if clash:
      raise SpecError(f'--{clash[0]} is both in --fixed and in group [{group.label}]')
    tuned = tuple(name for name, values in group.axes if len(values) > 1)
    for config in group.configurations():
      for seed in seeds:
        trial = Trial(group.label, config, int(seed), tuned)
        if trial.name in seen:
          raise SpecError(f'two groups are labelled {group.label!r}')
        seen.add(trial.name)
        trials.append(trial)
  return trials


def parse_seeds(num_seeds: int = 0, seeds: str = '') -> list[int]:
  """`--seeds=0,3,7` (explicit) wins over `--num_seeds=N` (0..N-1)."""
  if seeds.strip():
    try:
      out = [int(s) for s in seeds.split(',') if s.strip()]
    except ValueError:
      raise SpecError(f'--seeds: comma-separated integers; got {seeds!r}') from None
    if len(set(out)) != len(out):
      raise SpecError(f'--seeds: repeated seed in {seeds!r}')
    return out
  if num_seeds < 1:
    raise SpecError(f'--num_seeds must be a positive integer; got {num_seeds}')
  return list(range(num_seeds))


def trials_dir(sweep_dir: str) -> str:
  return os.path.join(sweep_dir, 'trials')


def trial_dir(sweep_dir: str, trial: Trial) -> str:
  return os.path.join(trials_dir(sweep_dir), trial.name)


def log_path(sweep_dir: str, trial: Trial) -> str:
  return os.path.join(sweep_dir, 'logs', f'{trial.name}.log')


def total_rounds(trial: Trial, fixed: Mapping[str, str]) -> int:
  value = dict(trial.flags).get('total_rounds', fixed.get('total_rounds'))
  return DEFAULT_TOTAL_ROUNDS if value is None else int(value)


def last_round(metrics_csv: str) -> int:
  """Largest `round` in a metrics.csv (0 if absent or empty)."""
  try:
    with open(metrics_csv, newline='') as f:
      rounds = [int(float(r['round'])) for r in csv.DictReader(f) if r.get('round')]
  except (OSError, KeyError, ValueError):
    return 0
  return max(rounds, default=0)


def is_finished(sweep_dir: str, trial: Trial, fixed: Mapping[str, str]) -> bool:
  return last_round(os.path.join(trial_dir(sweep_dir, trial), 'metrics.csv')) >= total_rounds(
      trial, fixed)


def trial_argv(sweep_dir: str, trial: Trial, fixed: Mapping[str, str],
               command: Sequence[str]) -> list[str]:
  """`command` + --fixed flags + grid flags + the flags the sweep manages."""
  return [*command,
          *(f'--{k}={v}' for k, v in fixed.items()),
          *(f'--{k}={v}' for k, v in trial.flags),
          f'--seed={trial.seed}',
          f'--root_output_dir={trials_dir(sweep_dir)}',
          f'--experiment_name={trial.name}']


# ---------------------------------------------------------------------------
# Manifest: which trials belong to the sweep (read by bin/report).

def write_manifest(sweep_dir: str, trials: Sequence[Trial], fixed: Mapping[str, str]) -> str:
  """Merges `trials` into <sweep_dir>/sweep.json (a rerun may extend the grid)."""
  path = os.path.join(sweep_dir, MANIFEST)
  entries = {}
  if os.path.exists(path):
    with open(path) as f:
      entries = {e['name']: e for e in json.load(f)['trials']}
  for t in trials:
    entry = {'name': t.name, 'group': t.group, 'flags': dict(t.flags), 'seed': t.seed,
             'tuned': list(t.tuned)}
    for key in ('seconds', 'cpu_seconds', 'start_round'):
      if key in entries.get(t.name, {}):
        entry[key] = entries[t.name][key]
    entries[t.name] = entry
  os.makedirs(sweep_dir, exist_ok=True)
  with open(path + '.tmp', 'w') as f:
    json.dump({'fixed': dict(fixed), 'trials': list(entries.values())}, f, indent=1)
  os.replace(path + '.tmp', path)
  return path


def record_trial_seconds(sweep_dir: str, name: str, seconds: float,
                         cpu_seconds: Optional[float] = None, start_round: int = 0) -> None:
  """Notes a finished run's wall (and CPU) seconds in the manifest, for the report.

  `start_round` > 0 marks a run that resumed a trial: its times cover only
  the rounds after that.
  """
  path = os.path.join(sweep_dir, MANIFEST)
  with open(path) as f:
    data = json.load(f)
  for entry in data['trials']:
    if entry['name'] == name:
      entry['seconds'] = round(seconds, 1)
      entry['start_round'] = start_round
      if cpu_seconds is not None:
        entry['cpu_seconds'] = round(cpu_seconds, 3)
      else:
        entry.pop('cpu_seconds', None)
  with open(path + '.tmp', 'w') as f:
    json.dump(data, f, indent=1)
  os.replace(path + '.tmp', path)


def trial_seconds(sweep_dir: str, key: str = 'seconds',
                  whole_runs_only: bool = False) -> dict[str, float]:
  """Wall (key='seconds') or CPU ('cpu_seconds') seconds of each trial's last finished run.

  With `whole_runs_only`, runs that resumed a trial (or of unknown start) are left out.
  """
  with open(os.path.join(sweep_dir, MANIFEST)) as f:
    entries = json.load(f)['trials']
  return {e['name']: e[key] for e in entries
          if key in e and (not whole_runs_only or e.get('start_round', -1) == 0)}


def read_manifest(sweep_dir: str) -> tuple[list[Trial], dict[str, str]]:
  path = os.path.join(sweep_dir, MANIFEST)
  if not os.path.exists(path):
    raise SpecError(f'--sweep_dir: no {MANIFEST} in {sweep_dir} (run bin/sweep.py first)')
  with open(path) as f:
    data = json.load(f)
  trials = [Trial(e['group'], tuple(e['flags'].items()), int(e['seed']), tuple(e.get('tuned', ())))
            for e in data['trials']]
  return trials, dict(data.get('fixed', {}))


# ---------------------------------------------------------------------------
# Running.

@dataclasses.dataclass
class TrialOutcome:
  trial: Trial
  status: str  # 'finished' (ran now), 'skipped' (finished before), 'failed'
  log: str
  returncode: Optional[int] = None
  seconds: float = 0.0
  cpu_seconds: Optional[float] = None  # User + system time of the trial and its children.
  message: str = ''


def _term_with_parent() -> None:  # runs in the child between fork and exec
  try:
    import ctypes  # pylint: disable=g-import-not-at-top
    ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
  except OSError:
    pass


def _last_line(path: str) -> str:
  try:
    with open(path, errors='replace') as f:
      lines = [l.strip() for l in f.read()[-20000:].splitlines() if l.strip()]
  except OSError:
    return ''
  errors = [l for l in lines if 'error' in l.lower()]
  return (errors or lines or [''])[-1][:300]


def run_sweep(trials: Sequence[Trial], sweep_dir: str, *, fixed: Optional[Mapping[str, str]] = None,
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
    raise SpecError(f'--max_parallel must be a positive integer; got {max_parallel}')
  command = list(command or [sys.executable, TRAIN_PY])
  os.makedirs(os.path.join(sweep_dir, 'logs'), exist_ok=True)
  os.makedirs(trials_dir(sweep_dir), exist_ok=True)
  write_manifest(sweep_dir, trials, fixed)
  outcomes: dict[str, TrialOutcome] = {}
  pending = []
  for trial in trials:
    if is_finished(sweep_dir, trial, fixed):
      outcomes[trial.name] = TrialOutcome(trial, 'skipped', log_path(sweep_dir, trial))
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
    path = log_path(sweep_dir, trial)
    if proc.returncode == 0 and is_finished(sweep_dir, trial, fixed):
      outcome = TrialOutcome(trial, 'finished', path, 0, seconds, cpu_seconds=cpu)
      record_trial_seconds(sweep_dir, name, seconds, cpu, start_round)
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
        argv = trial_argv(sweep_dir, trial, fixed, command)
        start_round = last_round(os.path.join(trial_dir(sweep_dir, trial), 'metrics.csv'))
        with open(log_path(sweep_dir, trial), 'ab') as out:
          out.write(f'\n=== {time.strftime("%Y-%m-%d %H:%M:%S")} {" ".join(argv)}\n'.encode())
          out.flush()
          try:
            proc = subprocess.Popen(  # pylint: disable=consider-using-with
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=REPO_ROOT,
                start_new_session=True,  # Ctrl-C reaches the sweep only; it stops trials itself
                preexec_fn=_term_with_parent if sys.platform.startswith('linux') else None)
          except OSError as e:  # The trial program itself cannot start.
            out.write(f'error: cannot start {argv[0]}: {e}\n'.encode())
            outcomes[trial.name] = TrialOutcome(trial, 'failed', log_path(sweep_dir, trial),
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


# ---------------------------------------------------------------------------
# Results and selection.

def read_columns(metrics_csv: str) -> dict[str, list[float]]:
  """Columns of a metrics.csv as floats (empty cells -> NaN), rows by round."""
  with open(metrics_csv, newline='') as f:
    rows = list(csv.DictReader(f))
  rows.sort(key=lambda r: float(r['round']))
  names = list(rows[0].keys()) if rows else []
  return {n: [float(r[n]) if r.get(n) not in (None, '') else math.nan for r in rows]
          for n in names}


@dataclasses.dataclass
class TrialResult:
  trial: Trial
  finished: bool
  columns: dict[str, list[float]]  # Empty when the trial wrote no metrics.


def load_results(sweep_dir: str, groups: Optional[Sequence[Group]] = None
                 ) -> tuple[list[TrialResult], dict[str, str]]:
  """The trials of the sweep's manifest, with their metrics (if any).

  The manifest keeps every trial ever run in `sweep_dir`; with `groups` (a
  spec), only the trials of its configurations are returned, so that a grid
  that was narrowed leaves its dropped points out of the report.
  """
  trials, fixed = read_manifest(sweep_dir)
  if groups is not None:
    wanted = {(g.label, tuple(sorted(c))) for g in groups for c in g.configurations()}
    trials = [t for t in trials if (t.group, t.config) in wanted]
  results = []
  for trial in trials:
    path = os.path.join(trial_dir(sweep_dir, trial), 'metrics.csv')
    columns = read_columns(path) if os.path.exists(path) else {}
    results.append(TrialResult(trial, is_finished(sweep_dir, trial, fixed), columns))
  return results, fixed


@dataclasses.dataclass(frozen=True)
class Rule:
  """How one trial's metric curve becomes one number.

  `last_mean:N` the mean of the last N logged values (papers' choice);
  `max` / `min` the best value; `final` the last value. `mode` says whether
  larger scores are better (accuracy) or smaller (loss).
  """
  metric: str = 'eval/accuracy'
  kind: str = 'last_mean'
  n: int = 1
  mode: str = 'max'

  def describe(self) -> str:
    what = {'last_mean': f'mean of the last {self.n} logged values', 'max': 'maximum',
            'min': 'minimum', 'final': 'final value'}[self.kind]
    better = 'higher' if self.mode == 'max' else 'lower'
    return f'{what} of {self.metric}, averaged over seeds ({better} is better)'


def parse_rule(text: str, metric: str = 'eval/accuracy', mode: str = 'max') -> Rule:
  kind, _, arg = text.strip().partition(':')
  if kind not in ('last_mean', 'max', 'min', 'final'):
    raise SpecError(f'--select_rule must be last_mean:N, max, min or final; got {text!r}')
  if mode not in ('max', 'min'):
    raise SpecError(f'--select_mode must be max or min; got {mode!r}')
  n = 1
  if kind == 'last_mean':
    try:
      n = int(arg)
    except ValueError:
      raise SpecError(
          f'--select_rule=last_mean:N needs a positive integer N; got {text!r}') from None
    if n < 1:
      raise SpecError(f'--select_rule=last_mean:N needs a positive integer N; got {text!r}')
  elif arg:
    raise SpecError(f'--select_rule={kind} takes no argument; got {text!r}')
  return Rule(metric, kind, n, mode)


def trial_score(columns: Mapping[str, Sequence[float]], rule: Rule) -> float:
  """The rule's statistic of the finite logged values of `rule.metric` (NaN if none)."""
  values = [v for v in columns.get(rule.metric, ()) if math.isfinite(v)]
  if not values:
    return math.nan
  if rule.kind == 'last_mean':
    tail = values[-rule.n:]
    return math.fsum(tail) / len(tail)
  if rule.kind == 'max':
    return max(values)
  if rule.kind == 'min':
    return min(values)
  return values[-1]


@dataclasses.dataclass
class ConfigSummary:
  """One configuration of one group over its seeds."""
  group: str
  config: tuple[tuple[str, str], ...]
  results: list[TrialResult]  # One per seed, seed order.
  score: stats.MeanCI

  @property
  def complete(self) -> bool:
    return all(r.finished for r in self.results)

  @property
  def seeds(self) -> list[int]:
    return [r.trial.seed for r in self.results]


def summarize(results: Sequence[TrialResult], rule: Rule,
              confidence: float = 0.95) -> list[ConfigSummary]:
  """Groups trials by (group, configuration); scores finished seeds."""
  by_config: dict[tuple, list[TrialResult]] = {}
  for r in results:
    by_config.setdefault((r.trial.group, r.trial.config), []).append(r)
  out = []
  for (group, config), rs in by_config.items():
    rs = sorted(rs, key=lambda r: r.trial.seed)
    scores = [trial_score(r.columns, rule) for r in rs if r.finished]
    out.append(ConfigSummary(group, config, rs, stats.mean_ci(scores, confidence)))
  return out


def select_best(summaries: Sequence[ConfigSummary], rule: Rule) -> dict[str, ConfigSummary]:
  """Best configuration per group by the seed-mean score.

  A configuration with a failed or unfinished seed (a diverged run, say) is
  not selectable while a complete one exists: divergence on any seed counts
  against the hyperparameters, as in the papers' grids.
  """
  best = {}
  sign = 1.0 if rule.mode == 'max' else -1.0
  for group in dict.fromkeys(s.group for s in summaries):
    candidates = [s for s in summaries if s.group == group and s.score.n > 0]
    complete = [s for s in candidates if s.complete]
    pool = complete or candidates
    if pool:
      best[group] = max(pool, key=lambda s: sign * s.score.mean)
  return best


def format_config(config: Sequence[tuple[str, str]], drop: Sequence[str] = ()) -> str:
  return ' '.join(f'--{k}={v}' for k, v in config if k not in drop) or '(fixed flags only)'


def selection_report(summaries: Sequence[ConfigSummary], rule: Rule) -> str:
  """Plain-text ranking of every configuration and the best one per group."""
  best = select_best(summaries, rule)
  sign = 1.0 if rule.mode == 'max' else -1.0
  lines = [f'Selection: {rule.describe()}']
  for group in dict.fromkeys(s.group for s in summaries):
    lines.append(f'[{group}]')
    ranked = sorted((s for s in summaries if s.group == group),
                    key=lambda s: -sign * s.score.mean if s.score.n else math.inf)
    for s in ranked:
      mark = '*' if best.get(group) is s else ' '
      seeds = f'{sum(r.finished for r in s.results)}/{len(s.results)} seeds'
      shown = s.results[0].trial.tuned_values or s.config  # the group label says the rest
      lines.append(f' {mark} {s.score.format(4):>18s}  ({seeds})  {format_config(shown)}')
  return '\n'.join(lines)
