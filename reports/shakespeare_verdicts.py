"""The verdict rules of reports/shakespeare.md, in one place.

A claim is checked by comparing two configurations seed by seed (the same seed
samples the same clients each round, so the difference is paired) on one
measure of their curves. The answer is "supported", "contradicted" or
"no verdict (reason)", by these rules, applied in this order:

0. Diverged runs (`came_apart`). A run whose training loss, averaged over
   LOSS_WINDOW rounds, rose above the uniform guess's ln V after it had been
   below it came apart: its seed is left out of the comparison (from both
   configurations, the difference being paired), and the verdict names it
   and the round it came apart.
1. Seeds. Fewer than 2 seeds left for both configurations: no verdict.
2. Plateau (`left_plateau`). Every run of both configurations must have left
   its plateau on the curve the measure reads, else "no verdict (plateau)":
   - training loss: the mean of its last LOSS_WINDOW rounds is below the
     unigram entropy H of the training characters (the loss of predicting
     each by its frequency, without context) by more than LOSS_PLATEAU (2 %)
     of H. A run at H learnt the frequencies, not the text;
   - validation accuracy: the training loss left its plateau, or some
     evaluation differs from the run's first by more than ACCURACY_PLATEAU
     (0.5 points), up or down (runs evaluated only in their last rounds are
     flat there once they converged: the loss says whether they learnt).
   A run still on its plateau has no measured convergence yet: comparing it
   says when a run started to learn, not how fast it learns.
3. The test.
   - "better than" claims (`superiority`): the two-sided 95 % Student's t
     interval of the paired difference above 0 supports, below 0 contradicts;
     an interval holding 0 is "no verdict (not significant)".
   - "the same or improved" claims (`non_inferiority`): supported only when
     the one-sided 97.5 % t lower bound of (new − old) is above −margin
     (MARGINS, their sources in MARGIN_SOURCES); contradicted when the
     two-sided 95 % interval lies wholly below −margin; otherwise "no
     verdict (non-inferiority not shown)". A non-significant difference never
     supports such a claim.
4. Convergence (`change_per_window`). "Contradicted" needs every run of both
   configurations converged on the measure's curve: its least-squares slope
   over the last CONVERGENCE_WINDOW rounds changes it by at most
   CONVERGED_CHANGE over that window. Otherwise the comparison says which run
   came first, not where the runs end: "no verdict (not converged)".
5. One round. A verdict is recomputed leaving out each evaluation round (on
   validation accuracy) or each round (on training loss: a lowest loss is one
   round's) in turn, from every run; if leaving one out changes the verdict,
   the verdict is flagged as resting on that single round.
6. Horizon (`Horizon`). Runs shorter than the paper's label the verdict
   "at N of M rounds: descriptive"; at the paper's length, "at M rounds".
"""

import dataclasses
import math
from collections.abc import Callable
from typing import Optional

import report_runner as rr  # pylint: disable=g-import-not-at-top

ACCURACY, LOSS = 'eval/accuracy', 'train/client_work/train/loss'
ACCURACY_PLATEAU = 0.005  # 0.5 points of accuracy (a fraction)
LOSS_PLATEAU = 0.02  # a fraction of the unigram entropy
# One round's training loss is the mean over its clients' minibatches, noisy
# from round to round: the rules read the mean of the last few rounds.
LOSS_WINDOW = 5
# Non-inferiority margins, and where each comes from.
MARGINS = {ACCURACY: 0.01, LOSS: 0.02}
MARGIN_SOURCES = {
    ACCURACY: 'one point of accuracy: the gap the decaying-K paper reads as "matched" (its '
              'Table 1, Shakespeare: 0.55 against 0.54)',
    LOSS: '0.02 nats of training loss: this report\'s choice (no paper states one), under 1 % '
          'of the runs\' losses at their ends',
}
# Rule 4: a run has converged on a curve when its least-squares line over the
# last CONVERGENCE_WINDOW rounds changes it by at most this much (a choice of
# this report: half the accuracy plateau's width; for the loss, the margin).
CONVERGENCE_WINDOW = 100
CONVERGED_CHANGE = {ACCURACY: 0.005, LOSS: 0.02}
SUPPORTED, CONTRADICTED, NO_VERDICT = 'supported', 'contradicted', 'no verdict'
# Student's t quantiles (two-sided 95 % = one-sided 97.5 %) by degrees of freedom (seeds − 1).
_T_TWO_SIDED_95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365,
                   8: 2.306, 9: 2.262}


@dataclasses.dataclass(frozen=True)
class Baselines:
  """What a training loss is read against: ln V, the loss of guessing every
  symbol alike (the start; above it a run came apart), and the unigram
  entropy H of the training characters (each by its frequency: the plateau)."""
  vocab_size: int
  entropy: float

  @property
  def uniform(self) -> float:
    return math.log(self.vocab_size)


@dataclasses.dataclass(frozen=True)
class Horizon:
  """How many rounds the runs have against the paper's (rule 6)."""
  rounds: int
  paper_rounds: int

  def label(self) -> str:
    if self.rounds >= self.paper_rounds:
      return f'at {self.paper_rounds:,} rounds'
    return f'at {self.rounds:,} of {self.paper_rounds:,} rounds: descriptive'


@dataclasses.dataclass(frozen=True)
class Measure:
  """A number read from one run's curves (metrics.csv columns)."""
  heading: str
  fn: Callable[[dict], float]
  metric: str  # the curve it reads: ACCURACY (evaluations) or LOSS (every round)
  lower_is_better: bool = False


def _window_means(columns):
  """(round, mean training loss of the LOSS_WINDOW rounds ending there)."""
  points = rr.points(columns, 'round', LOSS) if LOSS in columns else []
  return [(points[i][0], sum(v for _, v in points[i + 1 - LOSS_WINDOW:i + 1]) / LOSS_WINDOW)
          for i in range(LOSS_WINDOW - 1, len(points))]


def left_plateau(columns: dict, metric: str, baselines: Baselines) -> bool:
  """Rule 2 for one run: whether its `metric` curve left the plateau."""
  losses = [v for _, v in rr.points(columns, 'round', LOSS)] if LOSS in columns else []
  tail = losses[-LOSS_WINDOW:]
  learnt = bool(tail) and sum(tail) / len(tail) < (1 - LOSS_PLATEAU) * baselines.entropy
  if metric == LOSS:
    return learnt
  values = [v for _, v in rr.points(columns, 'round', ACCURACY)] if ACCURACY in columns else []
  return bool(values) and (learnt or any(abs(v - values[0]) > ACCURACY_PLATEAU
                                         for v in values[1:]))


def plateau_text(metric: str, baselines: Baselines) -> str:
  """What "still on the plateau" means for `metric`, in words."""
  if metric == ACCURACY:
    return (f'validation accuracy within {100 * ACCURACY_PLATEAU:.1f} points of its first '
            f'evaluation and training loss not below H = {baselines.entropy:.3f} by more than '
            f'{100 * LOSS_PLATEAU:.0f} %')
  return (f'training loss (mean of the last {LOSS_WINDOW} rounds) not below the unigram '
          f'entropy H = {baselines.entropy:.3f} by more than {100 * LOSS_PLATEAU:.0f} %')


def plateau_reason(runs: dict, metric: str, baselines: Baselines):
  """Rule 2 for a comparison: None when every run of {label: {seed: columns}}
  left its plateau, else the reason, naming the configurations still on it."""
  flat = []
  for label, by_seed in runs.items():
    stuck = sum(not left_plateau(c, metric, baselines) for c in by_seed.values())
    if stuck:
      flat.append(f'{label} in {stuck} of {len(by_seed)} seeds')
  if not flat:
    return None
  return f'{plateau_text(metric, baselines)}: ' + ', '.join(flat)


def came_apart(columns: dict, baselines: Baselines):
  """Rule 0: the round at which the run came apart (its windowed training loss
  above ln V after it had been below), or None."""
  below = False
  for round_, mean in _window_means(columns):
    if mean < baselines.uniform:
      below = True
    elif below:
      return int(round_)
  return None


def change_per_window(columns: dict, metric: str):
  """Rule 4: how much the least-squares line through the `metric` curve's last
  CONVERGENCE_WINDOW rounds changes over that window (NaN: fewer than 3 points)."""
  points = rr.points(columns, 'round', metric) if metric in columns else []
  if not points:
    return math.nan
  end = points[-1][0]
  window = [(r, v) for r, v in points if r > end - CONVERGENCE_WINDOW]
  if len(window) < 3:
    return math.nan
  xs, ys = zip(*window)
  mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
  slope = (sum((x - mx) * (y - my) for x, y in zip(xs, ys)) /
           sum((x - mx) ** 2 for x in xs))
  return slope * CONVERGENCE_WINDOW


def _unconverged(runs: dict, metric: str):
  """Rule 4 for a comparison: '' when every run of {label: {seed: columns}}
  converged, else which did not and by how much they still move."""
  moving = []
  for label, by_seed in runs.items():
    for seed, columns in sorted(by_seed.items()):
      change = change_per_window(columns, metric)
      if not abs(change) <= CONVERGED_CHANGE[metric]:
        moving.append(f'{label} seed {seed} {change:+.4f}')
  if not moving:
    return ''
  return (f'not converged: the last {CONVERGENCE_WINDOW} rounds\' line moves by more than '
          f'{CONVERGED_CHANGE[metric]:g}: ' + ', '.join(moving))


def paired(diffs):
  """(mean, half-width of the two-sided 95 % t interval, one-sided 97.5 % t lower bound)."""
  n = len(diffs)
  mean = sum(diffs) / n
  half = _T_TWO_SIDED_95[n - 1] * math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1)) / (
      math.sqrt(n))
  return mean, half, mean - half


def _difference(measure, mean, half, n):
  """The paired mean difference in words: positive means the claim's better
  configuration is ahead (for a loss, lower)."""
  what = ('lower by' if mean >= 0 else 'higher by') if measure.lower_is_better else (
      'ahead by' if mean >= 0 else 'behind by')
  return f'{what} {abs(mean):.4f} ± {half:.4f}, {n} seeds'


def superiority_rule(diffs, measure):
  """Rule 3, "better than": (verdict word, text) of the paired differences
  (positive: the claim's better configuration is ahead)."""
  mean, half, _ = paired(diffs)
  detail = _difference(measure, mean, half, len(diffs))
  if mean - half > 0:
    return SUPPORTED, f'{SUPPORTED} ({detail})'
  if mean + half < 0:
    return CONTRADICTED, f'{CONTRADICTED} ({detail})'
  return NO_VERDICT, f'{NO_VERDICT} (not significant: {detail})'


def non_inferiority_rule(diffs, measure):
  """Rule 3, "the same or improved": (verdict word, text); a non-significant
  difference is never enough."""
  mean, half, lower = paired(diffs)
  margin = MARGINS[measure.metric]
  detail = (f'{_difference(measure, mean, half, len(diffs))}; one-sided 97.5 % lower bound '
            f'{lower:+.4f}, margin {margin:g}')
  if lower > -margin:
    better = ', significantly better' if mean - half > 0 else ''
    return SUPPORTED, f'{SUPPORTED}: non-inferior{better} ({detail})'
  if mean + half < -margin:
    return CONTRADICTED, f'{CONTRADICTED}: worse by more than the margin ({detail})'
  worse = ', significantly worse' if mean + half < 0 else ''
  return NO_VERDICT, f'{NO_VERDICT} (non-inferiority not shown{worse}: {detail})'


def _values(runs, measure, seeds):
  return [measure.fn(runs[s]) for s in seeds]


def _diffs(a, b, measure, seeds):
  sign = -1.0 if measure.lower_is_better else 1.0
  return [sign * (x - y) for x, y in zip(_values(a, measure, seeds), _values(b, measure, seeds))]


def _without_round(columns, metric, round_):
  """`columns` with the `metric` value of round `round_` removed (NaN)."""
  out = dict(columns)
  out[metric] = [math.nan if r == round_ else v for r, v in zip(columns['round'], columns[metric])]
  return out


def single_evaluation_flag(rule, a, b, measure, seeds, word) -> str:
  """Rule 5: '' when the verdict `word` survives leaving out any one round of
  the measure's curve, else a flag naming the round and the verdict without it."""
  rounds = sorted({r for runs in (a, b) for s in seeds
                   for r, _ in rr.points(runs[s], 'round', measure.metric)})
  what = 'evaluation' if measure.metric == ACCURACY else 'round'
  for round_ in rounds:
    a_out = {s: _without_round(a[s], measure.metric, round_) for s in seeds}
    b_out = {s: _without_round(b[s], measure.metric, round_) for s in seeds}
    diffs = _diffs(a_out, b_out, measure, seeds)
    if any(math.isnan(d) for d in diffs):
      continue  # a run with no other evaluation: nothing left to compare
    other, _ = rule(diffs, measure)
    if other != word:
      return (f'; flagged: rests on a single {what} (without round {round_:g}: '
              f'{other})')
  return ''


def _apart(runs: dict, baselines: Baselines) -> dict:
  """Rule 0: {seed: 'label seed s (round r)'} of the runs that came apart."""
  out = {}
  for label, by_seed in runs.items():
    for seed, columns in by_seed.items():
      round_ = came_apart(columns, baselines)
      if round_ is not None:
        out.setdefault(seed, f'{label} seed {seed} (round {round_})')
  return out


def judge(rule, a: dict, b: dict, measure: Measure, baselines: Baselines, labels=('A', 'B'),
          horizon: Optional[Horizon] = None) -> str:
  """Rules 0–6 for runs {seed: columns} of configuration a against b under
  `rule` (superiority_rule or non_inferiority_rule)."""
  text = _judged(rule, a, b, measure, baselines, labels)
  return f'{horizon.label()}: {text}' if horizon else text


def _judged(rule, a, b, measure, baselines, labels):
  paired_seeds = sorted(set(a) & set(b))
  apart = _apart({labels[0]: {s: a[s] for s in paired_seeds},
                  labels[1]: {s: b[s] for s in paired_seeds}}, baselines)
  left_out = ('; left out, came apart: ' + ', '.join(apart[s] for s in sorted(apart))
              if apart else '')
  seeds = [s for s in paired_seeds if s not in apart]
  if len(seeds) < 2:
    return (f'{NO_VERDICT} ({len(seeds)} paired seed{"" if len(seeds) == 1 else "s"} '
            f'finished{left_out})')
  runs = {labels[0]: {s: a[s] for s in seeds}, labels[1]: {s: b[s] for s in seeds}}
  reason = plateau_reason(runs, measure.metric, baselines)
  if reason:
    return f'{NO_VERDICT} (plateau: {reason}{left_out})'
  word, text = rule(_diffs(a, b, measure, seeds), measure)
  moving = _unconverged(runs, measure.metric) if word == CONTRADICTED else ''
  if moving:  # what the test found, without its word
    found = text[len(CONTRADICTED):].lstrip(': ')
    found = found[1:-1] if found.startswith('(') and found.endswith(')') else found
    return f'{NO_VERDICT} ({moving}; {found}{left_out})'
  if word != NO_VERDICT:
    text += single_evaluation_flag(rule, a, b, measure, seeds, word)
  return text + left_out


def superiority(better, worse, measure, baselines, labels=('A', 'B'), horizon=None) -> str:
  """Whether runs `better` beat runs `worse` ({seed: columns}) on `measure`."""
  return judge(superiority_rule, better, worse, measure, baselines, labels, horizon)


def non_inferiority(new, old, measure, baselines, labels=('A', 'B'), horizon=None) -> str:
  """Whether runs `new` are the same as or better than runs `old` on `measure`."""
  return judge(non_inferiority_rule, new, old, measure, baselines, labels, horizon)
