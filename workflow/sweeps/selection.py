"""A sweep's results: each trial's metrics, its score, the best configuration per group.

Selection follows the papers: a configuration's score is a statistic of a
metric per seed (e.g. the mean of the last N evaluations, the decaying-K paper: "highest
average test accuracy over the last 500 rounds"; the FedAda2 paper: "running average of
the last 10 logged datapoints"), averaged over seeds; the best configuration
of each group maximises (or minimises) it.
"""

import csv
import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from typing import Optional

from workflow.sweeps import stats
from workflow.sweeps import sweep


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
  trial: sweep.Trial
  finished: bool
  columns: dict[str, list[float]]  # Empty when the trial wrote no metrics.


def load_results(sweep_dir: str, groups: Optional[Sequence[sweep.Group]] = None
                 ) -> tuple[list[TrialResult], dict[str, str]]:
  """The trials of the sweep's manifest, with their metrics (if any).

  The manifest keeps every trial ever run in `sweep_dir`; with `groups` (a
  spec), only the trials of its configurations are returned, so that a grid
  that was narrowed leaves its dropped points out of the report.
  """
  trials, fixed = sweep.read_manifest(sweep_dir)
  if groups is not None:
    wanted = {(g.label, tuple(sorted(c))) for g in groups for c in g.configurations()}
    trials = [t for t in trials if (t.group, t.config) in wanted]
  results = []
  for trial in trials:
    path = os.path.join(sweep.trial_dir(sweep_dir, trial), 'metrics.csv')
    columns = read_columns(path) if os.path.exists(path) else {}
    results.append(TrialResult(trial, sweep.is_finished(sweep_dir, trial, fixed), columns))
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
    raise sweep.SpecError(f'--select_rule must be last_mean:N, max, min or final; got {text!r}')
  if mode not in ('max', 'min'):
    raise sweep.SpecError(f'--select_mode must be max or min; got {mode!r}')
  n = 1
  if kind == 'last_mean':
    try:
      n = int(arg)
    except ValueError:
      raise sweep.SpecError(
          f'--select_rule=last_mean:N needs a positive integer N; got {text!r}') from None
    if n < 1:
      raise sweep.SpecError(f'--select_rule=last_mean:N needs a positive integer N; got {text!r}')
  elif arg:
    raise sweep.SpecError(f'--select_rule={kind} takes no argument; got {text!r}')
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
