"""The verdicts of reports/shakespeare_report.py's parts fedgbo and decayk.

Run directories with hand-made metrics.csv files stand in for the runs, so
the checks read them the way the report does (reports/report_runner.py).
"""

import csv
import math
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'reports'))
# pylint: disable=g-import-not-at-top,wrong-import-position
import report_runner as rr
import shakespeare_curves as sc


def write_run(job, accuracy, loss, rounds=None):
  """A metrics.csv of `rounds` rounds (default: the job's total) whose training
  loss is `loss` every round and whose evaluations (every 5 rounds) are `accuracy`."""
  total = int(rr.flag(job, 'total_rounds')) if rounds is None else rounds
  os.makedirs(rr.run_dir(job), exist_ok=True)
  with open(os.path.join(rr.run_dir(job), 'metrics.csv'), 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['round', sc.LOSS, sc.ACCURACY])
    for r in range(1, total + 1):
      writer.writerow([r, loss, accuracy if r % 5 == 0 else ''])


@pytest.fixture
def part(tmp_path):
  return sc.jobs(str(tmp_path), str(tmp_path / 'data'))


def test_verdict_paired_t_interval():
  assert sc.verdict({0: 0.5, 1: 0.6, 2: 0.7}, {0: 0.4, 1: 0.5, 2: 0.61}).startswith('supported')
  assert sc.verdict({0: 0.4, 1: 0.5, 2: 0.61}, {0: 0.5, 1: 0.6, 2: 0.7}).startswith(
      'contradicted')
  # Mean difference +0.01, but the seeds disagree: the interval holds 0.
  assert sc.verdict({0: 0.52, 1: 0.49, 2: 0.52}, {0: 0.5, 1: 0.5, 2: 0.5}).startswith(
      'not significant')
  assert sc.verdict({0: 0.5}, {0: 0.4}) == 'no verdict (1 paired seed finished)'
  # Lower is better: a smaller loss in every seed supports the claim.
  assert sc.verdict({0: 2.0, 1: 2.1, 2: 2.2}, {0: 2.5, 1: 2.6, 2: 2.8},
                    lower_is_better=True).startswith('supported (lower by +0.5')


def test_not_worse_is_contradicted_only_beyond_the_interval():
  worse = {0: 0.4, 1: 0.5, 2: 0.61}
  better = {0: 0.5, 1: 0.6, 2: 0.7}
  assert sc.not_worse(worse, better).startswith('contradicted')
  assert sc.not_worse(better, worse).startswith('supported (')
  assert sc.not_worse({0: 0.52, 1: 0.49, 2: 0.52}, {0: 0.5, 1: 0.5, 2: 0.5}).startswith(
      'supported: not worse, not significant')


def test_fedgbo_claims_pick_rivals_by_each_measure(part):
  jobs = part['fedgbo']
  for (name, seed), job in jobs.items():
    # Mimelite-SGDm best by accuracy; by loss MFL-SGDm beats it. RMSProp is
    # the worst of each algorithm's three, by both measures.
    accuracy = {'mimelite_sgdm': 0.40, 'mfl_sgdm': 0.30, 'fedavg': 0.35}.get(name, 0.25)
    accuracy -= 0.05 * name.endswith('rmsprop')
    loss = {'mimelite_sgdm': 2.0, 'mfl_sgdm': 1.5}.get(name, 2.5) + 0.5 * name.endswith('rmsprop')
    write_run(job, accuracy + 0.01 * seed, loss + 0.02 * seed * (name != 'mfl_sgdm'))
  rows = sc.fedgbo_claims(jobs)
  fastest = rows[0]
  assert fastest[2].startswith('Mimelite-SGDm vs FedAvg: supported'), fastest
  assert fastest[3].startswith('Mimelite-SGDm vs MFL-SGDm: contradicted'), fastest
  rmsprop_worst = [r for r in rows if 'RMSProp performed' in r[0]]
  assert len(rmsprop_worst) == 3
  assert all(' vs ' in v and 'RMSProp: supported' in v for r in rmsprop_worst for v in r[2:]), (
      rmsprop_worst)


def test_unfinished_runs_give_no_verdict(part):
  jobs = part['decayk']
  for (name, seed), job in jobs.items():
    write_run(job, 0.3, 2.0, rounds=None if name != 'decay_k' else 5)
  rows = sc.decayk_claims(jobs)
  assert rows[0][2].startswith('supported: not worse'), rows[0]  # γ vs constant: equal
  assert all(v.startswith('no verdict (0 paired seeds') for v in rows[1][2:]), rows[1]


def test_measures_skip_rounds_without_evaluation(part):
  job = part['fedgbo'][('fedavg', 0)]
  write_run(job, 0.25, 3.0)
  columns = rr.read_columns(job)
  assert sc.mean_accuracy(columns) == pytest.approx(0.25)
  assert sc.max_accuracy(columns) == pytest.approx(0.25)
  assert sc.mean_train_loss(columns) == pytest.approx(3.0)
  assert math.isnan(sc.mean_accuracy({'round': [1.0], sc.ACCURACY: [math.nan]}))


def test_wall_clock_sums_the_logged_attempts(part):
  job = part['decayk'][('constant', 0)]
  rr.log_attempt(job, 'ok', 60.0, 5.0)  # no run directory (refused early): nothing written
  assert rr.wall_minutes(job) is None
  write_run(job, 0.3, 2.0, rounds=10)
  rr.log_attempt(job, 'diverged', 90.0, 5.0)
  rr.log_attempt(job, 'ok', 150.0, 5.0)
  assert rr.wall_minutes(job) == pytest.approx(4.0)
