"""Aggregates a sweep's trials: tables with confidence intervals, costs to a target, curves.

What the papers report, computed from bin/train's metrics.csv files:
  * a score per configuration, mean ± 95% Student-t CI over seeds
    (FedGBO paper Table 6.4; `workflow.sweeps.stats`), with the selection rule of
    `workflow.sweeps.sweep` picking each group's best hyperparameters;
  * the rounds, uploaded bits, client FLOPs and simulated minutes needed to
    reach a target metric (FedGBO paper Table 6.4's right half; thesis Tables
    3.1-3.3 "rounds required to reach target test accuracies"; thesis ch. 5's
    runtime model), from the `round`, `cost/cumulative_upload_bits`,
    `cost/cumulative_client_flops` and `sim/cumulative_minutes` columns;
  * figures of the mean curve over seeds with its CI band against rounds,
    bits, FLOPs or simulated time (thesis Figure 5.2).

A seed reaches the target at the first logged evaluation at which the metric
is ≥ target (≤ for `mode='min'`); the cost is that row's cumulative column.
Seeds that never reach it are counted (k/N reached) and left out of the mean.
Curves average the seeds row by row (same round); on a cost axis the x
coordinate is the seeds' mean cumulative cost at that round (bits are equal
across seeds; FLOPs differ by the examples each client holds).
"""

import dataclasses
import math
import os
import textwrap
from collections.abc import Mapping, Sequence
from typing import Optional

import numpy as np

from workflow.reporting import plotting
from workflow.sweeps import selection
from workflow.sweeps import stats
from workflow.sweeps import sweep

import matplotlib  # pylint: disable=g-bad-import-order
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,g-bad-import-order

# Columns that a target can be reached "in": name in metrics.csv -> label.
COST_AXES = {
    'round': 'rounds',
    'cost/cumulative_upload_bits': 'upload bits (all clients)',
    'cost/cumulative_client_flops': 'client FLOPs (all clients)',
    'sim/cumulative_minutes': 'simulated minutes',
}


def first_reach(columns: Mapping[str, Sequence[float]], metric: str, target: float,
                x: str = 'round', mode: str = 'max') -> float:
  """`x` at the first row where `metric` reaches `target`; NaN if never (or no such column)."""
  values, xs = columns.get(metric), columns.get(x)
  if values is None or xs is None:
    return math.nan
  for value, at in zip(values, xs):
    if math.isfinite(value) and (value >= target if mode == 'max' else value <= target):
      return at
  return math.nan


@dataclasses.dataclass(frozen=True)
class Reach:
  """Cost to reach the target over the seeds that reached it."""
  cost: stats.MeanCI
  reached: int
  seeds: int

  def format(self, digits: int = 3, sci: bool = False) -> str:
    if self.reached == 0:
      return f'not reached (0/{self.seeds})'
    text = format_sci(self.cost, digits) if sci else self.cost.format(digits)
    return text + ('' if self.reached == self.seeds else f' ({self.reached}/{self.seeds})')


def reach(results: Sequence[selection.TrialResult], metric: str, target: float, x: str = 'round',
          mode: str = 'max', confidence: float = 0.95) -> Reach:
  values = [first_reach(r.columns, metric, target, x, mode) for r in results]
  return Reach(stats.mean_ci(values, confidence), sum(math.isfinite(v) for v in values),
               len(results))


def format_sci(value: stats.MeanCI, digits: int = 3) -> str:
  """'1.23e+08 ± 4.0e+06' style for costs spanning orders of magnitude."""
  if value.n == 0:
    return '—'
  text = f'{value.mean:.{digits - 1}e}'
  if math.isfinite(value.half_width):
    text += f' ± {value.half_width:.1e}'
  return text


@dataclasses.dataclass
class Curve:
  x: np.ndarray
  mean: np.ndarray
  half_width: np.ndarray  # NaN with one seed.
  seeds: int


def mean_curve(results: Sequence[selection.TrialResult], metric: str, x: str = 'round',
               confidence: float = 0.95) -> Optional[Curve]:
  """Seed-mean curve of `metric` over the rounds every seed logged it."""
  per_seed = []
  for r in results:
    rounds, values, xs = (r.columns.get('round'), r.columns.get(metric), r.columns.get(x))
    if rounds is None or values is None or xs is None:
      continue
    per_seed.append({int(rd): (xv, v) for rd, v, xv in zip(rounds, values, xs)
                     if math.isfinite(v) and math.isfinite(xv)})
  if not per_seed:
    return None
  common = sorted(set.intersection(*(set(s) for s in per_seed)))
  if not common:
    return None
  xs, means, halves = [], [], []
  for rd in common:
    ci = stats.mean_ci([s[rd][1] for s in per_seed], confidence)
    xs.append(float(np.mean([s[rd][0] for s in per_seed])))
    means.append(ci.mean)
    halves.append(ci.half_width)
  return Curve(np.array(xs), np.array(means), np.array(halves), len(per_seed))


# A t-interval from 2 seeds is ±12.7 standard errors wide (1 degree of
# freedom): bands start at 3 seeds; below, the legend says what the line is.
MIN_SEEDS_FOR_BAND = 3


def curve_label(label: str, curve: Curve, confidence: float = 0.95) -> str:
  """The legend entry: the group and what its line and band are."""
  if curve.seeds >= MIN_SEEDS_FOR_BAND and np.any(np.isfinite(curve.half_width)):
    return f'{label} (mean of {curve.seeds} seeds ± {confidence:.0%} CI)'
  if curve.seeds == 1:
    return f'{label} (1 seed)'
  return f'{label} (mean of {curve.seeds} seeds; CI band from {MIN_SEEDS_FOR_BAND} seeds)'


def mean_curves_figure(curves: Mapping[str, Mapping[str, Curve]], metric: str, title: str = '',
                       confidence: float = 0.95):
  """One panel per x axis (curves[x][label]): mean lines, CI bands from 3 seeds; the open figure."""
  axes_names = [x for x in curves if curves[x]]
  if not axes_names:
    raise ValueError('no curves to plot')
  fig, axes = plt.subplots(1, len(axes_names), figsize=(4.8 * len(axes_names), 4.2),
                           squeeze=False)
  for ax, x in zip(axes[0], axes_names):
    for i, (label, c) in enumerate(curves[x].items()):
      color = f'C{i % 10}'
      ax.plot(c.x, c.mean, color=color, label=curve_label(label, c, confidence), lw=1.5,
              marker='o' if len(c.x) < 20 else None, markersize=3)
      if c.seeds >= MIN_SEEDS_FOR_BAND and np.any(np.isfinite(c.half_width)):
        ax.fill_between(c.x, c.mean - c.half_width, c.mean + c.half_width, color=color,
                        alpha=0.15, lw=0)
    ax.set_xlabel(plotting.metric_label(x))
    if x != 'round':
      ax.set_xscale('log')
    plotting.integer_ticks(ax, x, np.concatenate([c.x for c in curves[x].values()]))
    # A wide band must not flatten the curves: the axes follow the means.
    means = np.concatenate([c.mean for c in curves[x].values()])
    low, high = float(np.min(means)), float(np.max(means))
    pad = 0.15 * (high - low) or 0.05
    low, high = low - pad, high + pad
    if 'accuracy' in metric:
      low, high = max(low, 0.0), min(high, 1.0)
    ax.set_ylim(low, high)
    ax.set_ylabel(plotting.metric_label(metric))
    ax.grid(alpha=0.3)
  plotting.finish_figure(fig, axes[0][0], title or f'{plotting.metric_label(metric)}: the '
                         'selected configuration of each group')
  return fig


def plot_mean_curves(curves: Mapping[str, Mapping[str, Curve]], metric: str, out: str,
                     title: str = '', confidence: float = 0.95) -> str:
  """Writes `mean_curves_figure` to `out` (PNG); returns `out`."""
  fig = mean_curves_figure(curves, metric, title, confidence)
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  fig.savefig(out, dpi=100)
  plt.close(fig)
  return out


# ---------------------------------------------------------------------------
# The sweep report.

@dataclasses.dataclass
class GroupResult:
  """A group's best configuration and what it achieved."""
  group: str
  best: selection.ConfigSummary
  reaches: dict[str, Reach]  # COST_AXES key -> Reach
  per_round_upload_bits: float  # Mean upload bits per client per round.

  @property
  def finished(self) -> list[selection.TrialResult]:
    return [r for r in self.best.results if r.finished]


def group_results(summaries: Sequence[selection.ConfigSummary], rule: selection.Rule,
                  target: Optional[float], axes: Sequence[str] = tuple(COST_AXES),
                  confidence: float = 0.95) -> dict[str, GroupResult]:
  out = {}
  for group, best in selection.select_best(summaries, rule).items():
    finished = [r for r in best.results if r.finished]
    reaches = {}
    if target is not None:
      reaches = {x: reach(finished, rule.metric, target, x, rule.mode, confidence) for x in axes}
    up = [v for r in finished for v in r.columns.get('cost/upload_bits_per_client', [])
          if math.isfinite(v)]
    out[group] = GroupResult(group, best, reaches, float(np.mean(up)) if up else math.nan)
  return out


def _cell(text: str) -> str:
  return str(text).replace('|', '\\|')


def _tuned(summary: selection.ConfigSummary) -> str:
  trial = summary.results[0].trial
  return ', '.join(f'{k}={v}' for k, v in trial.tuned_values) or '—'


def _as_number(value: str) -> Optional[float]:
  try:
    return float(value)
  except ValueError:
    return None


def at_grid_edge(best: selection.ConfigSummary,
                 summaries: Sequence[selection.ConfigSummary]) -> list[str]:
  """Tuned flags whose selected value is the smallest or largest of the grid.

  A best value on the edge means the optimum may lie outside the grid.
  """
  edge = []
  group = [s for s in summaries if s.group == best.group]
  for name, value in best.results[0].trial.tuned_values:
    values = {_as_number(dict(s.config).get(name, '')) for s in group}
    chosen = _as_number(value)
    if chosen is None or None in values or len(values) < 2:
      continue
    if chosen in (min(values), max(values)):
      edge.append(name)
  return edge


def markdown_tables(summaries: Sequence[selection.ConfigSummary], rule: selection.Rule,
                    target: Optional[float], confidence: float = 0.95,
                    all_configs: bool = True) -> str:
  """The best-configuration table (with costs to target) and, optionally, every configuration."""
  groups = group_results(summaries, rule, target, confidence=confidence)
  pct = f'{confidence:.0%}'
  head = ['group', 'best tuned flags', f'score (mean ± {pct} CI)', 'seeds',
          'upload bits / client / round']
  if target is not None:
    head += [f'{COST_AXES[x]} to {rule.metric} {"≥" if rule.mode == "max" else "≤"} {target:g}'
             for x in COST_AXES]
  lines = [f'Score: {rule.describe()}; ± is the half-width of the {pct} Student-t interval '
           'over seeds.', '', '| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  edges = []
  for group, g in groups.items():
    edge = at_grid_edge(g.best, summaries)
    edges += [group] if edge else []
    row = [group, _tuned(g.best) + (' †' if edge else ''), g.best.score.format(4),
           f'{len(g.finished)}/{len(g.best.results)}', f'{g.per_round_upload_bits:.4g}']
    if target is not None:
      row += [g.reaches[x].format(1 if x == 'round' else 3, sci=x != 'round')
              for x in COST_AXES]
    lines.append('| ' + ' | '.join(_cell(c) for c in row) + ' |')
  if edges:
    lines += ['', f'† selected at the edge of its grid ({", ".join(edges)}): the best value may '
              'lie outside the grid.']
  if all_configs:
    lines += ['', 'All configurations (✱ = selected):', '',
              '| group | tuned flags | score | finished seeds |', '|---|---|---|---|']
    for s in summaries:
      mark = ' ✱' if groups.get(s.group) and groups[s.group].best is s else ''
      lines.append('| ' + ' | '.join(_cell(c) for c in (
          s.group + mark, _tuned(s), s.score.format(4),
          f'{sum(r.finished for r in s.results)}/{len(s.results)}')) + ' |')
  missing = [r for s in summaries for r in s.results if not r.finished]
  if missing:
    lines += ['', f'{len(missing)} trial(s) did not finish and are left out of the scores: ' +
              ', '.join(f'`{r.trial.name}`' for r in missing) + '.']
  return '\n'.join(lines)


def best_curves(summaries: Sequence[selection.ConfigSummary], rule: selection.Rule,
                xs: Sequence[str], groups: Optional[Sequence[str]] = None,
                confidence: float = 0.95) -> dict[str, dict[str, Curve]]:
  best = selection.select_best(summaries, rule)
  # Legend: the group and the settings in which the plotted configurations differ.
  configs = {group: dict(s.config) for group, s in best.items()
             if groups is None or group in groups}
  keys = sorted({k for c in configs.values() for k in c})
  differing = [k for k in keys if len({c.get(k) for c in configs.values()}) > 1]
  curves = {}
  for x in xs:
    curves[x] = {}
    for group, s in best.items():
      if groups is not None and group not in groups:
        continue
      c = mean_curve([r for r in s.results if r.finished], rule.metric, x, confidence)
      if c is not None:
        own = ', '.join(f'{k}={configs[group][k]}' for k in differing if k in configs[group])
        curves[x][f'{group}: {own}' if own else group] = c
  return curves


def write_sweep_report(sweep_dir: str, out_md: str, rule: selection.Rule,
                       target: Optional[float] = None,
                       xs: Sequence[str] = ('round', 'cost/cumulative_upload_bits'),
                       title: str = '', confidence: float = 0.95,
                       all_configs: bool = True, command: str = '') -> str:
  """Writes `out_md` and `<out_md stem>_<metric>.png`; returns the markdown."""
  results, fixed = selection.load_results(sweep_dir)
  summaries = selection.summarize(results, rule, confidence)
  stem = os.path.splitext(out_md)[0]
  figure_title = title
  if not figure_title:
    shared = ', '.join(f'{k}={v}' for k, v in fixed.items() if k not in sweep.MANAGED_FLAGS)
    figure_title = (f'{plotting.metric_label(rule.metric)}: the selected configuration of each '
                    f'group' + (f'\n{textwrap.shorten(shared, 110)}' if shared else ''))
  figure = plot_mean_curves(best_curves(summaries, rule, xs, confidence=confidence),
                            rule.metric, f'{stem}_curves.png', figure_title, confidence)
  parts = [f'# {title or "Sweep report"}', '']
  if command:
    parts += ['Regenerate with:', '', f'    {command}', '']
  if fixed:
    parts += ['Flags of every trial: `' + ' '.join(f'--{k}={v}' for k, v in fixed.items()) + '`',
              '']
  parts += [markdown_tables(summaries, rule, target, confidence, all_configs), '',
            f'![mean curves]({os.path.relpath(figure, os.path.dirname(os.path.abspath(out_md)))})',
            '', f'Curves: the selected configuration of each group, mean over seeds; with '
            f'{MIN_SEEDS_FOR_BAND} or more seeds a {confidence:.0%} CI band (the legend says '
            'which).', '']
  text = '\n'.join(parts)
  os.makedirs(os.path.dirname(os.path.abspath(out_md)), exist_ok=True)
  with open(out_md, 'w') as f:
    f.write(text)
  return text
