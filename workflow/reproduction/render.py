"""reports/reproduction.md: every figure of the five source papers checkable without their datasets.

Section 1 recomputes published numbers with the package's code and puts the
paper's value next to ours (`paper_checks`, `flops_tables`, `communication`;
where each expected value comes from and the one rounding rule:
`provenance`; docs/algorithms.md#errata settles the papers' errata). Section 2 checks the
papers' qualitative claims on the sweep of reports/reproduction_grid.txt
(`claims`): from the sweep's runs when they are there, which also stores what
the section needs in reports/reproduction_sweep.json, and otherwise from that
file. bin/report.py --reproduction writes the report with
`write_reproduction_report`.
"""

import os
from collections.abc import Callable, Sequence
from typing import Optional

from workflow.reporting import report
from workflow.reproduction import claims
from workflow.reproduction import communication
from workflow.reproduction import flops_tables
from workflow.reproduction import paper_checks
from workflow.reproduction import provenance as prov
from workflow.sweeps import selection
from workflow.sweeps import sweep

SWEEP_DATA = 'reports/reproduction_sweep.json'
SWEEP_HEADING = '## 2. Qualitative findings on the offline task'
CLAIMS_HEADING = "### The papers' claims on this task"


def exact_checks(with_processes: bool = True,
                 progress: Callable[[str], None] = lambda m: None,
                 models: Optional[dict] = None) -> dict[str, list[prov.Check]]:
  """Every check by section name; `with_processes=False` skips the TFF processes."""
  models = models or flops_tables.flops_models()
  sections = {
      'Decaying local steps (the decaying-K paper, thesis ch. 5)': paper_checks.decaying_k_step_fractions() +
                                                       paper_checks.thesis_table_5_4(),
      'Model size (docs/algorithms.md#costs: no paper prints these numbers)': paper_checks.model_size_checks(models),
      'Compression (thesis ch. 3)': paper_checks.compression_checks(),
      'Quadratic toy (decaying-K paper §3)': paper_checks.quadratic_checks(),
  }
  if with_processes:
    sections[communication.COMMUNICATION_SECTION] = communication.communication_checks(
        communication.measure_process_costs(progress=progress))
  sections[flops_tables.FLOPS_SECTION] = flops_tables.flops_checks(
      flops_tables.flops_cells(models))
  return sections


def headline_markdown(sections: dict[str, list[prov.Check]]) -> str:
  """The headline of section 1, every count from `provenance.summary(sections)`."""
  t = prov.summary(sections)
  ind, fl, der, st, spec, cons, pkg, fig = (t[kind] for kind in prov.KINDS)
  flops_quantities = len(flops_tables.FLOPS_QUANTITIES) * len(flops_tables.FLOPS_TASKS)

  def ok(x: prov.Tally, word: str = 'match') -> str:
    return f'{x.matched} {word}' + (
        f', {x.mismatched} {"does" if x.mismatched == 1 else "do"} not' if x.mismatched else '')

  lines = [
      f'**{ind.rows} rows recompute independent numbers printed in the papers: '
      f'{ok(ind)}** (each ✗ explained in its row). {prov.ROUNDING_RULE}; the column '
      '"source" names where the expected value is printed, and the tests find each quoted '
      'print in the papers\' texts.', '',
      'Besides these, and not counted with them:', '',
      f'- {fl.rows} FLOPs cells (thesis Tables B.2/B.3 = FedGBO paper Tables 4/10): '
      f'{ok(fl)}. They are not {fl.rows} independent numbers: the papers compute '
      f'them with one formula (eq. B.16) from {flops_quantities} model quantities '
      f'({", ".join(flops_tables.FLOPS_QUANTITIES)} of {len(flops_tables.FLOPS_TASKS)} tasks), '
      'and every K = 50 cell but Mimelite\'s is 5× its K = 10 cell before rounding.',
      f'- {der.rows} printed values that the papers derive from other printed values '
      f'("3.8x" = 1/0.26, the "≈ 1 : 2.3" upload ratio, Table 6.2\'s symbols read as multiples '
      f'of |x|): {ok(der)}.',
      f'- {st.rows} printed statements without a number (x̃* = x* at K = 1 and grows '
      f'with K; decaying K reaches x*): {ok(st, "hold")}.',
      f'- {spec.rows} numbers from docs/algorithms.md#costs that no paper prints (the CIFAR100 CNN\'s |x| '
      f'and forward FLOPs; the FedGBO paper gives only its layers): {ok(spec)}.',
      f'- {cons.rows} row{"" if cons.rows == 1 else "s"} that '
      f'hold{"s" if cons.rows == 1 else ""} partly by construction (Mimelite\'s ∇f '
      f'in client memory, labelled in the row): {ok(cons)}.',
      f'- {pkg.rows} package-vs-package rows (our Golomb encoder against our '
      f'eqs. 3.1-3.2; no published number): {ok(pkg, "agree within 3%")}.',
      f'- {fig.rows} values the papers show only in a figure (ours for reference).',
  ]
  return '\n'.join(lines)


def _source_cell(check: prov.Check) -> str:
  kind = prov.kind_of(check)
  label = {prov.FLOPS: ' (derived: eq. B.16)', prov.DERIVED: ' (derived)',
           prov.STATEMENT: ' (statement)', prov.SPEC_NUMBER: ' (not in a paper)',
           prov.CONSTRUCTION: ' (partly by construction)',
           prov.PACKAGE_VS_PACKAGE: ' (package vs package)', prov.FIGURE_ONLY: ' (figure only)'}
  return check.section + label.get(kind, '')


def cell(text: str) -> str:
  """Markdown table cell: a literal | (as in |x|) would end the cell."""
  return str(text).replace('|', '\\|')


def checks_markdown(checks: Sequence[prov.Check]) -> str:
  lines = ['| source | item | paper | ours | | note |', '|---|---|---|---|---|---|']
  previous_note = None
  for c in checks:
    note = c.note
    if c.construction:
      note = (note + '; ' if note else '') + 'by construction: ' + c.construction
    if c.source.derived and prov.kind_of(c) == prov.DERIVED:
      note = (note + '; ' if note else '') + 'derived: ' + c.source.derived
    shown = '″' if note and note == previous_note else note  # ditto for repeats
    previous_note = note
    lines.append('| ' + ' | '.join(cell(x) for x in (_source_cell(c), c.item, c.paper, c.ours,
                                                       c.status, shown)) + ' |')
  return '\n'.join(lines)



def claims_markdown(measured, target: float, metric: str) -> str:
  """The claims table: each claim's two numbers and the verdict they give."""
  lines = ['| source | claim | measured | claimed better | baseline | verdict |',
           '|---|---|---|---|---|---|']
  for c in claims.CLAIMS:
    a, b = measured[claims.key(c)]
    what = ('score' if c.quantity == 'score' else
            f'{report.COST_AXES[c.quantity]} to {metric} ≥ {target:g}')
    lines.append('| ' + ' | '.join(cell(x) for x in (
        c.source, c.claim, what, f'{c.better}: {claims.format_measured(c, a)}',
        f'{c.worse}: {claims.format_measured(c, b)}', claims.verdict(c, a, b))) + ' |')
  return '\n'.join(lines)


NOT_CHECKABLE = (
    'FedGBO paper Tables 3-8 / thesis Tables 6.3-6.5 (accuracies, rounds, uploads and FLOPs to '
    'accuracy on CIFAR100, Sent140, FEMNIST, Shakespeare): need the datasets and 1000s of rounds.',
    'decaying-K paper Table 1 error/accuracy rows and decaying-K paper Figure 1 curves beyond the fixed points: '
    'need StackOverflow / FEMNIST / Shakespeare (the quadratic curves are simulated above).',
    'the FedAda2 paper DP StackOverflow ε: the noise multiplier, sampling rate, rounds and ε are missing '
    'from the extracted text, so there is no printed number to check `accounting.privacy` '
    'against; FedAda2 paper Tables 3-5 (tuned hyperparameters) are settings, not results.',
    'FedOpt (Reddi et al. 2021): every table is an accuracy on a TFF dataset.',
    'thesis Table 5.4 K_r-error and K_r-step rows: depend on the training losses and plateau '
    'times of the real runs.',
    'thesis Tables 3.1-3.3 (rounds to target for CE-FedAvg vs FedAvg), 4.x (MTFL user '
    'accuracy): need MNIST / CIFAR10 runs.',
)


INTRO = ['# Reproduction report', '',
         'Regenerate everything (the sweep resumes; finished trials are skipped):', '',
         '    bin/reproduce_report.sh', '',
         'which runs `bin/sweep.py --spec=reports/reproduction_grid.txt --num_seeds=5 '
         '--max_parallel=2 --notogether --sweep_dir=runs/reproduction` (each trial its own '
         'process, as the committed runs were) and then `.venv/bin/python '
         'bin/report.py --reproduction --sweep_dir=runs/reproduction '
         '--out=reports/reproduction.md`.', '']

ELSEWHERE = [
    '## 3. Elsewhere, and not done here', '',
    '- MTFL\'s private choices (thesis ch. 4): `reports/mtfl.md` (one seed, Table 4.2 '
    'style); decaying K in depth (all K schedules, the quadratic toy, simulated time): '
    '`reports/schedules.md`; FedAda2 vs DJA with memory and DP: `reports/fedada2.md`; '
    'CE-FedAvg Tables 3.1-3.3: `reports/ce_fedavg.md`.',
    '- The qualitative sweep covers `digits` only, not `synthetic` (`reports/'
    'algorithms.md` and `reports/fedada2.md` have single-seed `synthetic` runs).',
    '- The papers\' own runs need their datasets: `bin/train.py --preset=<paper>:<task>` '
    '(`workflow/flags/presets.py`, the rows of `docs/tasks.md`) sets each published '
    'setting, e.g. `--preset=fedgbo:femnist --data_dir=...`.', '']


def write_reproduction_report(out_md: str, sweep_dir: str, *, target: float = 0.85,
                              select_rule: str = 'last_mean:3', metric: str = 'eval/accuracy',
                              with_processes: bool = True, sweep_minutes: Optional[float] = None,
                              grid_file: str = 'reports/reproduction_grid.txt',
                              progress: Callable[[str], None] = lambda m: None) -> str:
  """Writes reports/reproduction.md (+ its figure; + the sweep's data when its runs are there).

  The sweep's part is stored beside the report (`<out>_sweep.json`) whenever
  the runs are read, and rendered from that file when they are not.
  """
  progress('exact figures')
  models = flops_tables.flops_models()
  sections = exact_checks(with_processes, progress=progress, models=models)
  out = INTRO + exact_markdown(sections, flops_tables.flops_cells(models))
  out += ['', SWEEP_HEADING, '']
  out += sweep_markdown(out_md, sweep_dir, target=target, select_rule=select_rule,
                        metric=metric, sweep_minutes=sweep_minutes, grid_file=grid_file,
                        progress=progress)
  out += [''] + ELSEWHERE
  text = '\n'.join(out)
  os.makedirs(os.path.dirname(os.path.abspath(out_md)), exist_ok=True)
  with open(out_md, 'w') as f:
    f.write(text)
  return text


def exact_markdown(sections: dict[str, list[prov.Check]],
                   cells: Sequence[flops_tables.FlopsCell]) -> list[str]:
  """Section 1: the headline, each section's table, the FLOPs tables, what is not checkable."""
  flops_section = flops_tables.FLOPS_SECTION
  out = ['## 1. Exact figures recomputed by the package', '', headline_markdown(sections), '',
         'docs/algorithms.md#errata settles the papers\' errata.', '']
  for title, rows in sections.items():
    if title != flops_section:
      out += [f'### {title}', '', checks_markdown(rows), '']
  out += [f'### {flops_section}', ''] + _flops_markdown(sections[flops_section], cells)
  out += ['', '### Not checkable without the datasets', '']
  return out + [f'- {item}' for item in NOT_CHECKABLE]


def _flops_markdown(rows: Sequence[prov.Check], cells: Sequence[flops_tables.FlopsCell]) -> list[str]:
  tally = prov.summary({flops_tables.FLOPS_SECTION: rows})[prov.FLOPS]
  quantities = len(flops_tables.FLOPS_QUANTITIES) * len(flops_tables.FLOPS_TASKS)
  out = ['Cells are `paper / ours` in 10⁸ FLOPs, ours rounded half away from zero to 3 '
         'significant figures (the tables\' stated precision), from '
         '`accounting.flops.client_flops` (eq. B.16) on the Keras models: the CIFAR100 and '
         'FEMNIST CNNs of `tasks/models/paper_cnns.py`, Sent140\'s linear model and '
         'Shakespeare\'s GRU as FedGBO paper Appendix B defines them. B = 32 (8 for Sent140), '
         'n = 100 / 15 / 170 / 5573 samples per client (Mimelite\'s full-batch pass). The '
         'cells are derived numbers: the papers compute all of them with eq. B.16 from '
         f'{quantities} model quantities, so {tally.matched} '
         f'matching cells confirm those quantities and the formula, not {tally.matched} '
         'independent results. The printed cells are quoted from thesis Tables B.2/B.3, and '
         'Shakespeare\'s K = 50 MFL row, which the thesis\' text lost, from FedGBO paper Table 10.',
         '', '**K = 10 (Table B.2)**', '', flops_tables.flops_table_markdown(cells, 10), '',
         '**K = 50 (Table B.3)**', '', flops_tables.flops_table_markdown(cells, 50), '',
         f'{tally.matched} of {tally.rows} cells match.']
  if any(not c.matches for c in cells):
    out += ['', f'¹ {flops_tables.SENT140_ERRATUM}.']
  return out


def sweep_data_path(out_md: str) -> str:
  return os.path.splitext(out_md)[0] + '_sweep.json'


def sweep_markdown(out_md: str, sweep_dir: str, *, target: float, select_rule: str, metric: str,
                   sweep_minutes: Optional[float], grid_file: str,
                   progress: Callable[[str], None]) -> list[str]:
  """Section 2 from the sweep's runs (storing its data), else from the stored data."""
  path = sweep_data_path(out_md)
  try:
    results, _ = selection.load_results(sweep_dir, sweep.parse_spec_file(grid_file))
    missing = 'no finished trials'
  except sweep.SpecError as e:
    results, missing = [], str(e)
  if results:
    data = sweep_data_from_runs(results, out_md, target=target, select_rule=select_rule,
                                metric=metric, sweep_dir=sweep_dir, sweep_minutes=sweep_minutes,
                                grid_file=grid_file)
    claims.save_sweep_data(path, data)
    return claims_section(data)
  data = claims.load_sweep_data(path)
  if data is None:
    return [f'No sweep results: {missing}.']
  progress(f'claims from {path}')
  return [stored_sweep_note(path), ''] + claims_section(data)


def stored_sweep_note(path: str) -> str:
  return ('*This section comes from the last run of the sweep: its runs were not available when '
          'the report was regenerated, so the tables and the numbers the claims compare are '
          f'those stored from that run in `{os.path.basename(path)}`; the verdicts and the tally '
          'under the claims table are computed from those numbers.*')


def sweep_data_from_runs(results, out_md: str, *, target: float, select_rule: str, metric: str,
                         sweep_dir: str, sweep_minutes: Optional[float],
                         grid_file: str) -> claims.SweepData:
  """The sweep's tables (and figure) rendered from the runs, and the claims' numbers."""
  rule = selection.parse_rule(select_rule, metric, 'max')
  summaries = selection.summarize(results, rule)
  groups = report.group_results(summaries, rule, target)
  seeds = sorted({r.trial.seed for r in results})
  fig = os.path.splitext(out_md)[0] + '_curves.png'
  report.plot_mean_curves(report.best_curves(summaries, rule, tuple(report.COST_AXES)),
                          metric, fig, 'digits: selected configuration per algorithm, '
                          f'mean ± 95% CI over {len(seeds)} seeds')
  tables = '\n'.join([
      f'Setup (`{grid_file}`): the `digits` task (scikit-learn\'s 1,797 8×8 digits, '
      'Dirichlet(0.5) label split over the task\'s clients, MLP with '
      '|x| = 4,810), 10 clients per round, exactly K = 10 local steps of batch 10, '
      '20 rounds, evaluation every 2 rounds. Each algorithm gets a two- or three-point '
      f'grid on its key learning rate (see the grid file for why); {len(results)} trials, '
      f'seeds {", ".join(map(str, seeds))}.'
      f'{_timing_text(results, sweep_dir, sweep_minutes)}', '',
      report.markdown_tables(summaries, rule, target), '',
      f'![curves]({os.path.basename(fig)})', '',
      'Curves: mean over seeds (band: 95% CI) of the selected configuration, against '
      'rounds, total uploaded bits, total client FLOPs, and the thesis\' runtime model '
      '(β = 5 ms per step, D = 20 and U = 5 Mbit/s).'])
  fedavg = groups.get('fedavg')
  score = fedavg.best.score.mean if fedavg is not None and fedavg.best.score.n else None
  return claims.SweepData(
      target, metric, seeds, score, tables, claims.measure_claims(groups),
      about='The sweep part of reports/reproduction.md as data, written by bin/report.py '
      '--reproduction from the runs of reports/reproduction_grid.txt; the report is rendered '
      'from it when the runs are not there.')


def _timing_text(results, sweep_dir: str, sweep_minutes: Optional[float]) -> str:
  names = {r.trial.name for r in results}
  seconds = {k: v for k, v in sweep.trial_seconds(sweep_dir).items() if k in names}
  cpu = {k: v for k, v in sweep.trial_seconds(sweep_dir, 'cpu_seconds', True).items()
         if k in names}
  timing = ''
  if cpu:
    per_trial = sum(cpu.values()) / len(cpu)
    timing = (f' A trial takes {per_trial:.0f} s of CPU time (mean of the {len(cpu)} trials '
              f'whose last run went from round 0), so the {len(results)} trials need about '
              f'{per_trial * len(results) / 60 / 2:.0f} minutes on 2 idle cores with '
              '`--max_parallel=2`.')
  if seconds:
    timing += (f' Here they took {sum(seconds.values()) / 60 / 2:.0f} minutes of wall time '
               '(sum of trial times / 2) on a machine shared with other jobs.')
  if sweep_minutes is not None:
    timing += (f' The last `bin/reproduce_report.sh` spent {sweep_minutes:.0f} minutes in '
               'the sweep.')
  return timing


def claims_section(data: claims.SweepData) -> list[str]:
  """The sweep's tables, then the claims table and the tally its numbers give."""
  verdicts = claims.verdicts(data.measured)
  return [data.sweep_tables, '', CLAIMS_HEADING, '',
          claims_markdown(data.measured, data.target, data.metric), '',
          claims.claims_tally_markdown(verdicts, len(data.seeds)), '',
          '**How far this goes.** The papers\' claims are about models of 10k to 22M '
          'parameters (the FedGBO paper\'s Sent140 linear model to the FedAda2 paper\'s ViT-S) trained for '
          'thousands of rounds on real federated data. Here a 4,810-parameter MLP on 8×8 '
          f'digits gets to {_score_text(data.fedavg_score)} with plain FedAvg in 20 '
          'rounds, so the algorithms have little room to differ: a claim that does not hold '
          'here is not refuted for the papers\' tasks, and one that holds is only consistent '
          'with them. Short runs favour methods that move fast early and hide late-training '
          'effects; for instance FedGBO\'s server-tracked second moment v starts at 1 and is '
          'updated once per round with β2 = 0.99, so after 20 rounds v ≥ 0.99²⁰ = 0.82 and '
          'FedGBO-Adam\'s client steps are within 1/√0.82 ≈ 1.1× of FedGBO-SGDm\'s: its '
          'adaptivity has not started. The two-point grids are far smaller than the '
          'papers\', so a ranking is partly a ranking of how well each grid fits.']


def _score_text(score: Optional[float]) -> str:
  if score is None:
    return 'high accuracy'
  return f'{score:.1%} test accuracy (mean of its last 3 evaluations)'
