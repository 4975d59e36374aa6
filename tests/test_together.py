"""bin/train --together and bin/sweep --together (workflow/training/together.py).

A population's members write exactly what their own runs write: each member's
metrics.csv equals its separate run's (within 1e-5 relative), on a 2 × 2 grid
(client η × seed; the seed moves the data split, the sampling and the weights'
start), a server-η member, and members differing in FedAdam's β₁, β₂ and ε; a
member's directory then resumes as an ordinary run. A member that diverges stops alone; a
population killed with SIGKILL resumes to the uninterrupted population's
result; what cannot run together is refused in one line before anything is
written.
"""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import train_config  # pylint: disable=g-bad-import-order
from workflow.sweeps import sweep
from workflow.sweeps import sweep_runner

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, 'bin', 'train.py')
COMMON = ['--task=digits', '--num_clients=8', '--clients_per_round=3', '--client_batch_size=20',
          '--algorithm=fedadam', '--local_steps=2', '--rounds_per_eval=1',
          '--show_progress=false']
DP = ['--dp=true', '--dp_clip_norm=1', '--dp_noise_multiplier=0.5']
ON_WORKERS = ['--workers=localhost:9', '--data_on_workers=true']
GRID = [('0.1', '0.01', 0), ('0.3', '0.01', 0), ('0.1', '0.01', 1), ('0.3', '0.03', 1)]


def _member(root, client_lr, server_lr, seed, *more):
  return [*COMMON, f'--client_learning_rate={client_lr}', f'--server_learning_rate={server_lr}',
          f'--seed={seed}', f'--root_output_dir={root}',
          f'--experiment_name=m{client_lr}_{server_lr}_{seed}', *more]


def _flag(member, name):
  return dict(a[2:].split('=', 1) for a in member)[name]


def _write(path, members):
  with open(path, 'w') as f:
    json.dump(members, f)
  return str(path)


def _rows(run_dir):
  with open(os.path.join(run_dir, 'metrics.csv'), newline='') as f:
    return list(csv.DictReader(f))


def _assert_same_metrics(got_dir, want_dir, rtol=1e-5):
  got, want = _rows(got_dir), _rows(want_dir)
  assert [r['round'] for r in got] == [r['round'] for r in want]
  for g, w in zip(got, want):
    for key, value in w.items():
      if key in ('round_seconds', 'eval_seconds') or value == '':
        continue
      np.testing.assert_allclose(float(g[key]), float(value), rtol=rtol, atol=1e-7,
                                 err_msg=f'{got_dir} {key} round {w["round"]}')


def _equal_to_separate_runs(tmp_path, members) -> str:
  """Runs `members` (their root under tmp_path/together) as one population, then
  each alone under tmp_path/alone; asserts every member's metrics.csv equals its
  separate run's. The population's output."""
  code, together = train_config.train([f'--together={_write(tmp_path / "m.json", members)}'])
  assert code == 0, together[-3000:]
  for member in members:
    alone = [a.replace(str(tmp_path / 'together'), str(tmp_path / 'alone')) for a in member]
    code, output = train_config.train(alone)
    assert code == 0, output[-3000:]
    name = _flag(member, 'experiment_name')
    _assert_same_metrics(tmp_path / 'together' / name, tmp_path / 'alone' / name)
  return together


# FedAdam keeps β₁, β₂ and ε in its state: the seed-1 members also differ in them;
# members 1 and 3 also differ in their learning-rate schedules.
BETAS = ([], ['--client_lr_schedule=exp_decay', '--client_lr_decay_rate=0.5',
              '--client_lr_decay_steps=1'],
         ['--server_beta_1=0.5'],
         ['--server_beta_2=0.9', '--server_epsilon=0.1', '--server_lr_warmup_rounds=2'])


def test_members_equal_their_separate_runs(tmp_path):
  members = [_member(tmp_path / 'together', *m, '--total_rounds=3', *betas)
             for m, betas in zip(GRID, BETAS)]
  output = _equal_to_separate_runs(tmp_path, members)
  scheduled = {i: [float(r[f'schedule/{who}_learning_rate'])
                   for r in _rows(tmp_path / 'together' / _flag(members[i], 'experiment_name'))]
               for i, who in ((0, 'client'), (1, 'client'), (3, 'server'))}
  np.testing.assert_allclose(scheduled[0], [0.1] * 3, rtol=1e-6)
  np.testing.assert_allclose(scheduled[1], [0.3, 0.15, 0.075], rtol=1e-6)
  assert scheduled[3][0] < scheduled[3][-1] == pytest.approx(0.03)
  assert 'Training 4 runs of fedadam on digits together' in output
  for member in members:
    name = _flag(member, 'experiment_name')
    with open(tmp_path / 'together' / name / 'flags.json') as f:
      assert json.load(f)['client_learning_rate'] == float(_flag(member, 'client_learning_rate'))
  finals = {_rows(tmp_path / 'together' / _flag(m, 'experiment_name'))[-1][
      'train/client_work/train/loss'] for m in members}
  assert len(finals) == len(members)  # the members differ
  # A member's directory is an ordinary run's: bin/train without --together extends it.
  extended = [a for a in members[0] if not a.startswith('--total_rounds')] + ['--total_rounds=4']
  code, output = train_config.train(extended)
  assert code == 0, output[-3000:]
  assert 'Resuming from the checkpoint after round 3' in output
  name = _flag(members[0], 'experiment_name')
  assert [r['round'] for r in _rows(tmp_path / 'together' / name)] == ['1', '2', '3', '4']


def test_scaffold_members_keep_their_own_control_variates(tmp_path):
  """Clients that keep state: each member stores its clients' c_i in its own run
  directory, as its own run does (6 rounds of 3 of 8 clients: clients return)."""
  more = ('--algorithm=scaffold', '--total_rounds=6', '--rounds_per_eval=3')
  members = [_member(tmp_path / 'together', *m, *more) for m in (('0.1', '1', 0),
                                                                  ('0.3', '0.5', 1))]
  _equal_to_separate_runs(tmp_path, members)


def test_a_member_that_diverges_stops_alone(tmp_path):
  rule = ('--total_rounds=4', '--divergence_rounds=1', '--divergence_factor=2')
  members = [_member(tmp_path, '0.1', '0.01', 0, *rule),
             _member(tmp_path, '1000000', '0.01', 0, *rule)]
  code, output = train_config.train([f'--together={_write(tmp_path / "m.json", members)}'])
  assert code == 1, output[-3000:]
  last = output.strip().splitlines()[-1]
  assert '1 of 2 members diverged (the others finished)' in last and 'm1000000_0.01_0' in last
  assert [r['round'] for r in _rows(tmp_path / 'm0.1_0.01_0')] == ['1', '2', '3', '4']
  assert len(_rows(tmp_path / 'm1000000_0.01_0')) < 4
  # The diverged member's record (bin/sweep skips its trial), and only its.
  assert [os.path.exists(tmp_path / m / 'diverged.json')
          for m in ('m0.1_0.01_0', 'm1000000_0.01_0')] == [False, True]


STOPPED = ('--total_rounds=12', '--rounds_per_checkpoint=4')


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  """The population of the stop tests run whole, once: (its directory, its members)."""
  root = tmp_path_factory.mktemp('whole')
  whole = [_member(root / 'whole', *m, *STOPPED) for m in GRID[:2]]
  code, output = train_config.train([f'--together={_write(root / "w.json", whole)}'])
  assert code == 0, output[-3000:]
  return root / 'whole', whole


@pytest.mark.parametrize('stop', [signal.SIGKILL, signal.SIGINT])
def test_killed_population_resumes_to_the_uninterrupted_result(tmp_path, stop, uninterrupted):
  """kill -9, or Ctrl-C (SIGINT: stopped cleanly, without a traceback), after
  the first checkpoint; the rerun resumes every member to the uninterrupted result."""
  whole_dir, whole = uninterrupted
  more = STOPPED
  cut = _write(tmp_path / 'c.json', [_member(tmp_path / 'cut', *m, *more) for m in GRID[:2]])
  proc = subprocess.Popen([sys.executable, TRAIN, f'--together={cut}'],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  marker = tmp_path / 'cut' / 'm0.3_0.01_0' / 'checkpoints' / 'program_state_4'
  deadline = time.time() + 240
  while not marker.exists() and proc.poll() is None and time.time() < deadline:
    time.sleep(0.05)
  assert proc.poll() is None, 'the population finished before it could be stopped'
  proc.send_signal(stop)
  _, stderr = proc.communicate(timeout=120)
  assert proc.returncode != 0 and 'Traceback' not in stderr, stderr[-3000:]
  code, output = train_config.train([f'--together={cut}'])
  assert code == 0, output[-3000:]
  assert 'Resuming from the checkpoint after round' in output
  for m in whole:
    name = _flag(m, 'experiment_name')
    _assert_same_metrics(tmp_path / 'cut' / name, whole_dir / name, rtol=1e-6)


@pytest.mark.parametrize('case,needle', [
    ('differs', 'member 1 differs from member 0 in --local_steps'),
    ('extra', '--together takes every flag from its file: drop --seed'),
    ('one', 'at least two command lines'),
    ('same_dir', 'two members would write'),
    ('dp', '--together: fedadam: fixed-clip DP has no population form yet'),
    ('data_on_workers', '--together: drop --data_on_workers'),
    ('betas', 'the members differ in --server_beta_1, which fedavg does not keep'),
])
def test_refused_in_one_line_before_anything_is_written(tmp_path, case, needle):
  a, b = _member(tmp_path / 'out', '0.1', '0.01', 0), _member(tmp_path / 'out', '0.3', '0.01', 0)
  members = {'differs': [a, b + ['--local_steps=3']], 'extra': [a, b], 'one': [a],
             'same_dir': [a, b[:-1] + [a[-1]]],
             'dp': [a + DP, b + DP], 'data_on_workers': [a + ON_WORKERS, b + ON_WORKERS],
             'betas': [a + ['--algorithm=fedavg'],
                       b + ['--algorithm=fedavg', '--server_beta_1=0.5']]}[case]
  args = [f'--together={_write(tmp_path / "m.json", members)}']
  code, output = train_config.train(args + (['--seed=2'] if case == 'extra' else []))
  assert code == 2, output[-3000:]
  assert needle in output.strip().splitlines()[-1], output[-2000:]
  assert 'Traceback' not in output
  written = os.listdir(tmp_path / 'out') if os.path.isdir(tmp_path / 'out') else []
  assert not written, written


def test_sweep_runs_each_program_shape_as_one_process(tmp_path):
  """bin/sweep --together: one process per shape, each trial's outcome its own run's."""
  fake = tmp_path / 'fake_train.py'
  fake.write_text(
      'import json, os, sys\n'
      'members = json.load(open(sys.argv[1].split("=", 1)[1]))\n'
      'with open(os.path.join(os.path.dirname(sys.argv[1].split("=", 1)[1]), "calls"), "a") as f:\n'
      '  f.write(json.dumps(members) + "\\n")\n'
      'for argv in members:\n'
      '  flags = dict(a[2:].split("=", 1) for a in argv)\n'
      '  out = os.path.join(flags["root_output_dir"], flags["experiment_name"])\n'
      '  os.makedirs(out, exist_ok=True)\n'
      '  if flags["client_learning_rate"] != "9":\n'
      '    open(os.path.join(out, "metrics.csv"), "w").write("round\\n1\\n2\\n")\n')
  groups = sweep.parse_grid('client_learning_rate=0.1,9;local_steps=1,2')
  trials = sweep.expand(groups, [0, 1], {'total_rounds': '2'})
  outcomes = sweep_runner.run_sweep(trials, str(tmp_path / 'sw'), fixed={'total_rounds': '2'},
                                    command=[sys.executable, str(fake)], together=True,
                                    log=lambda m: None)
  with open(tmp_path / 'sw' / 'together' / 'calls') as f:
    calls = [json.loads(line) for line in f]
  assert sorted(len(c) for c in calls) == [4, 4]  # local_steps 1 and 2: two shapes
  assert all(len({a for m in c for a in m if a.startswith('--local_steps')}) == 1 for c in calls)
  status = {o.trial.name: o.status for o in outcomes}
  assert sorted(status.values()) == ['failed'] * 4 + ['finished'] * 4
  assert all(s == 'failed' for n, s in status.items() if 'client_learning_rate=9' in n)


def test_a_group_refused_together_runs_apart(tmp_path):
  """bin/train refuses a population (exit 2, no round): its trials run apart."""
  fake = tmp_path / 'fake_train.py'
  fake.write_text(
      'import json, os, sys\n'
      'if sys.argv[1].startswith("--together="):\n'
      '  members = json.load(open(sys.argv[1].split("=", 1)[1]))\n'
      '  if "--local_steps=2" in members[0]:\n'
      '    print("--together: no population form", file=sys.stderr); sys.exit(2)\n'
      'else:\n'
      '  members = [sys.argv[1:]]\n'
      'for argv in members:\n'
      '  flags = dict(a[2:].split("=", 1) for a in argv)\n'
      '  out = os.path.join(flags["root_output_dir"], flags["experiment_name"])\n'
      '  os.makedirs(out, exist_ok=True)\n'
      '  open(os.path.join(out, "metrics.csv"), "w").write("round\\n1\\n2\\n")\n'
      '  open(os.path.join(out, "how"), "w").write(str(len(members)))\n')
  trials = sweep.expand(sweep.parse_grid('client_learning_rate=0.1,0.3;local_steps=1,2'), [0],
                        {'total_rounds': '2'})
  lines = []
  outcomes = sweep_runner.run_sweep(trials, str(tmp_path / 'sw'), fixed={'total_rounds': '2'},
                                    command=[sys.executable, str(fake)], together=True,
                                    log=lines.append)
  assert all(o.status == 'finished' for o in outcomes), lines
  how = {t.name: (tmp_path / 'sw' / 'trials' / t.name / 'how').read_text() for t in trials}
  assert sorted(how.values()) == ['1', '1', '2', '2'], how  # local_steps=2 apart
  assert any('2 trials cannot run together (--together: no population form)' in l
             for l in lines), lines
