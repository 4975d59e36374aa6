"""The papers' qualitative claims, checked on the sweep of reports/reproduction_grid.txt.

`CLAIMS` is the table of claims (which group should beat which, on what).
`measure_claims` reads, from the sweep's results, the two numbers each claim
compares (means with 95% intervals); `save_sweep_data` stores them, with the
sweep's tables as rendered from the runs, in reports/reproduction_sweep.json,
so the report can be regenerated without the runs. Verdicts and their tally
are always computed from those numbers (`verdicts`), never read back from a
rendered report.
"""

import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from workflow.reporting import report
from workflow.sweeps import stats

@dataclasses.dataclass(frozen=True)
class Claim:
  source: str
  claim: str
  better: str  # group expected to win
  worse: str
  quantity: str  # 'score' or a report.COST_AXES key (lower is better)
  # 'better': `better` must win; 'no_worse': the claim is parity ("as accurate
  # as"), which holds unless `better` is significantly worse.
  kind: str = 'better'


CLAIMS = (
    Claim('FedOpt (Reddi et al. 2021)', 'an adaptive server optimiser (FedAdam) improves on FedAvg',
          'fedadam', 'fedavg', 'score'),
    Claim('FedGBO (Mills et al. 2022)', 'FedGBO (Adam) beats FedAvg, at the same upload per round',
          'fedgbo_adam', 'fedavg', 'score'),
    Claim('FedGBO (Mills et al. 2022)', 'FedGBO reaches the target in fewer rounds than FedAvg',
          'fedgbo_adam', 'fedavg', 'round'),
    Claim('FedGBO (Mills et al. 2022)', 'FedGBO beats AdaptiveFedOpt (FedAdam)', 'fedgbo_adam', 'fedadam',
          'score'),
    Claim('FedGBO (Mills et al. 2022)', 'FedGBO needs less upload than MFL to reach the target (MFL-Adam '
          'uploads 3|x| per round)', 'fedgbo_adam', 'mfl_adam', 'cost/cumulative_upload_bits'),
    Claim('FedGBO (Mills et al. 2022)', 'MFL has fast initial convergence (rounds to target vs FedAvg)',
          'mfl_adam', 'fedavg', 'round'),
    Claim('FedAda2 (Lee et al. 2024)', 'joint adaptivity without preconditioner communication (FedAda2, '
          'SM3 clients) beats server-only FedAdam at the same communication', 'fedada2',
          'fedadam', 'score'),
    Claim('thesis ch. 3 (CE-FedAvg)', 'CE-FedAvg reaches the target in fewer rounds than FedAvg '
          'with the same compression (s = 0.9)', 'ce_fedavg', 'fedavg_topk', 'round'),
    Claim('thesis ch. 3 (CE-FedAvg)', 'CE-FedAvg uploads less in total than compressed FedAvg to '
          'reach the target', 'ce_fedavg', 'fedavg_topk', 'cost/cumulative_upload_bits'),
    Claim('thesis ch. 3 (CE-FedAvg)', 'CE-FedAvg beats compressed FedAvg in accuracy',
          'ce_fedavg', 'fedavg_topk', 'score'),
    Claim('FedGBO (Mills et al. 2022)', 'FedGBO (SGDm) beats FedAvg', 'fedgbo_sgdm', 'fedavg', 'score'),
    Claim('FedGBO (Mills et al. 2022)', 'FedGBO (RMSProp) beats FedAvg', 'fedgbo_rmsprop', 'fedavg',
          'score'),
    Claim('FedGBO (Mills et al. 2022)', 'FedGBO (SGDm) needs less upload than Mimelite (SGDm, uploads '
          '2|x|) to reach the target', 'fedgbo_sgdm', 'mimelite_sgdm',
          'cost/cumulative_upload_bits'),
    Claim('FedGBO (Mills et al. 2022)', 'FedGBO (SGDm) is at least as accurate as Mimelite (SGDm)',
          'fedgbo_sgdm', 'mimelite_sgdm', 'score', 'no_worse'),
    Claim('FedAda2 (Lee et al. 2024)', 'FedAda2 (no preconditioner sent, SM3 clients) is as accurate as '
          'DJA (which sends the server v, 2|x| down)', 'fedada2', 'dja', 'score', 'no_worse'),
    Claim('decaying K (Mills et al. 2023)', 'decaying K reaches at least the accuracy of decaying γ',
          'k_decay', 'lr_decay', 'score', 'no_worse'),
    Claim('decaying K (Mills et al. 2023)', 'decaying K reaches the target with fewer client FLOPs (steps) '
          'than constant K', 'k_decay', 'fedavg', 'cost/cumulative_client_flops'),
)


def _disjoint(a, b) -> bool:
  return (math.isfinite(a.half_width) and math.isfinite(b.half_width) and
          (a.low > b.high or b.low > a.high))


def _verdict(a, b, higher_is_better: bool, kind: str = 'better') -> str:
  """Compares two stats.MeanCI by the means, then says whether the CIs are disjoint.

  'better' claims need `a` to win; parity claims ('no_worse', "as accurate
  as") hold by the means when `a` is at least as good. Either way only
  disjoint intervals are evidence.
  """
  if a.n == 0 or b.n == 0:
    return 'cannot tell (missing results)'
  if a.mean == b.mean:
    return 'tie'
  disjoint = _disjoint(a, b)
  a_better = a.mean > b.mean if higher_is_better else a.mean < b.mean
  if kind == 'no_worse':
    if a_better:
      return 'holds (not worse: ' + ('better, CIs disjoint)' if disjoint else 'CIs overlap)')
    return ('does not hold (significantly worse: CIs disjoint)' if disjoint else
            'does not hold by the means (worse; CIs overlap: parity not rejected)')
  strength = 'CIs disjoint' if disjoint else 'CIs overlap: not significant'
  return f'{"holds" if a_better else "does not hold"} ({strength})'


# How a verdict counts: by the means (holds / fails / tie) and whether the data
# support it beyond the noise.
HOLDS_SUPPORTED = 'holds, supported'  # disjoint CIs, or only the baseline misses the target
HOLDS_NS = 'holds by the means, not significant'
TIE = 'tie'
FAILS_NS = 'fails by the means, not significant'
FAILS_SIGNIFICANT = 'fails, CIs disjoint'
CANNOT_TELL = 'cannot tell'


def verdict_class(verdict: str) -> str:
  if verdict.startswith('cannot tell'):
    return CANNOT_TELL
  if verdict == 'tie':
    return TIE
  if verdict.startswith('holds'):
    supported = 'CIs disjoint' in verdict or 'baseline misses' in verdict
    return HOLDS_SUPPORTED if supported else HOLDS_NS
  if 'CIs disjoint' in verdict or 'only the baseline reaches' in verdict:
    return FAILS_SIGNIFICANT
  return FAILS_NS


def claims_tally_markdown(verdicts: Sequence[str], num_seeds: int) -> str:
  """The tally the claims table supports, every count from `verdicts`."""
  classes = [verdict_class(v) for v in verdicts]
  n = {k: classes.count(k) for k in (HOLDS_SUPPORTED, HOLDS_NS, TIE, FAILS_NS, FAILS_SIGNIFICANT,
                                     CANNOT_TELL)}
  held, failed = n[HOLDS_SUPPORTED] + n[HOLDS_NS], n[FAILS_NS] + n[FAILS_SIGNIFICANT]
  disjoint_for = sum(verdict_class(v) == HOLDS_SUPPORTED and 'CIs disjoint' in v for v in verdicts)
  missed = n[HOLDS_SUPPORTED] - disjoint_for
  text = (f'By the means, {held} of {len(verdicts)} claims hold on this task, {failed} do not'
          f'{f" and {n[TIE]} is a tie" if n[TIE] == 1 else f" and {n[TIE]} are ties" if n[TIE] else ""}'
          f'{f" ({n[CANNOT_TELL]} cannot be told)" if n[CANNOT_TELL] else ""}. Supported beyond '
          f'the noise: {n[HOLDS_SUPPORTED]} ({disjoint_for} by disjoint intervals'
          f'{f", {missed} because the baseline misses the target on some seeds" if missed else ""}'
          f'); contradicted by disjoint intervals: {n[FAILS_SIGNIFICANT]}; the other '
          f'{n[HOLDS_NS] + n[FAILS_NS]} differences ({n[HOLDS_NS]} for a claim, {n[FAILS_NS]} '
          'against, parity claims included by their means) are not significant: with '
          f'{num_seeds} seeds the 95% t-interval has a half-width of {stats_t(num_seeds):.1f} '
          'standard errors.')
  return text


Measured = Optional[Any]  # stats.MeanCI (scores) or report.Reach (costs to the target)


def key(claim: Claim) -> str:
  """The claim's key in the stored data: what it compares, not its wording."""
  return f'{claim.better} vs {claim.worse}: {claim.quantity}'


def measure_claims(groups, claims: Sequence[Claim] = CLAIMS
                   ) -> dict[str, tuple[Measured, Measured]]:
  """groups: report.group_results(...). {key: (claimed better, baseline)}; None if missing."""
  out = {}
  for c in claims:
    a, b = groups.get(c.better), groups.get(c.worse)
    if a is None or b is None:
      out[key(c)] = (None, None)
    elif c.quantity == 'score':
      out[key(c)] = (a.best.score, b.best.score)
    else:
      out[key(c)] = (a.reaches[c.quantity], b.reaches[c.quantity])
  return out


def verdict(claim: Claim, a: Measured, b: Measured) -> str:
  """The verdict on one claim from its two measured numbers."""
  if a is None or b is None:
    return 'cannot tell (group missing)'
  if claim.quantity == 'score':
    return _verdict(a, b, True, claim.kind)
  return _reach_verdict(a, b)


def verdicts(measured: Mapping[str, tuple[Measured, Measured]],
             claims: Sequence[Claim] = CLAIMS) -> list[str]:
  return [verdict(c, *measured[key(c)]) for c in claims]


def format_measured(claim: Claim, value: Measured) -> str:
  """A claim's number as the claims table shows it."""
  if value is None:
    return '—'
  if claim.quantity == 'score':
    return value.format(4)
  return value.format(3, claim.quantity.startswith('cost/'))


def _reach_verdict(ra, rb) -> str:
  """Verdict on a cost to reach the target (lower is better): report.Reach a vs b."""
  if ra.reached < ra.seeds and rb.reached == rb.seeds:
    return 'does not hold (only the baseline reaches the target on every seed)'
  if rb.reached < rb.seeds and ra.reached == ra.seeds:
    return 'holds (the baseline misses the target on some seed)'
  if ra.reached == 0 and rb.reached == 0:
    return 'cannot tell (neither reaches the target)'
  return _verdict(ra.cost, rb.cost, False)


# ---- reports/reproduction_sweep.json: the sweep's part of the report as data ----

def _encode(value: Measured) -> Optional[dict[str, Any]]:
  if value is None:
    return None
  ci = value.cost if isinstance(value, report.Reach) else value
  out = {'mean': None if math.isnan(ci.mean) else ci.mean,
         'half_width': None if math.isnan(ci.half_width) else ci.half_width, 'n': ci.n}
  if isinstance(value, report.Reach):
    out.update(reached=value.reached, seeds=value.seeds)
  return out


def _decode(data: Optional[Mapping[str, Any]]) -> Measured:
  if data is None:
    return None
  nan = lambda x: math.nan if x is None else float(x)
  ci = stats.MeanCI(nan(data['mean']), nan(data['half_width']), int(data['n']))
  if 'reached' in data:
    return report.Reach(ci, int(data['reached']), int(data['seeds']))
  return ci


@dataclasses.dataclass
class SweepData:
  """What section 2 of the report needs from the sweep's runs.

  sweep_tables: the setup and the tables as rendered from the runs (markdown).
  measured: {claim key: (claimed better, baseline)}.
  """
  target: float
  metric: str
  seeds: list[int]
  fedavg_score: Optional[float]
  sweep_tables: str
  measured: dict[str, tuple[Measured, Measured]]
  about: str = ''


def save_sweep_data(path: str, data: SweepData) -> None:
  out = {'about': data.about, 'target': data.target, 'metric': data.metric,
         'seeds': list(data.seeds), 'fedavg_score': data.fedavg_score,
         'sweep_tables': data.sweep_tables,
         'claims': {k: {'better': _encode(a), 'baseline': _encode(b)}
                    for k, (a, b) in data.measured.items()}}
  with open(path + '.tmp', 'w') as f:
    json.dump(out, f, indent=1, ensure_ascii=False)
    f.write('\n')
  os.replace(path + '.tmp', path)


def load_sweep_data(path: str) -> Optional[SweepData]:
  """The stored sweep data, or None if there is none."""
  if not os.path.exists(path):
    return None
  with open(path) as f:
    raw = json.load(f)
  measured = {k: (_decode(v['better']), _decode(v['baseline'])) for k, v in raw['claims'].items()}
  missing = [key(c) for c in CLAIMS if key(c) not in measured]
  if missing:
    raise ValueError(f'{path} has no measurements for the claims {missing}')
  return SweepData(raw['target'], raw['metric'], list(raw['seeds']), raw.get('fedavg_score'),
                   raw['sweep_tables'], measured, raw.get('about', ''))


def stats_t(num_seeds: int) -> float:
  return stats.t_quantile(0.95, num_seeds - 1) if num_seeds > 1 else math.inf

