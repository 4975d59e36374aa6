"""reports/reproduction.md says exactly what was measured.

* Every row of `render.exact_checks` names where its expected value
  comes from, and that is checked here: a value said to be printed in a seed
  (or SPEC) must be in the quoted text, and the quote must be in the seed
  file. A row whose expected value comes from the package's own code can only
  pass as PACKAGE (rendered "package vs package"); one that holds partly by
  construction must say so.
* One rounding rule, half away from zero at the printed precision.
* The headline and the claims tally are counted, not typed: the committed
  report's counts agree with its own rows, and its claims table and tally are
  what the stored sweep numbers (reports/reproduction_sweep.json) give.
"""

import os
import re

import pytest

from workflow.reproduction import claims
from workflow.reproduction import communication
from workflow.reproduction import flops_tables
from workflow.reproduction import paper_checks
from workflow.reproduction import provenance
from workflow.reproduction import render
from workflow.sweeps import stats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The seed texts and SPEC live beside the checkout (/work/shared for /work/main and
# for worktrees under /work/wt/); TFF_ADAPTIVE_SHARED overrides.
SHARED = next((d for d in (os.environ.get('TFF_ADAPTIVE_SHARED', ''),
                           os.path.join(os.path.dirname(ROOT), 'shared'),
                           os.path.join(os.path.dirname(os.path.dirname(ROOT)), 'shared'))
               if d and os.path.isdir(os.path.join(d, 'seeds'))), '')
SEEDS_DIR = os.path.join(SHARED, 'seeds')
SPEC_FILE = os.path.join(SHARED, 'SPEC.md')
REPORT = os.path.join(ROOT, 'reports', 'reproduction.md')
NUMBER = re.compile(r'\d+(?:[.,]\d+)*')


def _texts():
  """Whitespace-normalised seed texts and SPEC, by `Source.doc`; skip if absent."""
  if not os.path.isdir(SEEDS_DIR) or not os.path.exists(SPEC_FILE):
    pytest.skip(f'seed texts not found ({SEEDS_DIR}, {SPEC_FILE})')
  texts = {}
  for doc, name in provenance.SEED_FILES.items():
    with open(os.path.join(SEEDS_DIR, name)) as f:
      texts[doc] = ' '.join(f.read().split())
  with open(SPEC_FILE) as f:
    texts['SPEC'] = ' '.join(f.read().split())
  return texts


def provenance_errors(check: provenance.Check, texts: dict[str, str]) -> list[str]:
  """Why `check`'s expected value is not what its row says it is ([] if it is)."""
  src, errors = check.source, []
  rendered = render.checks_markdown([check])
  if src.kind in (provenance.SEED, provenance.SPEC):
    quote = ' '.join(src.quote.split())
    if not quote:
      errors.append('no quote')
    elif quote not in texts[src.doc]:
      errors.append(f'quote not in {src.doc}: {quote!r}')
    for printed in src.printed:
      if printed not in quote:
        errors.append(f'{printed!r} is not in the quote')
    if src.printed and not src.derived:
      # A printed, independent value: every number in the "paper" column is printed.
      shown = ' '.join(src.printed)
      for number in NUMBER.findall(check.paper):
        if number not in shown:
          errors.append(f'{number} in the paper column is not printed in the seed')
    if src.kind == provenance.SPEC and '(not in a paper)' not in rendered:
      errors.append('a SPEC number not labelled as such')
    if src.kind == provenance.SEED and not src.printed and '(statement)' not in rendered:
      errors.append('a statement without a number not labelled as such')
  elif src.kind == provenance.PACKAGE:
    if '(package vs package)' not in rendered:
      errors.append('package-vs-package row not labelled')
  elif src.kind == provenance.FIGURE:
    if check.status == provenance.MATCH:
      errors.append('a figure-only value cannot match')
    if '(figure only)' not in rendered:
      errors.append('figure-only row not labelled')
  else:
    errors.append(f'unknown source kind {src.kind!r}')
  if check.construction and 'by construction' not in rendered:
    errors.append('holds partly by construction but does not say so')
  if check.status == provenance.MISMATCH and not check.note:
    errors.append('a mismatch without a note')
  return errors


def _fake_costs(d=4810):
  """Process costs as measured on digits (the communication rows without TFF)."""
  multiples = {label: (down, up) for label, (_, _, down, up) in
               communication.SEED000_TABLE2.items()}
  multiples.update({'FedAdaGrad': (1, 1), 'DJA (AdaGrad-AdaGrad)': (2, 1),
                    'FedAda2 (SM3-AdaGrad)': (1, 1)})
  state = {'DJA (AdaGrad-AdaGrad)': d, 'FedAda2 (SM3-AdaGrad)': 276, 'Mimelite-SGDm': d}
  return {label: communication.ProcessCost(label, down * 32 * d + 64, up * 32 * d,
                                          state.get(label, 0), d)
          for label, (down, up) in multiples.items()}


@pytest.fixture(scope='module')
def sections():
  out = render.exact_checks(with_processes=False)
  out[communication.COMMUNICATION_SECTION] = communication.communication_checks(_fake_costs())
  return out


def test_every_expected_value_is_where_its_row_says(sections):
  texts = _texts()
  bad = {f'{c.section}: {c.item}': errors for rows in sections.values() for c in rows
         if (errors := provenance_errors(c, texts))}
  assert not bad


def test_provenance_check_catches_a_value_from_our_own_code():
  """docs/algorithms.md#ce-fedavg's 7.62 is eq. 3.1 evaluated by the package: it cannot pass as a printed number."""
  texts = _texts()
  ours = provenance.Check(
      'thesis §3.3.2', 'nominal ratio FedAvg (eq. 3.1), s = 0.6', '7.62×', '7.62×',
      provenance.MATCH, source=provenance.Source(provenance.SEED, '004', '7.62×', ('7.62',)))
  assert any('quote not in 004' in e for e in provenance_errors(ours, texts))
  # Quoting the real print but showing our value in the paper column fails too.
  shown = provenance.Check(
      'thesis §3.3.2', 'nominal ratio FedAvg (eq. 3.1), s = 0.6', '≈7× (7.62×)', '7.62×',
      provenance.MATCH, source=provenance.Source(
          provenance.SEED, '004', paper_checks._RATIO_QUOTES['fedavg'], ('7',)))  # pylint: disable=protected-access
  assert provenance_errors(shown, texts) == ['7.62 in the paper column is not printed in the seed']
  # Labelled as the package's own, the same row is accepted (and counted apart).
  labelled = provenance.Check(
      'package vs package', 'eq. 3.1 at s = 0.6', '7.62×', '7.62×', provenance.MATCH,
      source=provenance.Source(provenance.PACKAGE, 'compression'))
  assert provenance_errors(labelled, texts) == []
  assert provenance.kind_of(labelled) == provenance.PACKAGE_VS_PACKAGE


def test_rows_of_each_kind(sections):
  kinds = {}
  for rows in sections.values():
    for c in rows:
      kinds.setdefault(provenance.kind_of(c), []).append(c)
  assert len(kinds[provenance.FLOPS]) == 88
  assert {c.item for c in kinds[provenance.SPEC_NUMBER]} == {
      'CIFAR100 CNN |x| (trainable parameters)', 'CIFAR100 CNN forward FLOPs per example'}
  assert all(c.item.startswith('encoded MNIST-2NN upload')
             for c in kinds[provenance.PACKAGE_VS_PACKAGE])
  assert [c.item for c in kinds[provenance.CONSTRUCTION]] == [
      'Mimelite-SGDm: communication; client memory']
  derived = {c.item for c in kinds[provenance.DERIVED]}
  assert 'up to "3.8x" fewer SGD steps (FEMNIST K = 33)' in derived
  assert 'Mimelite-SGDm: download; upload' in derived  # |s| = |x| read into Table 6.2


def test_flops_cells_are_derived_from_few_quantities():
  """What the headline says of the FLOPs cells: K = 50 is 5× K = 10 except Mimelite's."""
  cells = {(c.k, c.task, c.algorithm, c.optimizer): c for c in flops_tables.flops_cells()}
  for (k, task, alg, opt), cell in cells.items():
    if k == 50 and alg != 'mimelite':
      assert cell.exact == pytest.approx(5 * cells[(10, task, alg, opt)].exact, rel=1e-12)
  assert len({c.task for c in cells.values()}) * len(flops_tables.FLOPS_QUANTITIES) == 12


def test_rounding_rule():
  match = provenance.printed_match
  assert not match(7.62, '7') and match(25.09, '25') and match(9.06, '9')
  assert not match(84.713, '84')  # 85 %: the paper truncated
  assert match(2.25, '2.3') and match(0.125, '0.13')  # half away from zero, not to even
  assert match(0.2601, '0.26') and match(0.0899, '0.090') and not match(0.144, '0.090')
  assert match(2183.4, '2180', significant=3) and not match(0.03354, '0.0350', significant=3)
  assert match(1_250_852, '1,250,852')


def test_headline_counts_come_from_the_rows(sections):
  tally = provenance.summary(sections)
  text = render.headline_markdown(sections)
  ind = tally[provenance.INDEPENDENT]
  assert text.startswith(f'**{ind.rows} rows recompute independent numbers printed in the '
                         f'papers: {ind.matched} match, {ind.mismatched} do not**')
  assert f'- 88 FLOPs cells (thesis Tables B.2/B.3 = FedGBO paper Tables 4/10): 86 match, 2 do not' \
      in text
  assert 'from 12 model quantities' in text
  assert sum(t.rows for t in tally.values()) == sum(len(r) for r in sections.values())


def _report_section_1():
  with open(REPORT) as f:
    text = f.read()
  return text[text.index('## 1. '):text.index('## 2. ')]


def test_committed_report_headline_agrees_with_its_rows():
  """The headline of reports/reproduction.md recounted from its own tables."""
  part = _report_section_1()
  labels = {'(derived: eq. B.16)': provenance.FLOPS, '(derived)': provenance.DERIVED,
            '(statement)': provenance.STATEMENT, '(not in a paper)': provenance.SPEC_NUMBER,
            '(partly by construction)': provenance.CONSTRUCTION,
            '(package vs package)': provenance.PACKAGE_VS_PACKAGE,
            '(figure only)': provenance.FIGURE_ONLY}
  counts = {k: [0, 0, 0] for k in provenance.KINDS}
  for line in part.split('\n'):
    cells = [c.strip() for c in re.split(r'(?<!\\)\|', line)[1:-1]]
    if len(cells) != 6 or cells[0] in ('source', '---'):
      continue
    kind = next((k for label, k in labels.items() if cells[0].endswith(label)),
                provenance.INDEPENDENT)
    counts[kind][0] += 1
    counts[kind][1] += cells[4] == provenance.MATCH
    counts[kind][2] += cells[4] == provenance.MISMATCH
  flops = re.findall(r'\d / [\d.]+ (✓|✗)', part)
  counts[provenance.FLOPS] = [len(flops), flops.count('✓'), flops.count('✗')]
  ind = counts[provenance.INDEPENDENT]
  assert (f'**{ind[0]} rows recompute independent numbers printed in the papers: {ind[1]} match, '
          f'{ind[2]} do not**') in part
  fl = counts[provenance.FLOPS]
  assert f'- {fl[0]} FLOPs cells (thesis Tables B.2/B.3 = FedGBO paper Tables 4/10): {fl[1]} match, ' \
      f'{fl[2]} do not' in part
  for kind in (provenance.DERIVED, provenance.STATEMENT, provenance.SPEC_NUMBER,
               provenance.CONSTRUCTION, provenance.PACKAGE_VS_PACKAGE,
               provenance.FIGURE_ONLY):
    assert re.search(rf'^- {counts[kind][0]} ', part, re.M), kind


def test_parity_claims_count_by_their_means():
  high = stats.MeanCI(0.9502, 0.0113, 5)
  low = stats.MeanCI(0.9497, 0.0177, 5)
  verdict = claims._verdict(low, high, True, 'no_worse')  # pylint: disable=protected-access
  assert verdict.startswith('does not hold by the means')
  assert claims.verdict_class(verdict) == claims.FAILS_NS


def test_claims_tally_of_the_committed_report():
  """By the means 8 hold, 8 fail, 1 tie; 3 supported, 3 contradicted."""
  with open(REPORT) as f:
    text = f.read()
  data = claims.load_sweep_data(render.sweep_data_path(REPORT))
  verdicts = claims.verdicts(data.measured)
  # The committed claims table is what the stored numbers give, verdicts included.
  assert render.claims_markdown(data.measured, data.target, data.metric) in text
  classes = [claims.verdict_class(v) for v in verdicts]
  assert classes.count(claims.HOLDS_SUPPORTED) == 3
  assert classes.count(claims.HOLDS_NS) == 5
  assert classes.count(claims.TIE) == 1
  assert classes.count(claims.FAILS_NS) == 5
  assert classes.count(claims.FAILS_SIGNIFICANT) == 3
  assert claims.claims_tally_markdown(verdicts, 5) in text
  assert ('By the means, 8 of 17 claims hold on this task, 8 do not and 1 is a tie. '
          'Supported beyond the noise: 3 (2 by disjoint intervals, 1 because the baseline '
          'misses the target on some seeds); contradicted by disjoint intervals: 3') in text


def test_report_without_runs_renders_the_stored_sweep_data(tmp_path):
  """No runs: section 2 comes from the stored numbers, verdicts computed from them."""
  data = claims.load_sweep_data(render.sweep_data_path(REPORT))
  out_md = str(tmp_path / 'report.md')
  key = claims.key(claims.CLAIMS[0])  # FedAdam vs FedAvg, a tie within the noise
  fedavg = data.measured[key][1]
  data.measured[key] = (stats.MeanCI(fedavg.mean + 0.1, 0.001, 5), fedavg)
  claims.save_sweep_data(render.sweep_data_path(out_md), data)
  lines = render.sweep_markdown(out_md, str(tmp_path / 'no_runs'), target=0.85,
                                select_rule='last_mean:3', metric='eval/accuracy',
                                sweep_minutes=None, grid_file=str(tmp_path / 'no_grid.txt'),
                                progress=lambda m: None)
  text = '\n'.join(lines)
  assert text.startswith('*This section comes from the last run of the sweep')
  assert data.sweep_tables in text
  row = next(l for l in text.splitlines() if l.startswith('| FedOpt (Reddi et al. 2021) |'))
  assert row.endswith('| holds (CIs disjoint) |')
  assert 'Supported beyond the noise: 4' in text  # the tally follows the numbers


def test_report_without_runs_or_data_says_so(tmp_path):
  lines = render.sweep_markdown(str(tmp_path / 'r.md'), str(tmp_path / 'no_runs'), target=0.85,
                                select_rule='last_mean:3', metric='eval/accuracy',
                                sweep_minutes=None, grid_file=str(tmp_path / 'no_grid.txt'),
                                progress=lambda m: None)
  assert lines[0].startswith('No sweep results: ')
