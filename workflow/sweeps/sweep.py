"""Hyperparameter sweeps over `bin/train`: grids, seeds, trials and the sweep's manifest.

A sweep is a list of *groups*; each group is a grid (the Cartesian product of
per-flag value lists) over any `bin/train` flags, and every configuration runs
once per seed. Groups make a list of grids, so that, for example, FedAvg is
tuned over its client learning rate while FedAdam is tuned over its server
learning rate (the papers tune each algorithm on its own grid: the decaying-K
paper's Table 4, the FedAda2 paper's Appendix H, the FedOpt paper's Appendix D).

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

Each trial runs in `<sweep_dir>/trials/<name>`, with its output in
`<sweep_dir>/logs/<name>.log`. The name is built from the trial's grid flags
and seed only, so it is stable across reruns and extended grids. A trial is
*finished* when its metrics.csv holds the final round. `<sweep_dir>/sweep.json`
(the manifest) lists the sweep's trials for bin/report.

Running the trials: `workflow.sweeps.sweep_runner`; scoring and selecting
configurations: `workflow.sweeps.selection`.
"""

import csv
import dataclasses
import hashlib
import itertools
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Optional

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
    from workflow.flags import train_flags  # pylint: disable=g-import-not-at-top
  except ImportError:  # pragma: no cover - absl missing
    return None
  return frozenset(train_flags.TRAIN_FLAG_NAMES)


_PARSERS: Optional[dict] = None


def _check_value(name: str, value: str, where: str) -> None:
  """SpecError naming `where` if bin/train would refuse `value` for --name (its flag's parser)."""
  global _PARSERS
  if _PARSERS is None:
    from absl import flags  # pylint: disable=g-import-not-at-top
    from workflow.flags import train_flags  # pylint: disable=g-import-not-at-top
    values = flags.FlagValues()
    train_flags.define_flags(values)
    _PARSERS = {n: values[n].parser for n in values}
  if '\0' in value:
    raise SpecError(f'{where}: --{name} holds a NUL byte')
  parser = _PARSERS.get(name)
  if parser is None:
    return
  try:
    parser.parse(value)
  except (ValueError, TypeError) as e:
    reason = e.args[0] if e.args else e
    raise SpecError(f'{where}: --{name}={value!r} is not a valid {parser.flag_type()} value '
                    f'({reason})') from None


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
  for value in parsed:
    _check_value(name, value, where)
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
    with open(path, 'rb') as f:
      lines = f.read().decode('utf-8').splitlines()
  except OSError as e:
    raise SpecError(f'--spec: cannot read {path}: {e.strerror}') from None
  except UnicodeDecodeError as e:
    raise SpecError(f'--spec: {path} is not a text file (byte {e.start} is not UTF-8)') from None
  common, sections = [], []  # sections: [label, axes, first line]
  for number, raw in enumerate(lines, 1):
    where = f'{path}:{number}'
    if '\0' in raw:
      raise SpecError(f'{where}: holds a NUL byte (a spec is text: [label] and name = values lines)')
    line = raw.split('#', 1)[0].strip()
    if not line:
      continue
    if line.startswith('['):
      if not line.endswith(']') or not line[1:-1].strip():
        raise SpecError(f'{where}: a group header looks like [label]; got {line!r}')
      sections.append([line[1:-1].strip(), [], where])
    else:
      (sections[-1][1] if sections else common).append(_parse_assignment(line, where, known))
  if not sections:
    if not common:
      raise SpecError(f'--spec={path}: no flags (the file is empty or holds only comments)')
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
    _check_value(name, value.strip(), '--fixed')
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


def check_sweep_dir(sweep_dir: str) -> None:
  """SpecError if --sweep_dir (or what a sweep keeps in it) exists as the wrong kind of file."""
  for path, is_dir in ((sweep_dir, True), (trials_dir(sweep_dir), True),
                       (os.path.join(sweep_dir, 'logs'), True),
                       (os.path.join(sweep_dir, MANIFEST), False)):
    if os.path.lexists(path) and os.path.isdir(path) != is_dir:
      what = 'a file, not a directory' if is_dir else 'a directory, not a file'
      where = f'--sweep_dir={path}' if path == sweep_dir else f'--sweep_dir={sweep_dir}: {path}'
      raise SpecError(f'{where} is {what}')
  _check_writable(sweep_dir)


def _check_writable(sweep_dir: str) -> None:
  """SpecError if the sweep could not create or write --sweep_dir; nothing is written.

  Its nearest existing ancestor must be a directory this process can write
  (a --sweep_dir under a file otherwise ends in NotADirectoryError from the
  first makedirs). The kernel may still refuse what `os.access` allows (root
  on a read-only file system): `sweep_runner.run_sweep` answers that too.
  """
  existing = os.path.abspath(sweep_dir)
  while not os.path.lexists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise SpecError(f'--sweep_dir={sweep_dir}: {existing} is not a directory')
  targets = [existing]
  if existing == os.path.abspath(sweep_dir):  # a sweep to resume: where it writes, too
    targets += [p for p in (trials_dir(sweep_dir), os.path.join(sweep_dir, 'logs'))
                if os.path.isdir(p)]
  for path in targets:
    if not os.access(path, os.W_OK | os.X_OK):
      raise SpecError(f'--sweep_dir={sweep_dir}: {path} is not writable')


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


# What bin/train leaves in a run directory the divergence rule stopped: {"round", "error"}
# (workflow/training/divergence.record; the name is run_dir.DIVERGED).
DIVERGED = 'diverged.json'


def diverged(sweep_dir: str, trial: Trial) -> Optional[dict]:
  """The trial's record of its last attempt's divergence, None if there is none
  (a damaged record is none: the trial is simply run again)."""
  try:
    with open(os.path.join(trial_dir(sweep_dir, trial), DIVERGED)) as f:
      record = json.load(f)
    return record if isinstance(record, dict) and isinstance(record.get('round'), int) else None
  except (OSError, ValueError):
    return None


def is_finished(sweep_dir: str, trial: Trial, fixed: Mapping[str, str]) -> bool:
  return last_round(os.path.join(trial_dir(sweep_dir, trial), 'metrics.csv')) >= total_rounds(
      trial, fixed)


def standing(sweep_dir: str, trial: Trial, fixed: Mapping[str, str],
             retry_diverged: bool = False) -> tuple[str, Optional[dict]]:
  """Where a trial stands before a sweep runs: ('finished', None), ('diverged', its
  record) unless `retry_diverged`, else ('to run', None)."""
  if is_finished(sweep_dir, trial, fixed):
    return 'finished', None
  record = None if retry_diverged else diverged(sweep_dir, trial)
  return ('diverged', record) if record is not None else ('to run', None)


def trial_argv(sweep_dir: str, trial: Trial, fixed: Mapping[str, str],
               command: Sequence[str]) -> list[str]:
  """`command` + --fixed flags + grid flags + the flags the sweep manages.

  The output directory is absolute: trials run in the repository's root, and a
  --sweep_dir relative to where bin/sweep was started would land there.
  """
  return [*command,
          *(f'--{k}={v}' for k, v in fixed.items()),
          *(f'--{k}={v}' for k, v in trial.flags),
          f'--seed={trial.seed}',
          f'--root_output_dir={os.path.abspath(trials_dir(sweep_dir))}',
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

