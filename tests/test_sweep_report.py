"""bin/sweep and bin/report: grids, resume, failure isolation, selection, CIs, costs to target.

Most tests run the sweep with a fake trial program (a few lines of Python that
write a metrics.csv the way bin/train does, with curves chosen by the test);
one runs a real 2-round bin/train trial. The last tests check that the
reproduction report's exact figures equal the papers' printed values.
"""

import csv
import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from scipy import stats as scipy_stats

from workflow.reporting import report
from workflow.reproduction import claims
from workflow.reproduction import communication
from workflow.reproduction import flops_tables
from workflow.reproduction import paper_checks
from workflow.reproduction import provenance
from workflow.sweeps import selection
from workflow.sweeps import stats
from workflow.sweeps import sweep
from workflow.sweeps import sweep_runner

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The fake trial: curves are functions of the flags, so tests know the winner.
#   accuracy(r) = peak·(1 − e^{−r/2}) − drop·max(0, r − 4)/10 + seed/1000
# with peak = client_learning_rate and drop = server_learning_rate (if given);
# evaluated every 2 rounds like bin/train's --rounds_per_eval=2. A trial with
# client_learning_rate=13 fails, at seed 0 leaving bin/train's record of a diverged run
# (at seed 1 none, as a crash would); every call is appended to $FAKE_CALLS.
FAKE_TRIAL = textwrap.dedent('''
    import csv, json, math, os, sys
    args = dict(a[2:].split('=', 1) for a in sys.argv[1:])
    with open(os.environ['FAKE_CALLS'], 'a') as f:
      f.write(args['experiment_name'] + '\\n')
    out = os.path.join(args['root_output_dir'], args['experiment_name'])
    if args.get('client_learning_rate') == '13':
      if args['seed'] == '0':
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, 'diverged.json'), 'w') as f:
          json.dump({'round': 1, 'error': 'training diverged at round 1'}, f)
      print('error: training diverged at round 1 (non-finite training loss)', file=sys.stderr)
      sys.exit(1)
    os.makedirs(out, exist_ok=True)
    peak = float(args['client_learning_rate'])
    drop = float(args.get('server_learning_rate', 0))
    seed = int(args['seed'])
    bits = 2000.0 if args.get('algorithm') == 'mfl' else 1000.0
    with open(os.path.join(out, 'metrics.csv'), 'w', newline='') as f:
      w = csv.writer(f)
      w.writerow(['round', 'cost/upload_bits_per_client', 'cost/cumulative_upload_bits',
                  'cost/cumulative_client_flops', 'sim/cumulative_minutes', 'eval/accuracy'])
      for r in range(1, int(args.get('total_rounds', 100)) + 1):
        acc = peak * (1 - math.exp(-r / 2)) - drop * max(0, r - 4) / 10 + seed / 1000
        w.writerow([r, bits, r * bits * 10, r * 1e6 * (1 + seed), r * 0.5,
                    acc if r % 2 == 0 else ''])
''')


@pytest.fixture
def fake(tmp_path, monkeypatch):
  script = tmp_path / 'fake_trial.py'
  script.write_text(FAKE_TRIAL)
  calls = tmp_path / 'calls.txt'
  calls.write_text('')
  monkeypatch.setenv('FAKE_CALLS', str(calls))

  def read_calls():
    return [l for l in calls.read_text().splitlines() if l]

  return [sys.executable, str(script)], read_calls


def _quiet(_):
  pass


# ---------------------------------------------------------------------------
# Grid expansion.

def test_grid_expansion_labels_and_stable_names():
  groups = sweep.parse_grid('client_learning_rate=0.01,0.1;server_learning_rate=0.1,1')
  assert len(groups) == 1 and groups[0].label == 'grid'
  trials = sweep.expand(groups, [0, 1])
  assert len(trials) == 2 * 2 * 2
  configs = {t.config for t in trials}
  assert configs == {(('client_learning_rate', a), ('server_learning_rate', b))
                     for a in ('0.01', '0.1') for b in ('0.1', '1')}
  assert len({t.name for t in trials}) == 8
  names = {t.name for t in trials}
  assert 'grid,client_learning_rate=0.01,server_learning_rate=0.1,seed=0' in names
  # Names depend on the flag values only: the same grid written differently.
  again = sweep.expand(sweep.parse_grid(' server_learning_rate=0.1, 1 ; '
                                        'client_learning_rate=0.01,0.1'), [0, 1])
  assert {t.name for t in again} == {t.name for t in trials}


def test_list_of_grids_and_spec_file(tmp_path):
  groups = sweep.parse_grid('fedavg: algorithm=fedavg; client_learning_rate=0.1,0.3 | '
                            'algorithm=fedadam; server_learning_rate=0.01,0.03,0.1')
  assert [g.label for g in groups] == ['fedavg', 'algorithm=fedadam']
  trials = sweep.expand(groups, [0, 1, 2])
  assert len(trials) == (2 + 3) * 3
  # Single-valued flags are passed to bin/train but are the label's business.
  t = trials[0]
  assert t.flags == (('algorithm', 'fedavg'), ('client_learning_rate', '0.1'))
  assert t.name == 'fedavg,client_learning_rate=0.1,seed=0'
  spec = tmp_path / 'grid.txt'
  spec.write_text(textwrap.dedent('''\
      # common to every group
      total_rounds = 3
      dirichlet_alpha = 0.1, 1.0
      [fedavg]
      algorithm = fedavg      # trailing comment
      client_learning_rate = 0.1, 0.3

      [mfl]
      algorithm = mfl
      client_optimizer = adam
      '''))
  groups = sweep.parse_spec_file(str(spec))
  assert [g.label for g in groups] == ['fedavg', 'mfl']
  trials = sweep.expand(groups, [0])
  assert len(trials) == 2 * 2 + 2
  assert {t.name for t in trials if t.group == 'mfl'} == {
      'mfl,dirichlet_alpha=0.1,seed=0', 'mfl,dirichlet_alpha=1.0,seed=0'}
  assert all(dict(t.flags)['total_rounds'] == '3' for t in trials)
  argv = sweep.trial_argv('/s', trials[0], {'task': 'digits'}, ['train'])
  assert argv[:2] == ['train', '--task=digits']
  assert argv[-3:] == ['--seed=0', '--root_output_dir=/s/trials',
                       f'--experiment_name={trials[0].name}']


@pytest.mark.parametrize('grid, message', [
    ('client_learning_rate', 'name=value'),
    ('not_a_flag=1', 'not a bin/train flag'),
    ('seed=1,2', 'set by the sweep'),
    ('client_learning_rate=0.1,,0.2', 'empty value'),
    ('client_learning_rate=0.1,0.1', 'repeats'),
    ('client_learning_rate=0.1;client_learning_rate=0.2', 'given twice'),
    ('a: client_learning_rate=0.1 | a: client_learning_rate=0.2', 'labelled'),
])
def test_bad_grids(grid, message):
  with pytest.raises(sweep.SpecError, match=message):
    sweep.parse_grid(grid)


def test_fixed_flags_and_seeds():
  fixed = sweep.parse_fixed('task=digits; workers=a:1,b:2')
  assert fixed == {'task': 'digits', 'workers': 'a:1,b:2'}  # commas kept
  with pytest.raises(sweep.SpecError, match='both in --fixed'):
    sweep.expand(sweep.parse_grid('task=digits,synthetic'), [0], fixed)
  assert sweep.parse_seeds(3) == [0, 1, 2]
  assert sweep.parse_seeds(3, '4,7') == [4, 7]
  with pytest.raises(sweep.SpecError):
    sweep.parse_seeds(0)


# ---------------------------------------------------------------------------
# Running: failures, resume.

def test_failure_isolated_and_listed_then_resume(tmp_path, fake):
  command, calls = fake
  sweep_dir = str(tmp_path / 'sw')
  fixed = {'total_rounds': '6'}
  groups = sweep.parse_grid('client_learning_rate=0.5,13,0.9')
  trials = sweep.expand(groups, [0, 1], fixed)
  outcomes = sweep_runner.run_sweep(trials, sweep_dir, fixed=fixed, max_parallel=3, command=command,
                                    log=_quiet)
  by_status = {}
  for o in outcomes:
    by_status.setdefault(o.status, []).append(o)
  assert len(by_status['finished']) == 4 and len(by_status['failed']) == 2
  assert all('client_learning_rate=13' in o.trial.name for o in by_status['failed'])
  assert all(o.returncode == 1 and 'diverged' in o.message for o in by_status['failed'])
  listing = sweep_runner.failure_report(outcomes)
  for o in by_status['failed']:
    assert o.log in listing and os.path.exists(o.log)
    assert 'training diverged' in open(o.log).read()
  assert len(calls()) == 6

  # Rerun: finished trials are skipped, and so is the one that left a record of its
  # divergence (listed with its round); the other failed one is tried again.
  outcomes = sweep_runner.run_sweep(trials, sweep_dir, fixed=fixed, max_parallel=2, command=command,
                                    log=_quiet)
  assert sorted(o.status for o in outcomes) == ['diverged', 'failed'] + ['skipped'] * 4
  assert len(calls()) == 7 and calls()[6].endswith('client_learning_rate=13,seed=1')
  assert 'client_learning_rate=13,seed=0: diverged at round 1 when last run' in (
      sweep_runner.failure_report(outcomes))
  outcomes = sweep_runner.run_sweep(trials, sweep_dir, fixed=fixed, retry_diverged=True,
                                    command=command, log=_quiet)
  assert sorted(o.status for o in outcomes) == ['failed'] * 2 + ['skipped'] * 4
  assert len(calls()) == 9

  # An interrupted trial (metrics short of the final round) is run again;
  # raising total_rounds makes every trial unfinished.
  victim = next(t for t in trials if t.name.endswith('client_learning_rate=0.5,seed=1'))
  path = os.path.join(sweep.trial_dir(sweep_dir, victim), 'metrics.csv')
  rows = open(path).read().splitlines()
  with open(path, 'w') as f:
    f.write('\n'.join(rows[:4]) + '\n')
  assert sweep.last_round(path) == 3
  ok = [t for t in trials if 'client_learning_rate=13' not in t.name]
  outcomes = sweep_runner.run_sweep(ok, sweep_dir, fixed=fixed, command=command, log=_quiet)
  assert [o.trial.name for o in outcomes if o.status == 'finished'] == [victim.name]
  assert calls()[-1] == victim.name and len(calls()) == 10
  assert sweep.last_round(path) == 6
  more = {'total_rounds': '8'}
  outcomes = sweep_runner.run_sweep(ok, sweep_dir, fixed=more, command=command, log=_quiet)
  assert all(o.status == 'finished' for o in outcomes) and len(calls()) == 14
  # The manifest lists every trial ever run, with the wall time of finished runs.
  trials_read, fixed_read = sweep.read_manifest(sweep_dir)
  assert {t.name for t in trials_read} == {t.name for t in trials}
  assert fixed_read == more
  assert set(sweep.trial_seconds(sweep_dir)) == {t.name for t in ok}
  cpu = sweep.trial_seconds(sweep_dir, 'cpu_seconds')
  assert set(cpu) == {t.name for t in ok} and all(0 < v < 60 for v in cpu.values())
  # The fake always starts from round 0, but the sweep saw 6 rounds already there.
  assert sweep.trial_seconds(sweep_dir, 'cpu_seconds', whole_runs_only=True) == {}


def test_parallelism_is_bounded(tmp_path, monkeypatch):
  # Each fake trial records how many trials were running when it started.
  script = tmp_path / 'slow.py'
  script.write_text(textwrap.dedent('''
      import os, sys, time
      args = dict(a[2:].split('=', 1) for a in sys.argv[1:])
      lock = os.environ['RUNNING']
      os.makedirs(lock, exist_ok=True)
      mine = os.path.join(lock, args['experiment_name'])
      open(mine, 'w').close()
      with open(os.environ['PEAKS'], 'a') as f:
        f.write(str(len(os.listdir(lock))) + '\\n')
      time.sleep(0.6)
      os.remove(mine)
      out = os.path.join(args['root_output_dir'], args['experiment_name'])
      os.makedirs(out, exist_ok=True)
      with open(os.path.join(out, 'metrics.csv'), 'w') as f:
        f.write('round,eval/accuracy\\n1,0.5\\n')
  '''))
  monkeypatch.setenv('RUNNING', str(tmp_path / 'running'))
  monkeypatch.setenv('PEAKS', str(tmp_path / 'peaks.txt'))
  trials = sweep.expand(sweep.parse_grid('client_learning_rate=1,2,3,4,5'), [0])
  outcomes = sweep_runner.run_sweep(trials, str(tmp_path / 'sw'), fixed={'total_rounds': '1'},
                                    max_parallel=2, command=[sys.executable, str(script)],
                                    poll_seconds=0.05, log=_quiet)
  assert all(o.status == 'finished' for o in outcomes)
  peaks = [int(x) for x in (tmp_path / 'peaks.txt').read_text().split()]
  assert len(peaks) == 5 and max(peaks) == 2


# ---------------------------------------------------------------------------
# Selection.

def _run_fake(tmp_path, command, grid, seeds=(0, 1), rounds=10):
  sweep_dir = str(tmp_path / 'sw')
  fixed = {'total_rounds': str(rounds)}
  trials = sweep.expand(sweep.parse_grid(grid), list(seeds), fixed)
  sweep_runner.run_sweep(trials, sweep_dir, fixed=fixed, max_parallel=4, command=command,
                         log=_quiet)
  results, _ = selection.load_results(sweep_dir)
  return sweep_dir, results


def test_best_config_depends_on_rule(tmp_path, fake):
  command, _ = fake
  # A peaks higher (0.86 at round 4) then decays (drop 0.5); B rises to 0.8 and stays.
  _, results = _run_fake(tmp_path, command,
                         'a: client_learning_rate=1.0; server_learning_rate=0.5 | '
                         'b: client_learning_rate=0.8; server_learning_rate=0')
  curves = {r.trial.group: r.columns['eval/accuracy'] for r in results if r.trial.seed == 0}
  peak = selection.parse_rule('max')
  last = selection.parse_rule('last_mean:2')
  # Hand computation of the rules on seed 0's logged values (rounds 2..10).
  a = [v for v in curves['a'] if not math.isnan(v)]
  assert len(a) == 5
  assert selection.trial_score({'eval/accuracy': curves['a']}, last) == pytest.approx(
      (a[-1] + a[-2]) / 2)
  assert selection.trial_score({'eval/accuracy': curves['a']}, peak) == pytest.approx(max(a))
  final = selection.parse_rule('final')
  assert selection.trial_score({'eval/accuracy': curves['a']}, final) == a[-1]
  # Groups are selected separately; put both configs in one group to compare.
  for r in results:
    r.trial = sweep.Trial('all', r.trial.flags, r.trial.seed, ('client_learning_rate',))
  by_peak = selection.select_best(selection.summarize(results, peak), peak)['all']
  by_last = selection.select_best(selection.summarize(results, last), last)['all']
  assert dict(by_peak.config)['client_learning_rate'] == '1.0'
  assert dict(by_last.config)['client_learning_rate'] == '0.8'
  # Seed average: seeds add seed/1000.
  expected = np.mean([selection.trial_score(r.columns, last) for r in by_last.results])
  assert by_last.score.mean == pytest.approx(expected)
  assert by_last.score.n == 2
  text = selection.selection_report(selection.summarize(results, last), last)
  assert '* ' in text and '--client_learning_rate=0.8' in text.split('*')[1].splitlines()[0]
  # Minimising the same metric picks the other one.
  worst = selection.parse_rule('last_mean:2', mode='min')
  assert dict(selection.select_best(selection.summarize(results, worst), worst)['all'].config)[
      'client_learning_rate'] == '1.0'


def test_a_failed_seed_disqualifies_its_config(tmp_path, fake):
  command, _ = fake
  sweep_dir, results = _run_fake(tmp_path, command, 'client_learning_rate=0.5,0.7', rounds=6)
  rule = selection.parse_rule('last_mean:1')
  best = selection.select_best(selection.summarize(results, rule), rule)['grid']
  assert dict(best.config)['client_learning_rate'] == '0.7'
  # Seed 1 of the better config "crashed" at round 3.
  bad = next(r for r in results if r.trial.name.endswith('0.7,seed=1'))
  path = os.path.join(sweep.trial_dir(sweep_dir, bad.trial), 'metrics.csv')
  lines = open(path).read().splitlines()
  open(path, 'w').write('\n'.join(lines[:4]) + '\n')
  results, _ = selection.load_results(sweep_dir)
  summaries = selection.summarize(results, rule)
  best = selection.select_best(summaries, rule)['grid']
  assert dict(best.config)['client_learning_rate'] == '0.5'
  crashed = next(s for s in summaries if dict(s.config)['client_learning_rate'] == '0.7')
  assert not crashed.complete and crashed.score.n == 1


@pytest.mark.parametrize('text, message', [('last_mean', 'positive integer N'),
                                           ('last_mean:0', 'positive integer'),
                                           ('median', 'last_mean:N'), ('max:3', 'no argument')])
def test_bad_rules(text, message):
  with pytest.raises(sweep.SpecError, match=message):
    selection.parse_rule(text)


# ---------------------------------------------------------------------------
# Statistics and costs to target.

@pytest.mark.parametrize('values', [[0.91, 0.93], [0.5, 0.7, 0.65, 0.61, 0.58],
                                    [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]])
def test_mean_ci_matches_scipy(values):
  ci = stats.mean_ci(values)
  low, high = scipy_stats.t.interval(0.95, len(values) - 1, loc=np.mean(values),
                                     scale=scipy_stats.sem(values))
  assert ci.mean == pytest.approx(np.mean(values))
  assert ci.low == pytest.approx(low) and ci.high == pytest.approx(high)
  ci90 = stats.mean_ci(values, confidence=0.9)
  assert ci90.half_width < ci.half_width


def test_mean_ci_textbook_values_and_edge_cases():
  # t_{0.975,1} = 12.706, t_{0.975,4} = 2.776 (printed t tables).
  assert stats.t_quantile(0.95, 1) == pytest.approx(12.706, abs=1e-3)
  assert stats.t_quantile(0.95, 4) == pytest.approx(2.776, abs=1e-3)
  ci = stats.mean_ci([1.0, 3.0])  # s = √2, sem = 1
  assert ci.half_width == pytest.approx(12.7062, abs=1e-4)
  one = stats.mean_ci([0.5, math.nan])
  assert one.n == 1 and one.mean == 0.5 and math.isnan(one.half_width)
  assert one.format() == '0.500'
  assert stats.mean_ci([]).format() == '—'
  assert stats.mean_ci([0.5, 0.5]).format(2) == '0.50 ± 0.00'
  with pytest.raises(ValueError):
    stats.t_quantile(1.0, 3)


def test_rounds_bits_flops_to_target():
  nan = math.nan
  cols = {'round': [1, 2, 3, 4, 5, 6],
          'eval/accuracy': [nan, 0.5, nan, 0.8, nan, 0.9],
          'cost/cumulative_upload_bits': [10, 20, 30, 40, 50, 60],
          'eval/loss': [nan, 2.0, nan, 0.9, nan, 0.4]}
  assert report.first_reach(cols, 'eval/accuracy', 0.8) == 4
  assert report.first_reach(cols, 'eval/accuracy', 0.8, 'cost/cumulative_upload_bits') == 40
  assert report.first_reach(cols, 'eval/accuracy', 0.95) != report.first_reach(
      cols, 'eval/accuracy', 0.95)  # NaN: never
  assert report.first_reach(cols, 'eval/loss', 1.0, mode='min') == 4
  assert math.isnan(report.first_reach(cols, 'eval/accuracy', 0.5, 'no/such_column'))

  def result(seed, accs):
    return selection.TrialResult(sweep.Trial('g', (), seed), True,
                                 {'round': [2, 4, 6], 'eval/accuracy': accs,
                              'cost/cumulative_client_flops': [1e6, 2e6, 3e6]})
  results = [result(0, [0.5, 0.9, 0.9]), result(1, [0.9, 0.9, 0.9]), result(2, [0.1, 0.2, 0.3])]
  r = report.reach(results, 'eval/accuracy', 0.85)
  assert (r.reached, r.seeds) == (2, 3)
  assert r.cost.mean == pytest.approx(3.0)  # rounds 4 and 2
  assert r.format(3) == '3.000 ± 12.706 (2/3)'
  flops = report.reach(results, 'eval/accuracy', 0.85, 'cost/cumulative_client_flops')
  assert flops.cost.mean == pytest.approx(1.5e6)
  assert report.reach(results, 'eval/accuracy', 0.99).format() == 'not reached (0/3)'


def test_mean_curve_aligns_rounds_and_averages_costs():
  nan = math.nan
  a = selection.TrialResult(sweep.Trial('g', (), 0), True,
                            {'round': [1, 2, 3, 4], 'eval/accuracy': [nan, 0.4, nan, 0.8],
                         'cost/cumulative_client_flops': [1, 2, 3, 4]})
  b = selection.TrialResult(sweep.Trial('g', (), 1), True,
                            {'round': [1, 2, 3, 4], 'eval/accuracy': [nan, 0.6, 0.7, 1.0],
                         'cost/cumulative_client_flops': [3, 4, 5, 6]})
  c = report.mean_curve([a, b], 'eval/accuracy', 'cost/cumulative_client_flops')
  np.testing.assert_allclose(c.x, [3.0, 5.0])  # rounds 2 and 4 only
  np.testing.assert_allclose(c.mean, [0.5, 0.9])
  np.testing.assert_allclose(c.half_width, [12.7062 * 0.1, 12.7062 * 0.1], rtol=1e-4)


def test_report_table_and_figures(tmp_path, fake):
  command, _ = fake
  sweep_dir, _ = _run_fake(
      tmp_path, command, 'avg: algorithm=fedavg; client_learning_rate=0.7,0.95 | '
      'mfl: algorithm=mfl; client_learning_rate=0.6,0.8 | '
      'bad: algorithm=fedavg; client_learning_rate=13')
  out = str(tmp_path / 'rep' / 'sweep.md')
  rule = selection.parse_rule('last_mean:2')
  text = report.write_sweep_report(sweep_dir, out, rule, target=0.75,
                                   xs=tuple(report.COST_AXES), title='T', command='cmd')
  assert os.path.exists(out) and os.path.getsize(str(tmp_path / 'rep' / 'sweep_curves.png')) > 5000
  table = text.split('| group |')[1]
  rows = {l.split('|')[1].strip(): l for l in table.splitlines() if l.startswith('| ')}
  assert 'client_learning_rate=0.95' in rows['avg'] and 'client_learning_rate=0.8' in rows['mfl']
  # avg 0.95 reaches 0.75 at round 4 on both seeds (0.95·(1 − e^{-1}) = 0.60 < 0.75 at 2);
  # 40,000 bits (4 rounds × 10 clients × 1000 bits); mfl 0.8: round 6, 2000-bit uploads.
  assert '| 4.0 ± 0.0 |' in rows['avg'] and '4.00e+04 ± 0.0e+00' in rows['avg']
  assert '| 6.0 ± 0.0 |' in rows['mfl'] and '1.20e+05' in rows['mfl']
  assert 'did not finish' in text and 'bad' not in rows  # failed group has no score
  # Both selected values are the largest of their grids.
  assert '0.95 †' in rows['avg'] and '0.8 †' in rows['mfl'] and 'edge of its grid' in text
  assert '✱' in text and 'Regenerate with' in text


def test_grid_edge_detection():
  def summary(lr, opt='adam'):
    trial = sweep.Trial('g', (('client_learning_rate', lr), ('client_optimizer', opt)), 0,
                        ('client_learning_rate', 'client_optimizer'))
    return selection.ConfigSummary('g', trial.config, [selection.TrialResult(trial, True, {})],
                                   stats.mean_ci([0.5]))
  summaries = [summary(lr, opt) for lr in ('0.01', '0.1', '1') for opt in ('adam', 'sgdm')]
  assert report.at_grid_edge(summaries[2], summaries) == []  # lr 0.1; optimiser not numeric
  assert report.at_grid_edge(summaries[0], summaries) == ['client_learning_rate']
  assert report.at_grid_edge(summaries[5], summaries) == ['client_learning_rate']


def test_cli_dry_run_and_bad_usage(tmp_path):
  run = lambda *a: subprocess.run([sys.executable, os.path.join(ROOT, 'bin', 'sweep.py'), *a],
                                  capture_output=True, text=True, timeout=120)
  result = run(f'--sweep_dir={tmp_path}', '--grid=client_learning_rate=0.1,0.2', '--num_seeds=2',
               '--dry_run')
  assert result.returncode == 0, result.stderr
  assert len(result.stdout.splitlines()) == 4 and 'to run' in result.stdout
  result = run(f'--sweep_dir={tmp_path}', '--grid=learning_rate=0.1')
  assert result.returncode == 2 and 'not a bin/train flag' in result.stderr
  result = run(f'--sweep_dir={tmp_path}', '--grid=client_learning_rate=0.1', '--select_rule=x')
  assert result.returncode == 2 and '--select_rule' in result.stderr


def test_real_two_round_trials_resume(tmp_path):
  """The default command is bin/train: its metrics.csv is where the sweep looks."""
  sweep_dir = str(tmp_path / 'sw')
  fixed = sweep.parse_fixed('task=digits;num_clients=6;clients_per_round=2;local_steps=2;'
                            'total_rounds=2;rounds_per_eval=1;show_progress=false')
  trials = sweep.expand(sweep.parse_grid('client_learning_rate=0.1'), [0], fixed)
  outcomes = sweep_runner.run_sweep(trials, sweep_dir, fixed=fixed, max_parallel=1, log=_quiet)
  assert outcomes[0].status == 'finished', open(outcomes[0].log).read()[-3000:]
  with open(os.path.join(sweep.trial_dir(sweep_dir, trials[0]), 'flags.json')) as f:
    assert json.load(f)['seed'] == 0
  results, _ = selection.load_results(sweep_dir)
  assert results[0].finished and len(results[0].columns['eval/accuracy']) == 2
  assert sweep_runner.run_sweep(trials, sweep_dir, fixed=fixed, log=_quiet)[0].status == 'skipped'
