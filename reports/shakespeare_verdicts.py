"""The verdict rules of reports/shakespeare.md, in one place.

A claim is checked by comparing two configurations seed by seed (the same seed
samples the same clients each round, so the difference is paired) on one
measure of their curves. The answer is "supported", "contradicted" or
"no verdict (reason)", by these rules, applied in this order:

1. Seeds. Fewer than 2 seeds finished by both configurations: no verdict.
2. Plateau (`left_plateau`). Every run of both configurations must have left
   its plateau on the curve the measure reads, else "no verdict (plateau)":
   - validation accuracy: some evaluation differs from the run's first one by
     more than ACCURACY_PLATEAU (0.5 points), up or down;
   - training loss: the mean of its last LOSS_WINDOW rounds differs from the
     uniform guess's loss ln V (V: the vocabulary) by more than LOSS_PLATEAU
     (2 %) of it.
   A run still on its plateau has no measured convergence yet: comparing it
   says when a run started to learn, not how fast it learns.
3. The test.
   - "better than" claims (`superiority`): the two-sided 95 % Student's t
     interval of the paired difference above 0 supports, below 0 contradicts;
     an interval holding 0 is "no verdict (not significant)".
   - "the same or improved" claims (`non_inferiority`): supported only when
     the one-sided 95 % t lower bound of (new − old) is above −margin
     (MARGINS: 1 accuracy point, 0.02 nats of training loss); contradicted
     when the two-sided interval lies wholly below −margin; otherwise "no
     verdict (non-inferiority not shown)". A non-significant difference never
     supports such a claim.
4. One evaluation. A verdict on validation accuracy is recomputed leaving out
   each evaluation round in turn (from every run); if leaving one out changes
   the verdict, the verdict is flagged as resting on that single evaluation.
"""

import dataclasses
import math
from collections.abc import Callable

import report_runner as rr  # pylint: disable=g-import-not-at-top

ACCURACY, LOSS = 'eval/accuracy', 'train/client_work/train/loss'
ACCURACY_PLATEAU = 0.005  # 0.5 points of accuracy (a fraction)
LOSS_PLATEAU = 0.02  # a fraction of ln V
# One round's training loss is the mean over its clients' minibatches, noisy
# from round to round: the rule reads the mean of the last few rounds.
LOSS_WINDOW = 5
# Non-inferiority margins. One accuracy point is the gap the decaying-K paper
# reads as "matched" (its Table 1, Shakespeare: 0.55 against 0.54).
MARGINS = {ACCURACY: 0.01, LOSS: 0.02}
SUPPORTED, CONTRADICTED, NO_VERDICT = 'supported', 'contradicted', 'no verdict'
# Student's t quantiles by degrees of freedom (seeds − 1).
_T_TWO_SIDED_95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365,
                   8: 2.306, 9: 2.262}
_T_ONE_SIDED_95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895,
                   8: 1.860, 9: 1.833}


@dataclasses.dataclass(frozen=True)
class Measure:
  """A number read from one run's curves (metrics.csv columns)."""
  heading: str
  fn: Callable[[dict], float]
  metric: str  # the curve it reads: ACCURACY (evaluations) or LOSS (every round)
  lower_is_better: bool = False


def left_plateau(columns: dict, metric: str, vocab_size: int) -> bool:
  """Rule 2 for one run: whether its `metric` curve left the plateau."""
  values = [v for _, v in rr.points(columns, 'round', metric)] if metric in columns else []
  if not values:
    return False
  if metric == ACCURACY:
    return any(abs(v - values[0]) > ACCURACY_PLATEAU for v in values[1:])
  tail = values[-LOSS_WINDOW:]
  uniform = math.log(vocab_size)
  return abs(sum(tail) / len(tail) - uniform) > LOSS_PLATEAU * uniform


def plateau_text(metric: str, vocab_size: int) -> str:
  """What "still on the plateau" means for `metric`, in words."""
  if metric == ACCURACY:
    return (f'validation accuracy within {100 * ACCURACY_PLATEAU:.1f} points of its first '
            'evaluation')
  return (f'training loss (mean of the last {LOSS_WINDOW} rounds) within '
          f'{100 * LOSS_PLATEAU:.0f} % of ln {vocab_size} = {math.log(vocab_size):.2f}')


def plateau_reason(runs: dict, metric: str, vocab_size: int):
  """Rule 2 for a comparison: None when every run of {label: {seed: columns}}
  left its plateau, else the reason, naming the configurations still on it."""
  flat = []
  for label, by_seed in runs.items():
    stuck = sum(not left_plateau(c, metric, vocab_size) for c in by_seed.values())
    if stuck:
      flat.append(f'{label} in {stuck} of {len(by_seed)} seeds')
  if not flat:
    return None
  return f'{plateau_text(metric, vocab_size)}: ' + ', '.join(flat)


def paired(diffs):
  """(mean, half-width of the two-sided 95 % t interval, one-sided 95 % t lower bound)."""
  n = len(diffs)
  mean = sum(diffs) / n
  sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
  return (mean, _T_TWO_SIDED_95[n - 1] * sd / math.sqrt(n),
          mean - _T_ONE_SIDED_95[n - 1] * sd / math.sqrt(n))


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
  detail = (f'{_difference(measure, mean, half, len(diffs))}; one-sided 95 % lower bound '
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
  """Rule 4: '' when the verdict `word` survives leaving out any one evaluation
  round, else a flag naming the round and the verdict without it."""
  rounds = sorted({r for runs in (a, b) for s in seeds
                   for r, _ in rr.points(runs[s], 'round', measure.metric)})
  for round_ in rounds:
    a_out = {s: _without_round(a[s], measure.metric, round_) for s in seeds}
    b_out = {s: _without_round(b[s], measure.metric, round_) for s in seeds}
    diffs = _diffs(a_out, b_out, measure, seeds)
    if any(math.isnan(d) for d in diffs):
      continue  # a run with no other evaluation: nothing left to compare
    other, _ = rule(diffs, measure)
    if other != word:
      return (f'; flagged: rests on a single evaluation (without round {round_:g}: '
              f'{other})')
  return ''


def judge(rule, a: dict, b: dict, measure: Measure, vocab_size: int, labels=('A', 'B')) -> str:
  """Rules 1–4 for runs {seed: columns} of configuration a against b under
  `rule` (superiority_rule or non_inferiority_rule)."""
  seeds = sorted(set(a) & set(b))
  if len(seeds) < 2:
    return f'{NO_VERDICT} ({len(seeds)} paired seed{"" if len(seeds) == 1 else "s"} finished)'
  reason = plateau_reason({labels[0]: {s: a[s] for s in seeds},
                           labels[1]: {s: b[s] for s in seeds}}, measure.metric, vocab_size)
  if reason:
    return f'{NO_VERDICT} (plateau: {reason})'
  word, text = rule(_diffs(a, b, measure, seeds), measure)
  if word != NO_VERDICT and measure.metric == ACCURACY:
    text += single_evaluation_flag(rule, a, b, measure, seeds, word)
  return text


def superiority(better, worse, measure, vocab_size, labels=('A', 'B')) -> str:
  """Whether runs `better` beat runs `worse` ({seed: columns}) on `measure`."""
  return judge(superiority_rule, better, worse, measure, vocab_size, labels)


def non_inferiority(new, old, measure, vocab_size, labels=('A', 'B')) -> str:
  """Whether runs `new` are the same as or better than runs `old` on `measure`."""
  return judge(non_inferiority_rule, new, old, measure, vocab_size, labels)
