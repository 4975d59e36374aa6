"""Part fedopt of reports/shakespeare.md (reports/shakespeare_fedopt.py): its
tuning rule, its test runs' command lines and its table, on hand-made run
directories laid out as bin/sweep.py and bin/train.py --together write them;
and what the report reads from its data builds (reports/shakespeare_data.py)."""

import csv
import json
import math
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'reports'))
# pylint: disable=g-import-not-at-top,wrong-import-position
import shakespeare_data
import shakespeare_fedopt as sf
import shakespeare_fedopt_markdown as fm
import shakespeare_verdicts as sv
from workflow.training import cli

H = 3.156
UNIFORM = math.log(sf.VOCAB_SIZE)


@pytest.fixture(autouse=True)
def entropy(monkeypatch):
  monkeypatch.setitem(shakespeare_data.UNIGRAM_ENTROPY, sf.TRAIN_FRACTION, H)


def _trial(runs_dir, name, client, server, loss, rounds=sf.TUNING_ROUNDS):
  """A tuning trial's flags.json and metrics.csv; `loss` a number or a function of the round."""
  path = os.path.join(runs_dir, sf.TUNING_DIR, 'trials',
                      f'{name},client_learning_rate={client},server_learning_rate={server}')
  os.makedirs(path)
  with open(os.path.join(path, 'flags.json'), 'w') as f:
    json.dump({'algorithm': name, 'client_learning_rate': client,
               'server_learning_rate': server, 'seed': sf.TUNING_SEED}, f)
  with open(os.path.join(path, 'metrics.csv'), 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['round', sv.LOSS])
    for r in range(1, rounds + 1):
      writer.writerow([r, loss(r) if callable(loss) else loss])


def test_tuning_chooses_the_lowest_loss_skips_runs_that_came_apart_and_names_edges(tmp_path):
  runs_dir = str(tmp_path)
  for client in (0.1, 0.3, 1.0):
    for server in (0.3, 1.0, 3.0):
      loss = 2.0 + abs(math.log(client / 0.3)) + abs(math.log(server))  # best at (0.3, 1)
      _trial(runs_dir, 'fedavg', client, server, loss)
  # FedAdam: the lowest loss at the end, but it came apart on the way (above ln V).
  for client in (0.1, 0.3, 1.0):
    for server in (0.01, 0.03, 0.1):
      if (client, server) == (1.0, 0.1):
        _trial(runs_dir, 'fedadam', client, server, lambda r: UNIFORM + 1 if 40 < r < 60 else 1.0)
      else:
        _trial(runs_dir, 'fedadam', client, server, 2.0 + client + server)
  # Extended past the tuning rounds, and lower there: scored on rounds 76-100 as the others.
  _trial(runs_dir, 'fedavg', 3.0, 1.0, lambda r: 2.5 if r <= sf.TUNING_ROUNDS else 0.5,
         rounds=300)
  _trial(runs_dir, 'fedyogi', 0.1, 0.01, 2.0)  # a grid not finished: no choice
  _trial(runs_dir, 'fedavgm', 0.1, 0.3, 2.0, rounds=50)
  runs = sf.tuning_runs(runs_dir)
  assert len(runs) == 20  # the unfinished trial is not read
  chosen = sf.choose(runs)
  assert chosen == {'fedavg': (0.3, 1.0), 'fedadam': (0.1, 0.01)}
  assert sf.edges(runs, 'fedavg', chosen['fedavg']) == []  # 0.1, 0.3, 1, 3 × 0.3, 1, 3
  assert sf.edges(runs, 'fedadam', chosen['fedadam']) == [
      'client rate 0.1 at the edge of 0.1, 0.3, 1', 'server rate 0.01 at the edge of 0.01, 0.03, 0.1']
  rows = '\n'.join(fm._tuning_rows(runs, chosen))  # pylint: disable=protected-access
  assert '| FedAdam | 1 | 0.01: 3.010; 0.03: 3.030; 0.1: – |' in rows, rows
  assert '**1: 2.000**' in rows


def test_the_two_best_are_continued_and_the_leader_at_300_rounds_is_tested(tmp_path):
  runs_dir = str(tmp_path)
  for client in (0.1, 0.3, 1.0):
    for server in (0.01, 0.03, 0.1):
      _trial(runs_dir, 'fedadam', client, server, 2.0 + client + server)
  runs = sf.tuning_runs(runs_dir)
  assert sf.ranked(runs, 'fedadam')[:2] == [(0.1, 0.01), (0.1, 0.03)]
  assert sf.stability(runs, 'fedadam')[2] is None  # not continued yet
  entries = [{'name': f'fedadam,client_learning_rate={c},server_learning_rate={s}',
              'seed': sf.TUNING_SEED, 'flags': {'algorithm': 'fedadam', 'total_rounds': '100',
                                                'client_learning_rate': str(c),
                                                'server_learning_rate': str(s)}}
             for c in (0.1, 0.3, 1.0) for s in (0.01, 0.03, 0.1)]
  with open(os.path.join(runs_dir, sf.TUNING_DIR, 'sweep.json'), 'w') as f:
    json.dump({'fixed': {}, 'trials': entries}, f)
  with open(sf.stability_file(runs_dir, 'fedadam', runs)) as f:
    members = json.load(f)
  assert [m[-1] for m in members] == [
      '--experiment_name=fedadam,client_learning_rate=0.1,server_learning_rate=0.01',
      '--experiment_name=fedadam,client_learning_rate=0.1,server_learning_rate=0.03']
  assert all(f'--total_rounds={sf.STABILITY_ROUNDS}' in m and '--total_rounds=100' not in m
             for m in members)
  # Continued: the runner-up ends lower at 300 rounds, so it is tested.
  for (c, s), late in (((0.1, 0.01), 1.5), ((0.1, 0.03), 1.2)):
    path = os.path.join(runs_dir, sf.TUNING_DIR, 'trials',
                        f'fedadam,client_learning_rate={c},server_learning_rate={s}')
    with open(os.path.join(path, 'metrics.csv'), 'a', newline='') as f:
      csv.writer(f).writerows([r, late] for r in range(101, sf.STABILITY_ROUNDS + 1))
  runs = sf.tuning_runs(runs_dir)
  assert sf.choose(runs) == {'fedadam': (0.1, 0.01)}  # the 100-round rule is unchanged
  top, late, leader = sf.stability(runs, 'fedadam')
  assert leader == (0.1, 0.03) and late == pytest.approx([1.5, 1.2])
  lines = fm._stability_lines(runs, sf.choose(runs))  # pylint: disable=protected-access
  assert 'the order flipped; tested at (0.1, 0.03)' in lines[0], lines
  # The report lists a test population's command once it has started (its file written).
  data_dir = os.path.join(runs_dir, 'data90')
  test_line = lambda: next(l for l in fm.section(runs_dir, data_dir) if l.startswith('**Test runs'))
  assert test_line().endswith('one population): not started.')
  path = sf.together_file(runs_dir, data_dir, 'fedadam', leader)
  assert test_line().endswith(f'one population): `.venv/bin/python bin/train.py --together={path}`.')


def test_test_runs_are_one_population_per_method_on_seeds_disjoint_from_tuning(tmp_path):
  runs_dir, data_dir = str(tmp_path), str(tmp_path / 'data90')
  assert sf.TUNING_SEED not in sf.TEST_SEEDS and len(sf.TEST_SEEDS) >= 5
  path = sf.together_file(runs_dir, data_dir, 'fedavgm', (0.3, 1.0))
  with open(path) as f:
    members = json.load(f)
  assert [m[-4] for m in members] == [f'--seed={s}' for s in sf.TEST_SEEDS]
  first = dict(a[2:].split('=', 1) for a in members[0])
  assert (first['total_rounds'], first['first_eval_round'], first['rounds_per_eval']) == (
      '1200', '1101', '10')
  assert (first['client_learning_rate'], first['server_learning_rate'],
          first['server_beta_1']) == ('0.3', '1', '0.9')
  for member in members:  # bin/train's own flags and checks take each line
    settings, _ = cli.config_from_args(member)
    assert settings.loop.total_rounds == sf.FEDOPT_ROUNDS


def test_the_table_and_verdicts_read_the_test_runs_at_the_papers_length():
  at = lambda acc: {'round': [float(r) for r in range(1, 1201)],
                    sv.LOSS: [2.0] * 1200,
                    sv.ACCURACY: [acc if r > 1100 and r % 10 == 0 else math.nan
                                  for r in range(1, 1201)]}
  tests = {'fedavg': {s: at(0.50 + 0.001 * s) for s in sf.TEST_SEEDS},
           'fedadam': {s: at(0.52 + 0.0012 * s) for s in sf.TEST_SEEDS}}
  rows = sf.fedopt_claims(tests)
  assert len(rows) == 1 and rows[0][2].startswith('at 1,200 rounds: supported (ahead by 0.02'), rows
  runs = {('fedadam', c, s): {} for c in (0.1, 0.3, 1.0) for s in (0.01, 0.03, 0.1)}
  table = '\n'.join(fm._table_rows(runs, {'fedadam': (0.3, 0.03)}, tests))  # pylint: disable=protected-access
  assert '| FedAdam | 0.3, 0.03 | 5 of 5 | 52.2 ± 0.2 | 57.0 |' in table, table
  assert '| FedAvg | tuning not finished | 0 | – | 56.9 |' in table


def test_the_builds_counts_and_entropy_are_read_from_the_build(tmp_path):
  """shakespeare_data.read on test_shakespeare_build's two-play fixture, against
  the LEAF files read independently."""
  import collections  # pylint: disable=g-import-not-at-top
  import test_shakespeare_build as tb  # pylint: disable=g-import-not-at-top
  out = str(tmp_path / 'data')
  tb.sb.build(tb._plays(), out, source='fixture')  # pylint: disable=protected-access
  stats, entropy, capped = shakespeare_data.read(out)
  users = tb._leaf(out, 'train')  # pylint: disable=protected-access
  counts = collections.Counter(c for u in users.values() for c in u['y'])
  total = sum(counts.values())
  assert entropy == pytest.approx(-sum(n / total * math.log(n / total) for n in counts.values()))
  assert 0 < entropy < math.log(len(counts)) + 1e-9
  assert capped == sum(min(len(u['y']), shakespeare_data.MAX_CLIENT_EXAMPLES)
                       for u in users.values())
  assert stats['leaf_train'] == total and stats['leaf_clients'] == len(users)


def test_the_populations_saving_is_read_from_the_bench_sample(tmp_path, monkeypatch):
  results = tmp_path / 'bench' / 'results'
  results.mkdir(parents=True)
  mode = lambda cpu: {'cpu_seconds': cpu, 'member_rounds': 800}
  (results / 'population_shakespeare.json').write_text(json.dumps({
      'setting': {'grid': 'client_learning_rate=0.1,1', 'seeds': 2, 'rounds': 100},
      'modes': {'together': mode(3600.0), 'separate_2': mode(6300.0)},
      'together_over_separate_2': 1.5}))
  monkeypatch.setattr(fm.rr, 'ROOT', str(tmp_path))
  sentence = fm._saving_sentence()  # pylint: disable=protected-access
  assert ('as one population 1.00 core-hours, as separate processes two at a time 1.75 '
          '(1.75× the CPU, 1.50× the member-rounds per second)') in sentence
  assert 'client_learning_rate=0.1,1, 2 seeds, 100 rounds, 800 member-rounds' in sentence


def _rounds(n):
  return [float(r) for r in range(1, n + 1)]


def _tuned_and_checked():
  """FedAvg's tuning runs: one of 100 rounds of 36 s (1 h), one continued to 300
  rounds, its 200 past the tuning at 72 s (a 4 h check)."""
  tuned = {'round': _rounds(sf.TUNING_ROUNDS), 'round_seconds': [36.0] * sf.TUNING_ROUNDS}
  checked = {'round': _rounds(300), 'round_seconds': [36.0] * 100 + [72.0] * 200}
  return {('fedavg', 1.0, 1.0): checked, ('fedavg', 0.3, 1.0): tuned}


def test_the_compute_line_counts_each_population_once_and_the_checks_apart():
  runs = _tuned_and_checked()
  seeds = {s: {'round': _rounds(100), 'round_seconds': [18.0 + s] * 100} for s in (0, 1)}
  (line,) = fm._cost_lines(runs, {'fedavg': seeds})  # pylint: disable=protected-access
  # members share a round: 1 h of tuning (not 2), 4 h of checks, 0.53 h of tests (the longest)
  assert ('The finished tuning populations\' rounds took 1.00 hours (FedAvg 1.00); the '
          f'finished ranking checks\' rounds after round {sf.TUNING_ROUNDS} took 4.00 hours '
          '(FedAvg 4.00); the finished 5-seed test populations\' rounds took 0.53 hours '
          '(FedAvg 0.53)') in line
  assert 'at most 11.1 core-hours' in line


def test_what_is_left_is_priced_at_the_measured_rounds_against_the_budget():
  runs = _tuned_and_checked()
  started = {'fedavg': {'round': _rounds(600), 'round_seconds': [12.0] * 599 + [math.nan]}}
  (line, blank) = fm._left_lines(runs, {}, started)  # pylint: disable=protected-access
  # A population: 2 cores x 12 s x 1,200 rounds = 8 core-hours; FedAvg's check 2 x 4 h.
  for part in ("FedAvg's test population is at round 600 of 1,200 (its rounds so far: 4.0 "
               'core-hours)', 'takes about 8.0 core-hours at the median round', '(12.0 s,',
               'a ranking check about 8.0', "the rest of FedAvg's population (about 4.0)",
               'the ranking checks of FedAdagrad, FedAvgM, FedYogi, FedAdam; the test '
               'populations of FedAdagrad, FedAvgM, FedYogi, FedAdam: about 68 core-hours more',
               # tuning 1 h + checks 4 h, on 2 cores, + the started population's 4.0
               'used at most 14.0 core-hours so far, of the 15'):
    assert part in line, (part, line)
  assert blank == '' and fm._left_lines(runs, {}, {}) == []  # pylint: disable=protected-access
  finished = {'fedavg': {0: started['fedavg']}}
  (line, _) = fm._left_lines(runs, finished, {})  # pylint: disable=protected-access
  assert line.startswith('**Left to run.** A 5-seed population of 1,200 rounds takes about 8.0')


def test_a_finished_populations_cpu_is_read_from_its_members_logged_attempts(tmp_path):
  members = [['--total_rounds=1200', f'--root_output_dir={tmp_path}', f'--experiment_name=m{s}']
             for s in range(2)]
  for member in members:
    os.makedirs(sf.rr.run_dir(member))
    sf.rr.log_attempt(member, 'exit 143', 100.0, 50.0, 0)  # stopped: not the finishing one
    sf.rr.log_attempt(member, 'ok', 3600.0, 1800.0, 600)  # rounds 601-1200: half the run
  tests = {'fedavg': {s: {'round': [1200.0], 'round_seconds': [3600.0]} for s in range(2)}}
  (line, _) = fm._measured_cpu_lines(lambda name: members, tests)  # pylint: disable=protected-access
  assert "FedAvg's 2.0 core-hours (against at most 2.0 from 2 × its rounds' wall time)" in line
  unlogged = lambda name: [['--total_rounds=1200', f'--root_output_dir={tmp_path}',
                            '--experiment_name=none']]
  assert fm._measured_cpu_lines(unlogged, tests) == []  # pylint: disable=protected-access


def test_a_started_population_is_read_once_it_has_a_round_and_until_its_last(tmp_path):
  runs_dir, data_dir, chosen = str(tmp_path), str(tmp_path / 'data90'), {'fedavg': (1.0, 1.0)}
  out = sf.rr.run_dir(sf.test_member(runs_dir, data_dir, 'fedavg', (1.0, 1.0), sf.TEST_SEEDS[0]))
  os.makedirs(out)
  read = []
  for last in (0, 3, sf.FEDOPT_ROUNDS):  # just started (a header only), running, finished
    with open(os.path.join(out, 'metrics.csv'), 'w', newline='') as f:
      csv.writer(f).writerows([['round', 'round_seconds'], *([r, 1.0] for r in _rounds(last))])
    read.append(sf.started_runs(runs_dir, data_dir, chosen))
  assert [r.get('fedavg', {'round': None})['round'] for r in read] == [None, [1.0, 2.0, 3.0],
                                                                       None]
