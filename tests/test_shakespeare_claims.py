"""The verdict rules of reports/shakespeare.md (reports/shakespeare_verdicts.py) and
the claims of reports/shakespeare_report.py's parts built on them.

Run directories with hand-made metrics.csv files stand in for the runs, so
the checks read them the way the report does (reports/report_runner.py).
"""

import ast
import csv
import json
import math
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPORTS = os.path.join(ROOT, 'reports')
sys.path.insert(0, REPORTS)
# pylint: disable=g-import-not-at-top,wrong-import-position
import report_runner as rr
import shakespeare_curves as sc
import shakespeare_data
import shakespeare_verdicts as sv
from workflow.training import run_files

UNIFORM = math.log(sc.VOCAB_SIZE)
# The rules' baselines on these curves: ln 79 = 4.37 and the build's unigram
# entropy (3.156 on the 90/10 build); a loss of 3.0 left the plateau.
H = 3.156
BASE = sv.Baselines(sc.VOCAB_SIZE, H)
RISING = lambda start: (lambda r: start + 0.002 * r)  # +4 points over 20 rounds


def write_run(job, accuracy, loss, rounds=None):
  """A metrics.csv of `rounds` rounds (default: the job's total) with training
  loss `loss` every round and an evaluation every 5 rounds of `accuracy`; each
  is a number (a flat curve) or a function of the round."""
  total = int(rr.flag(job, 'total_rounds')) if rounds is None else rounds
  at = lambda value, r: value(r) if callable(value) else value
  os.makedirs(rr.run_dir(job), exist_ok=True)
  with open(os.path.join(rr.run_dir(job), 'metrics.csv'), 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['round', sv.LOSS, sv.ACCURACY])
    for r in range(1, total + 1):
      writer.writerow([r, at(loss, r), at(accuracy, r) if r % 5 == 0 else ''])


def curve(accuracy=(), loss=()):
  """metrics.csv columns: `loss` one per round, `accuracy` one per 5 rounds."""
  rounds = max(len(loss), 5 * len(accuracy))
  acc = [accuracy[r // 5 - 1] if r % 5 == 0 and r // 5 <= len(accuracy) else math.nan
         for r in range(1, rounds + 1)]
  return {'round': [float(r) for r in range(1, rounds + 1)], sv.ACCURACY: acc,
          sv.LOSS: list(loss) or [math.nan] * rounds}


@pytest.fixture
def part(tmp_path, monkeypatch):
  monkeypatch.setitem(shakespeare_data.UNIGRAM_ENTROPY, sc.TRAIN_FRACTION, H)
  return sc.jobs(str(tmp_path), str(tmp_path / 'data'))


# ---- rule 2: the plateau ---------------------------------------------------
def test_accuracy_leaves_its_plateau_by_more_than_half_a_point_either_way():
  within = sv.ACCURACY_PLATEAU * 0.8
  beyond = sv.ACCURACY_PLATEAU * 1.2
  assert not sv.left_plateau(curve([0.19, 0.19 + within, 0.19 - within]), sv.ACCURACY, BASE)
  assert sv.left_plateau(curve([0.19, 0.19, 0.19 + beyond]), sv.ACCURACY, BASE)
  assert sv.left_plateau(curve([0.19, 0.19, 0.09]), sv.ACCURACY, BASE)  # a fall moves too
  assert not sv.left_plateau(curve([0.19]), sv.ACCURACY, BASE)  # one evaluation: no curve
  assert not sv.left_plateau(curve([], [3.0] * 10), sv.ACCURACY, BASE)  # never evaluated


def test_loss_leaves_its_plateau_when_its_last_rounds_are_2_percent_below_the_unigram_entropy():
  near = H * (1 - 0.8 * sv.LOSS_PLATEAU)
  off = H * (1 - 1.2 * sv.LOSS_PLATEAU)
  assert not sv.left_plateau(curve(loss=[UNIFORM] * 10 + [near] * 10), sv.LOSS, BASE)
  assert sv.left_plateau(curve(loss=[UNIFORM] * 10 + [off] * 10), sv.LOSS, BASE)
  # One low round among the last LOSS_WINDOW does not move the window's mean enough.
  assert not sv.left_plateau(curve(loss=[UNIFORM] * 19 + [off]), sv.LOSS, BASE)
  # Below ln V but at the unigram entropy: the frequencies learnt, not the text.
  assert not sv.left_plateau(curve(loss=[UNIFORM] * 10 + [H] * 10), sv.LOSS, BASE)
  assert 'unigram entropy H = 3.156' in sv.plateau_text(sv.LOSS, BASE)


def test_runs_on_their_plateau_get_no_verdict_however_far_apart():
  flat_high = {s: curve([0.30] * 4, [UNIFORM] * 20) for s in range(3)}
  flat_low = {s: curve([0.20 + 0.001 * s] * 4, [UNIFORM] * 20) for s in range(3)}
  rising = {s: curve([0.30, 0.31, 0.32, 0.33 + 0.001 * s], [3.0 - 0.01 * s] * 20)
            for s in range(3)}
  for rule in (sv.superiority, sv.non_inferiority):
    text = rule(flat_high, flat_low, sc.MEAN_ACCURACY, BASE, ('high', 'low'))
    assert text.startswith('no verdict (plateau'), text
    assert 'high in 3 of 3 seeds' in text and 'low in 3 of 3 seeds' in text
    # One side off its plateau is not enough: the other has not started.
    text = rule(rising, flat_low, sc.MEAN_ACCURACY, BASE, ('rising', 'low'))
    assert text.startswith('no verdict (plateau') and 'rising' not in text.split(':', 1)[1], text
    text = rule(rising, flat_low, sc.MEAN_LOSS, BASE, ('rising', 'low'))
    assert text.startswith('no verdict (plateau: training loss'), text
  assert sv.superiority(rising, rising, sc.MEAN_LOSS, BASE).startswith('no verdict (not sig')


def test_fewer_than_two_paired_seeds_give_no_verdict():
  runs = {0: curve([0.2, 0.3], [3.0] * 10)}
  assert sv.superiority(runs, runs, sc.MEAN_ACCURACY, BASE) == 'no verdict (1 paired seed finished)'
  assert sv.non_inferiority({}, runs, sc.MEAN_LOSS, BASE) == 'no verdict (0 paired seeds finished)'


# ---- rule 3: the tests -------------------------------------------------------
def test_paired_interval_is_students_t():
  stats = pytest.importorskip('scipy.stats')
  diffs = [0.1, 0.25, 0.16, 0.3]
  mean, half, lower = sv.paired(diffs)
  n, sd = len(diffs), stats.tstd(diffs)
  assert mean == pytest.approx(sum(diffs) / n)
  assert half == pytest.approx(stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n), rel=1e-3)
  # Non-inferiority's bound: one-sided 97.5 %.
  assert lower == pytest.approx(mean - stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n), rel=1e-3)


def _moving(finals, start=0.20):
  """{seed: columns} of accuracy curves rising from `start` to finals[seed] by
  round 10, then level to round 150: converged over their last 100 rounds."""
  return {s: curve([start, f] + [f] * 28, [3.0] * 150) for s, f in enumerate(finals)}


def test_superiority_supports_contradicts_or_gives_no_verdict():
  better, worse = _moving([0.35, 0.36, 0.37]), _moving([0.30, 0.30, 0.32])
  assert sv.superiority(better, worse, sc.MAX_ACCURACY, BASE).startswith('supported (ahead by 0.05')
  assert sv.superiority(worse, better, sc.MAX_ACCURACY, BASE).startswith('contradicted')
  noisy = _moving([0.36, 0.28, 0.34])  # ahead on average, but the seeds disagree
  assert sv.superiority(noisy, worse, sc.MAX_ACCURACY, BASE).startswith(
      'no verdict (not significant')


def test_same_or_improved_is_never_supported_by_non_significance():
  old = _moving([0.30, 0.31, 0.32])
  # A difference that is not significant but whose interval reaches well below
  # −margin: the old rule called this "supported: not worse".
  wide = _moving([0.33, 0.27, 0.34])
  diffs = [n - o for n, o in zip([0.33, 0.27, 0.34], [0.30, 0.31, 0.32])]
  mean, half, lower = sv.paired(diffs)
  assert mean - half < 0 < mean + half and lower < -sv.MARGINS[sv.ACCURACY]
  text = sv.non_inferiority(wide, old, sc.MAX_ACCURACY, BASE)
  assert text.startswith('no verdict (non-inferiority not shown'), text
  # Slightly worse but tightly within the margin: non-inferior.
  close = _moving([0.298, 0.307, 0.319])
  assert sv.non_inferiority(close, old, sc.MAX_ACCURACY, BASE).startswith(
      'supported: non-inferior (')
  assert sv.non_inferiority(_moving([0.35, 0.36, 0.37]), old, sc.MAX_ACCURACY, BASE).startswith(
      'supported: non-inferior, significantly better')
  # Worse beyond the margin in every seed: contradicted.
  assert sv.non_inferiority(_moving([0.27, 0.28, 0.29]), old, sc.MAX_ACCURACY, BASE).startswith(
      'contradicted: worse by more than the margin')
  # Significantly worse, but the interval reaches inside the margin: no verdict, said so.
  text = sv.non_inferiority(_moving([0.288, 0.302, 0.305]), old, sc.MAX_ACCURACY, BASE)
  assert text.startswith('no verdict (non-inferiority not shown, significantly worse'), text


def test_lower_is_better_flips_the_sign():
  low = {s: curve([0.2, 0.25], [3.0 - 0.1 - 0.01 * s] * 10) for s in range(3)}
  high = {s: curve([0.2, 0.25], [3.0 - 0.005 * s] * 10) for s in range(3)}
  assert sv.superiority(low, high, sc.MEAN_LOSS, BASE).startswith('supported (lower by 0.1')
  assert sv.non_inferiority(high, low, sc.MEAN_LOSS, BASE).startswith('contradicted')


# ---- rules 0, 4, 5, 6: diverged runs, convergence, one round, horizon ----------
def test_a_verdict_resting_on_one_evaluation_is_flagged():
  ahead = {s: curve([0.19, 0.20, 0.21, 0.22], [3.0] * 20) for s in range(3)}
  # Level with `ahead` (the seeds disagree by a point) until all fall at round 20.
  falls = {s: curve([0.19, 0.20 + (0.01, -0.01, 0.005)[s], 0.21, 0.09], [3.0] * 20)
           for s in range(3)}
  text = sv.superiority(ahead, falls, sc.MEAN_ACCURACY, BASE)
  assert text.startswith('supported') and 'flagged: rests on a single evaluation' in text
  assert 'without round 20: no verdict' in text, text
  steady = {s: curve([0.19, 0.17, 0.16 + 0.002 * s, 0.15], [3.0] * 20) for s in range(3)}
  text = sv.superiority(ahead, steady, sc.MEAN_ACCURACY, BASE)
  assert text.startswith('supported') and 'flagged' not in text, text


def test_a_lowest_loss_resting_on_one_round_is_flagged():
  dips = {s: curve(loss=[3.0] * 19 + [2.5 + 0.01 * s]) for s in range(3)}
  level = {s: curve(loss=[2.9 + 0.005 * s] * 20) for s in range(3)}
  text = sv.superiority(dips, level, sc.MIN_LOSS, BASE)
  assert text.startswith('supported (lower by 0.39') and 'rests on a single round' in text, text
  assert 'without round 20: contradicted' in text, text
  assert 'flagged' not in sv.superiority(level, dips, sc.MEAN_LOSS, BASE)


def test_runs_that_came_apart_are_left_out_and_named():
  fine = {s: curve(loss=[3.0 - 0.01 * s] * 40) for s in range(4)}
  other = {s: curve(loss=[2.9 - 0.01 * s] * 40) for s in range(4)}
  other[1] = curve(loss=[2.9] * 20 + [UNIFORM + 1] * 20)  # above ln V from round 21
  assert sv.came_apart(other[1], BASE) == 21 + sv.LOSS_WINDOW // 2 - 2 or sv.came_apart(
      other[1], BASE) in range(21, 21 + sv.LOSS_WINDOW)
  assert sv.came_apart(fine[0], BASE) is None
  # Never below ln V (a run that never learnt) did not come apart: the plateau rule says so.
  assert sv.came_apart(curve(loss=[UNIFORM + 0.1] * 20), BASE) is None
  text = sv.superiority(other, fine, sc.MEAN_LOSS, BASE, ('B', 'A'))
  assert text.startswith('supported (lower by 0.1000 ± 0.0000, 3 seeds'), text
  assert text.endswith(f'left out, came apart: B seed 1 (round {sv.came_apart(other[1], BASE)})')
  two = {s: other[s] for s in (0, 1)}
  assert sv.superiority(two, fine, sc.MEAN_LOSS, BASE, ('B', 'A')).startswith(
      'no verdict (1 paired seed finished; left out, came apart: B seed 1')


def test_contradicted_needs_converged_runs():
  rising = lambda f: {s: curve([0.2 + (f - 0.2) * k / 29 for k in range(30)], [3.0] * 150)
                      for s, f in enumerate(f)}
  behind, ahead = rising([0.30, 0.31, 0.32]), _moving([0.35, 0.36, 0.37])
  assert sv.change_per_window(behind[0], sv.ACCURACY) == pytest.approx(0.1 * 100 / 145, rel=0.05)
  assert sv.change_per_window(ahead[0], sv.ACCURACY) == pytest.approx(0.0, abs=1e-12)
  text = sv.superiority(behind, ahead, sc.MAX_ACCURACY, BASE, ('late', 'early'))
  assert text.startswith('no verdict (not converged'), text
  assert 'late seed 0 +0.06' in text and 'early' not in text.split('late seed 2')[0], text
  # Still rising but ahead: "supported" says what was measured at this horizon.
  assert sv.superiority(rising([0.40, 0.41, 0.42]), ahead, sc.MAX_ACCURACY, BASE).startswith(
      'supported')


def test_every_verdict_names_its_horizon():
  better, worse = _moving([0.35, 0.36, 0.37]), _moving([0.30, 0.30, 0.32])
  short = sv.superiority(better, worse, sc.MAX_ACCURACY, BASE, horizon=sv.Horizon(300, 4000))
  assert short.startswith('at 300 of 4,000 rounds: descriptive: supported'), short
  full = sv.superiority(better, worse, sc.MAX_ACCURACY, BASE, horizon=sv.Horizon(1200, 1200))
  assert full.startswith('at 1,200 rounds: supported'), full


# ---- the parts' claims --------------------------------------------------------
def test_fedgbo_claims_pick_rivals_by_each_measure(part):
  jobs = part['fedgbo']
  for (name, seed), job in jobs.items():
    # Mimelite-SGDm best by accuracy; by loss MFL-SGDm beats it. RMSProp is
    # the worst of each algorithm's three, by both measures. Every curve rises.
    accuracy = {'mimelite_sgdm': 0.40, 'mfl_sgdm': 0.30, 'fedavg': 0.35}.get(name, 0.25)
    accuracy -= 0.05 * name.endswith('rmsprop')
    loss = {'mimelite_sgdm': 2.0, 'mfl_sgdm': 1.5}.get(name, 2.5) + 0.5 * name.endswith('rmsprop')
    write_run(job, RISING(accuracy + 0.01 * seed), loss + 0.02 * seed * (name != 'mfl_sgdm'))
  rows = sc.fedgbo_claims(jobs)
  fastest = rows[0]
  horizon = 'at 300 of 5,000 rounds: descriptive: '
  assert fastest[2].startswith(f'Mimelite-SGDm vs FedAvg: {horizon}supported'), fastest
  assert fastest[3].startswith(f'Mimelite-SGDm vs MFL-SGDm: {horizon}contradicted'), fastest
  rmsprop_worst = [r for r in rows if 'RMSProp performed' in r[0]]
  assert len(rmsprop_worst) == 3
  assert all(f'RMSProp: {horizon}supported' in v for r in rmsprop_worst for v in r[2:]), (
      rmsprop_worst)


def test_decayk_claims_are_non_inferiority_and_unfinished_runs_give_no_verdict(part):
  jobs = part['decayk']
  for (name, seed), job in jobs.items():
    write_run(job, RISING(0.2 + 0.001 * seed), 2.0 + 0.01 * seed,
              rounds=None if name != 'decay_k' else 5)
  rows = sc.decayk_claims(jobs)
  assert len(rows[0]) == 2 + len(sc.DECAYK_MEASURES)
  horizon = 'at 300 of 4,000 rounds: descriptive: '
  assert all(v.startswith(f'{horizon}supported: non-inferior') for v in rows[0][2:]), rows[0]
  assert all(v.startswith(f'{horizon}no verdict (0 paired seeds') for v in rows[1][2:]), rows[1]


def test_measures_skip_rounds_without_evaluation(part):
  job = part['fedgbo'][('fedavg', 0)]
  write_run(job, 0.25, 3.0)
  columns = rr.read_columns(job)
  assert sc.mean_accuracy(columns) == pytest.approx(0.25)
  assert sc.max_accuracy(columns) == pytest.approx(0.25)
  assert sc.mean_train_loss(columns) == pytest.approx(3.0)
  assert math.isnan(sc.mean_accuracy({'round': [1.0], sc.ACCURACY: [math.nan]}))


def test_cost_per_run_is_scaled_from_the_round_its_finishing_attempt_resumed_from(part):
  job = part['decayk'][('constant', 0)]  # 300 rounds
  rr.log_attempt(job, 'ok', 60.0, 5.0, 0)  # no run directory (refused early): nothing written
  assert rr.seconds_per_run(job) is None
  write_run(job, 0.3, 2.0, rounds=10)
  assert run_files.newest_checkpoint(rr.run_dir(job)) == 0
  for r in (90, 100, 110):  # where bin/train resumes: the highest round, not the last name
    os.makedirs(os.path.join(rr.run_dir(job), 'checkpoints', f'program_state_{r}'))
  assert run_files.newest_checkpoint(rr.run_dir(job)) == 110
  path = os.path.join(rr.run_dir(job), 'wall_clock.csv')
  with open(path, 'w') as f:  # a file from before first_round was logged
    f.write('ended_utc,status,wall_seconds,cpu_seconds\n2026-01-01T00:00:00Z,ok,60.0,30.0\n')
  assert rr.seconds_per_run(job) is None  # its start round is unknown: no cost is guessed
  rr.log_attempt(job, 'diverged', 10.0, 99.0, 0)
  rr.log_attempt(job, 'ok', 100.0, 380.0, run_files.newest_checkpoint(rr.run_dir(job)))
  with open(path, newline='') as f:
    rows = list(csv.DictReader(f))
  assert [r['first_round'] for r in rows] == ['', '0', '110']  # old row kept, column added
  assert rr.seconds_per_run(job) == pytest.approx(380.0 * 300 / 190)
  assert rr.seconds_per_run(job, 'wall_seconds') == pytest.approx(100.0 * 300 / 190)


def test_evaluation_share_reads_eval_seconds_only_when_every_evaluation_logged_it(part):
  import shakespeare_markdown as sm  # pylint: disable=g-import-not-at-top
  job = part['decayk'][('constant', 0)]
  write_run(job, 0.3, 2.0, rounds=4)
  assert sm._eval_share(job) is None  # pylint: disable=protected-access  # unfinished
  path = os.path.join(rr.run_dir(job), 'metrics.csv')

  def write(eval_seconds):
    with open(path, 'w', newline='') as f:
      writer = csv.writer(f)
      writer.writerow(['round', sv.LOSS, sv.ACCURACY, 'round_seconds', 'eval_seconds'])
      for r in range(1, int(rr.flag(job, 'total_rounds')) + 1):
        evaluated = r % 10 == 0
        writer.writerow([r, 2.0, 0.3 if evaluated else '', 3.0,
                         eval_seconds(r) if evaluated else ''])
  write(lambda r: 6.0)  # 30 evaluations of 6 s beside 300 rounds of 3 s
  assert sm._eval_share(job) == pytest.approx(180 / (900 + 180))  # pylint: disable=protected-access
  write(lambda r: '' if r <= 100 else 6.0)  # resumed by a version that did not log it
  assert sm._eval_share(job) is None  # pylint: disable=protected-access


def test_a_loss_that_rises_past_the_uniform_guess_is_not_read_as_a_frequency_model(part):
  import shakespeare_markdown as sm  # pylint: disable=g-import-not-at-top
  jobs = part['fedgbo']
  for seed in (0, 1):  # flat accuracy; loss near the unigram entropy, or coming apart
    write_run(jobs[('fedgbo_adam', seed)], 0.188, 3.15)
    write_run(jobs[('mimelite_sgdm', seed)], lambda r: 0.19 - 0.0005 * r,
              lambda r: 3.2 + 0.1 * r)
  note = ' '.join(sm._unigram_note(jobs, sc.FEDGBO_CONFIGS))  # pylint: disable=protected-access
  assert 'FedGBO-Adam' in note and 'Mimelite-SGDm' not in note, note
  # Its loss verdicts: on the plateau of the unigram entropy, not "contradicted".
  verdict = sv.superiority(sc.runs(jobs, 'fedgbo_adam'), sc.runs(jobs, 'fedgbo_adam'),
                           sc.MEAN_LOSS, sc.baselines())
  assert verdict.startswith('no verdict (plateau: training loss'), verdict
  falls = ' '.join(sm.st.falling_note(jobs, sc.FEDGBO_CONFIGS))
  assert 'Mimelite-SGDm falls' in falls and 'in all 2 seeds' in falls, falls


def test_a_fall_in_one_seed_is_named_with_the_seed_that_did_not_fall(part):
  import shakespeare_markdown as sm  # pylint: disable=g-import-not-at-top
  jobs = part['fedgbo']
  write_run(jobs[('mimelite_sgdm', 0)], lambda r: 0.19 - 0.0005 * r, lambda r: 3.2 + 0.1 * r)
  write_run(jobs[('mimelite_sgdm', 1)], lambda r: 0.19 + 0.001 * r, 1.88)
  falls = ' '.join(sm.st.falling_note(jobs, sc.FEDGBO_CONFIGS))
  assert 'Mimelite-SGDm falls in seed 0 of 2 finished seeds' in falls, falls
  assert 'drops from 4.3 % to 4.0 %' in falls and 'to 33.20 at round 300' in falls, falls
  assert 'Seed 1 does not fall: its validation accuracy ends at 49.0 %' in falls, falls
  assert 'training loss at 1.88' in falls, falls
  write_run(jobs[('mimelite_sgdm', 0)], lambda r: 0.19 + 0.001 * r, 1.88)
  assert not sm.st.falling_note(jobs, sc.FEDGBO_CONFIGS)  # no seed falls: no note

def test_the_falling_note_says_why_the_divergence_rule_let_the_run_go_on(part):
  import shakespeare_markdown as sm  # pylint: disable=g-import-not-at-top
  jobs = part['fedgbo']
  peaks = {0: {100: 48.0, 101: 45.0}, 1: {200: 44.0, 201: 50.0, 202: 39.0, 250: 47.0}}
  for seed, peak in peaks.items():  # above 10 x ln 79 = 43.7 for at most 2 rounds in a row
    job = jobs[('mimelite_sgdm', seed)]
    write_run(job, lambda r: 0.19 - 0.0005 * r, lambda r, p=peak: p.get(r, 3.2 + 0.1 * (r % 50)))
    assert 'Its training loss peaks' not in ' '.join(  # no flags.json: the rule is unknown
        sm.st.falling_note(jobs, sc.FEDGBO_CONFIGS))
    with open(os.path.join(rr.run_dir(job), 'flags.json'), 'w') as f:
      json.dump({'divergence_factor': 10.0, 'divergence_rounds': 3}, f)
  falls = ' '.join(sm.st.falling_note(jobs, sc.FEDGBO_CONFIGS))
  assert 'peaks at 48.00 at round 100, 50.00 at round 201' in falls, falls
  assert 'above 43.7 for at most 2 rounds in a row' in falls, falls
  assert '3 rounds in a row above 10 × the initial model' in falls, falls


# ---- the committed report -------------------------------------------------------
def _verdict_cells():
  """Every verdict cell of reports/shakespeare.md's claim tables (their last columns)."""
  with open(os.path.join(REPORTS, 'shakespeare.md')) as f:
    lines = f.read().splitlines()
  cells, columns = [], None
  for line in lines:
    if not line.startswith('|'):
      columns = None
      continue
    cols = [c.strip() for c in line.strip('|').split('|')]
    if columns is None:
      columns = [i for i, c in enumerate(cols) if c.startswith('verdict')]
    elif not set(''.join(cols)) <= set('-'):
      cells += [cols[i] for i in columns]
  return cells


def test_report_has_no_verdict_from_non_significance():
  cells = _verdict_cells()
  assert len(cells) >= 17, cells  # fedgbo 7 × 2 + decayk 3 × 1, + fedopt's when run
  number = r'([-+]?\d+\.\d+)'
  for cell in cells:
    verdict = cell.split(': ', 1)[1] if ' vs ' in cell.split(':')[0] else cell
    # Rule 6: every verdict names its horizon.
    horizon = re.match(r'at [\d,]+( of [\d,]+)? rounds(: descriptive)?: ', verdict)
    assert horizon, cell
    verdict = verdict[horizon.end():]
    assert verdict.startswith(('supported', 'contradicted', 'no verdict')), cell
    if verdict.startswith('supported: non-inferior'):
      lower, margin = re.search(rf'lower bound {number}, margin (\d+\.?\d*)', verdict).groups()
      assert float(lower) > -float(margin), cell
    elif verdict.startswith('supported'):
      mean, half = re.search(rf'{number} ± (\d+\.\d+)', verdict).groups()
      assert float(mean) - float(half) > 0, cell
    assert not (verdict.startswith('supported') and 'not significant' in verdict), cell


def test_reports_name_papers_not_source_files():
  names = [n for n in os.listdir(REPORTS) if n.startswith('shakespeare') and
           n.endswith(('.py', '.md'))]
  for name in names:
    with open(os.path.join(REPORTS, name)) as f:
      text = f.read()
    assert not re.search(r'\bseed 00\d|\bissue \d|\bsession \d', text, re.I), name
    assert not re.search(r'\bSPEC\b', text), name


def test_report_modules_import_one_way():
  """reports/shakespeare*.py: no import cycle (the markdown once imported the
  report script, which imported the markdown)."""
  edges = {}
  for name in os.listdir(REPORTS):
    if name.startswith('shakespeare') and name.endswith('.py'):
      with open(os.path.join(REPORTS, name)) as f:
        tree = ast.parse(f.read())
      edges[name[:-3]] = {a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                          for a in node.names if a.name.startswith('shakespeare')}

  def on_cycle(graph, start):
    stack, seen = list(graph.get(start, ())), set()
    while stack:
      node = stack.pop()
      if node == start:
        return True
      if node not in seen:
        seen.add(node)
        stack += graph.get(node, ())
    return False
  assert set(edges) >= {'shakespeare_report', 'shakespeare_markdown', 'shakespeare_verdicts'}
  assert not [m for m in edges if on_cycle(edges, m)], edges
  # The old layout, the markdown importing the report back, is caught.
  assert on_cycle({**edges, 'shakespeare_markdown': {'shakespeare_report'}}, 'shakespeare_report')


def test_leaf_vocabulary_size_is_the_tasks():
  """The plateau's uniform guess is ln of tasks/leaf.py's SHAKESPEARE_VOCAB size
  (read from the source: importing it would import TensorFlow)."""
  with open(os.path.join(ROOT, 'tasks', 'leaf.py')) as f:
    tree = ast.parse(f.read())
  vocab = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
               and getattr(n.targets[0], 'id', '') == 'SHAKESPEARE_VOCAB')
  assert sc.VOCAB_SIZE == len(vocab)


def test_a_report_written_elsewhere_draws_its_figures_beside_it(part, tmp_path, monkeypatch):
  import shakespeare_markdown  # pylint: disable=g-import-not-at-top
  monkeypatch.setitem(shakespeare_data.STATS, sc.TRAIN_FRACTION,
                      {'leaf_clients': 702, 'leaf_train': 3_726_115, 'leaf_test': 358_888})
  monkeypatch.setitem(shakespeare_data.CAPPED_TRAIN, sc.TRAIN_FRACTION, 224_640)
  for job in part['decayk'].values():
    write_run(job, RISING(0.2), 2.0)
  committed = os.path.join(REPORTS, 'figures')
  before = {n: os.stat(os.path.join(committed, n)).st_mtime_ns for n in os.listdir(committed)}
  data_dir = str(tmp_path / 'data')
  out = tmp_path / 'elsewhere' / 'shakespeare.md'
  shakespeare_markdown.write(str(out), str(tmp_path), data_dir)
  assert (out.parent / 'figures' / 'shakespeare_decayk.png').exists()
  assert '](figures/shakespeare_decayk.png)' in out.read_text()
  assert before == {n: os.stat(os.path.join(committed, n)).st_mtime_ns
                    for n in os.listdir(committed)}


def test_a_together_file_runs_only_while_a_member_is_unfinished(tmp_path):
  """A population whose members' metrics.csv hold their last round is not run again
  (on a new machine they have no checkpoint, and bin/train would start them over)."""
  import shakespeare_report
  members = [['--total_rounds=3', f'--root_output_dir={tmp_path}', f'--experiment_name=m{i}']
             for i in range(2)]
  path = tmp_path / 'together.json'
  path.write_text(json.dumps(members))
  ran = []

  def run(args):  # a child that uses some CPU, as bin/train would
    ran.append(args)
    return subprocess.run([sys.executable, '-c', 'sum(range(3 * 10**7))'], check=True)

  write_run(members[0], 0.5, 1.0)
  write_run(members[1], 0.5, 1.0, rounds=2)
  shakespeare_report.run_together(str(path), run)
  assert ran == [['bin/train.py', f'--together={path}']]
  # Each member's wall_clock.csv logs the attempt with its share of the process's CPU.
  logged = [rr.read_attempts(os.path.join(rr.run_dir(m), rr.WALL_CLOCK)) for m in members]
  assert [len(rows) for rows in logged] == [1, 1]
  assert logged[0][0]['cpu_seconds'] == logged[1][0]['cpu_seconds'] and float(
      logged[0][0]['cpu_seconds']) > 0.1 and logged[0][0]['first_round'] == '0'
  write_run(members[1], 0.5, 1.0)
  shakespeare_report.run_together(str(path), run)
  shakespeare_report.run_together(None, run)
  assert len(ran) == 1
