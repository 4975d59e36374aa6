"""Per-round K / γ / η_s schedules driven through the real loop (docs/algorithms.md#schedules).

The decaying-K paper and thesis ch. 5: clients run exactly K_t steps, the schedules reach
every algorithm through one mechanism (`round_schedules`), an error-driven
schedule resumes exactly, the quadratic toy's constant-K fixed point is the
analytic x̃*(γ, K) and decaying K approaches the true minimiser; bad flags
exit 2 with one line naming the flag.
"""

import collections
import csv
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow_federated as tff

import train_config  # pylint: disable=g-bad-import-order

from workflow import errors
from workflow.flags import config
from workflow.flags import schedule_flags
from workflow.training import cli
from tff_adaptive.schedules import core as schedules
from tff_adaptive.schedules import driver as round_schedules
from tff_adaptive.schedules import learning_rate
from tff_adaptive.schedules import local_steps
from tff_adaptive.schedules import quadratic_toy
from tff_adaptive.execution import runtime

# Trains, builds TFF processes or starts subprocesses: not in `make test-fast`.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, 'bin', 'train.py')
CLIENTS = 3


def _settings(tmp_path, name, **overrides):
  """bin/train's settings (defaults), small digits run."""
  return train_config.small_run(tmp_path, name, **{'clients_per_round': CLIENTS, **overrides})


def _read_csv(path):
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def _column(rows, key):
  return [float(r[key]) for r in rows]


def _composer_state(k=50, lr=0.3, server_lr=1.0):
  return tff.learning.templates.LearningAlgorithmState(
      global_model_weights=(), distributor=(),
      client_work=collections.OrderedDict(learning_rate=np.float32(lr), local_steps=np.int32(k)),
      aggregator=(), finalizer=collections.OrderedDict(learning_rate=np.float32(server_lr)))


# ---------------------------------------------------------------------------
# The driver on its own.

def test_rounds_schedule_decays_k_and_client_lr_together():
  driver = schedule_flags.from_settings(config.from_flags(dict(
      local_steps=50, local_steps_schedule='rounds', client_learning_rate=0.3,
      client_lr_schedule='rounds', total_rounds=2000)))
  state = _composer_state()
  for r, k in ((1, 50), (2, 40), (8, 25), (125, 10), (1000, 5)):  # 1000: the ∛ trap
    state, data_k, row = driver.apply(state, r)
    assert data_k is None  # the composer runs K itself
    assert row['schedule/local_steps'] == k == state.client_work['local_steps']
    assert row['schedule/client_learning_rate'] == pytest.approx(0.3 / math.sqrt(r))
    assert state.client_work['learning_rate'] == np.float32(0.3 / math.sqrt(r))
    assert state.client_work['local_steps'].dtype == np.int32


def test_step_schedule_watches_only_regular_evaluation_rounds():
  driver = schedule_flags.from_settings(config.from_flags(dict(
      local_steps=20, local_steps_schedule='step', plateau_patience=1, rounds_per_eval=4,
      total_rounds=20)))
  state = _composer_state(k=20)
  evals = {4: 0.5, 6: 0.1, 8: 0.5}  # round 6: the extra evaluation after a cut run's last round
  ks = []
  for r in range(1, 11):
    state, _, row = driver.apply(state, r)
    ks.append(row['schedule/local_steps'])
    if r in evals:
      row['eval/accuracy'] = evals[r]
    driver.observe(r, {**row, 'cost/client_steps': CLIENTS * ks[-1]}, CLIENTS)
  # Round 6's worse accuracy is not a regular evaluation; round 8 is the first
  # without improvement (patience 1), so K_0/10 from round 9 on.
  assert ks == [20] * 8 + [2, 2]


def test_step_schedule_without_accuracy_watches_the_loss():
  driver = schedule_flags.from_settings(config.from_flags(dict(
      local_steps=10, local_steps_schedule='step', plateau_patience=1, rounds_per_eval=1,
      total_rounds=5)))
  state = _composer_state(k=10)
  ks = []
  for r, loss in zip(range(1, 6), (2.0, 1.0, 1.5, 0.5, 0.4)):
    state, _, row = driver.apply(state, r)
    ks.append(row['schedule/local_steps'])
    driver.observe(r, {**row, 'eval/loss': loss}, CLIENTS)
  assert ks == [10, 10, 10, 1, 1]  # round 3's loss rose: decay from round 4


def test_learning_rates_are_found_in_every_kind_of_state():
  driver = schedule_flags.from_settings(config.from_flags(dict(
      local_steps=4, local_steps_schedule='exp', local_steps_decay=0.5, client_learning_rate=0.2,
      client_lr_schedule='exp', client_lr_decay_rate=0.5, server_learning_rate=2.0,
      server_lr_schedule='exp', server_lr_decay_rate=0.1, total_rounds=3)))
  # MimeXlite: the server optimiser state sits under finalizer['server'].
  mimexlite = _composer_state(k=4, lr=0.2)._replace(finalizer=collections.OrderedDict(
      base=collections.OrderedDict(learning_rate=np.float32(0.2)),
      server=collections.OrderedDict(learning_rate=np.float32(2.0))))
  state, data_k, row = driver.apply(mimexlite, 2)
  assert data_k is None and state.client_work['local_steps'] == 2
  assert state.finalizer['server']['learning_rate'] == np.float32(0.2)
  assert state.finalizer['base']['learning_rate'] == np.float32(0.2)  # untouched
  assert row['schedule/server_learning_rate'] == pytest.approx(0.2)
  # TFF's builders (Mimelite): K through the data, γ in the client optimiser
  # state, η_s in the finalizer.
  tff_state = tff.learning.templates.LearningAlgorithmState(
      global_model_weights=(), distributor=(),
      client_work=(collections.OrderedDict(learning_rate=np.float32(0.2)), ()),
      aggregator=(), finalizer=collections.OrderedDict(learning_rate=np.float32(2.0)))
  state, data_k, row = driver.apply(tff_state, 3)
  assert data_k == 1
  assert isinstance(state, tff.learning.templates.LearningAlgorithmState)
  assert state.client_work[0]['learning_rate'] == np.float32(0.05)
  assert state.finalizer['learning_rate'] == np.float32(0.02)
  # FedGBO/MFL: no server learning rate anywhere.
  fedgbo = _composer_state()._replace(
      finalizer=collections.OrderedDict(m=(np.zeros(2, np.float32),), step=np.float32(0)))
  with pytest.raises(round_schedules.ScheduleError, match='^server_lr: '):
    driver.apply(fedgbo, 1)


def test_driver_state_round_trips_through_json():
  driver = schedule_flags.from_settings(config.from_flags(dict(
      local_steps=8, local_steps_schedule='error', schedule_window=2, total_rounds=10,
      step_time_seconds=0.25)))
  state = _composer_state(k=8)
  for r, loss in zip(range(1, 5), (2.0, 2.0, 1.0, 0.5)):
    state, _, row = driver.apply(state, r)
    driver.observe(r, {**row, round_schedules.FIRST_MINIBATCH_LOSS: loss, 'cost/client_steps': 24.0,
                       'cost/download_bits_per_client': 2e6, 'cost/upload_bits_per_client': 1e6},
                   CLIENTS)
  saved = driver.to_json()
  other = schedule_flags.from_settings(config.from_flags(dict(
      local_steps=8, local_steps_schedule='error', schedule_window=2, total_rounds=10)))
  other.restore(saved)
  assert other.to_json() == saved and other.step_seconds == 0.25
  # F_0 = 2, window (1.0, 0.5): K = ⌈∛(0.375)·8⌉ = ⌈5.77⌉ = 6, in both.
  assert driver.local_steps.value(4) == other.local_steps.value(4) == 6
  # Runtime model: 2 Mbit at 20 Mbit/s + K·0.25 s + 1 Mbit at 5 Mbit/s per round.
  assert driver.sim_seconds_total == pytest.approx(4 * (0.1 + 8 * 0.25 + 0.2))


# ---------------------------------------------------------------------------
# Through the real process and loop.

@pytest.mark.parametrize('algorithm, extra', [
    ('fedavg', dict(server_lr_schedule='exp', server_lr_decay_rate=0.5)),
    ('fedgbo', dict(client_optimizer='adam', client_learning_rate=0.01)),
    ('fedada2', dict(client_optimizer='sm3_adam', client_learning_rate=0.01,
                     server_learning_rate=0.01, client_lr_schedule='rounds')),
])
def test_clients_run_exactly_k_t_steps(tmp_path, algorithm, extra):
  settings = _settings(tmp_path, algorithm, algorithm=algorithm, local_steps=6,
                       local_steps_schedule='exp', local_steps_decay=0.6, step_time_seconds=0.01,
                       **extra)
  state, _ = cli.run_training(settings)
  rows = _read_csv(tmp_path / algorithm / 'metrics.csv')
  k = [math.ceil(6 * 0.6**t - 1e-9) for t in range(5)]
  assert k == [6, 4, 3, 2, 1]
  assert _column(rows, 'schedule/local_steps') == k
  # What the clients actually ran, counted inside the TFF computation.
  assert _column(rows, 'cost/client_steps') == [CLIENTS * x for x in k]
  assert _column(rows, 'cost/cumulative_client_steps') == list(np.cumsum([CLIENTS * x for x in k]))
  fractions = _column(rows, 'schedule/step_fraction_vs_constant_k0')
  for t in range(5):
    assert fractions[t] == pytest.approx(local_steps.step_fraction(k[:t + 1], 6))
  down = float(rows[0]['cost/download_bits_per_client']) / 1e6
  up = float(rows[0]['cost/upload_bits_per_client']) / 1e6
  expected_seconds = [down / 20 + x * 0.01 + up / 5 for x in k]
  assert _column(rows, 'sim/round_seconds') == pytest.approx(expected_seconds)
  assert float(rows[-1]['sim/cumulative_minutes']) == pytest.approx(sum(expected_seconds) / 60)
  # The last round's hyperparameters are in the returned state.
  assert state.client_work['local_steps'] == 1
  if algorithm == 'fedavg':
    assert state.finalizer['learning_rate'] == np.float32(0.5**4)
    assert _column(rows, 'schedule/server_learning_rate') == pytest.approx(
        [0.5**t for t in range(5)])
  if algorithm == 'fedada2':
    assert state.client_work['learning_rate'] == np.float32(0.01 / math.sqrt(5))
    assert _column(rows, 'schedule/client_learning_rate') == pytest.approx(
        [0.01 / math.sqrt(r) for r in range(1, 6)])


def test_error_schedule_resumes_to_the_same_k_sequence(tmp_path):
  """A run stopped after round 4 and resumed (bin/train's command line, in process) takes the
  same K_t as one uninterrupted run: the schedule's state is in the checkpoint."""
  rounds = 8
  settings = _settings(tmp_path, 'whole', local_steps=20, local_steps_schedule='error',
                       schedule_window=2, client_learning_rate=0.3, total_rounds=rounds,
                       rounds_per_eval=4, rounds_per_checkpoint=2, execution='cohort')
  cli.run_training(settings)
  flags = ['--task=digits', '--num_clients=6', f'--clients_per_round={CLIENTS}',
           '--client_batch_size=20', '--local_steps=20', '--local_steps_schedule=error',
           '--schedule_window=2', '--client_learning_rate=0.3', '--rounds_per_eval=4',
           '--rounds_per_checkpoint=2', '--seed=3', '--show_progress=false',
           '--cohort_mode=sequential', f'--root_output_dir={tmp_path}', '--experiment_name=cut']
  for total in (rounds // 2, rounds):
    code, output = train_config.train([*flags, f'--total_rounds={total}'])
    assert code == 0, output[-3000:]
  assert 'Resuming from the checkpoint after round 4' in output

  whole = _read_csv(tmp_path / 'whole' / 'metrics.csv')
  cut = _read_csv(tmp_path / 'cut' / 'metrics.csv')
  k_whole, k_cut = _column(whole, 'schedule/local_steps'), _column(cut, 'schedule/local_steps')
  assert k_whole == k_cut
  assert k_whole[:2] == [20, 20] and min(k_whole) < 20  # K_0 for the window, then decays
  assert _column(whole, 'cost/client_steps') == [CLIENTS * k for k in k_whole]
  for key in ('train/client_work/first_minibatch_loss', 'sim/cumulative_minutes',
              'schedule/step_fraction_vs_constant_k0'):
    np.testing.assert_allclose(_column(cut, key), _column(whole, key), rtol=1e-5)
  v1, w1 = train_config.final_checkpoint(tmp_path / 'whole')
  v2, w2 = train_config.final_checkpoint(tmp_path / 'cut')
  assert v1 == v2 == rounds
  assert len(w1) == len(w2)
  for a, b in zip(w1, w2):
    if a.dtype.kind in 'fiu':
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    else:
      assert a == b  # the schedules' JSON state


# ---------------------------------------------------------------------------
# decaying-K paper §3's toy as a federated TFF process.

def test_quadratic_toy_fixed_point_and_decaying_k():
  # 8 equal-probability clients, full participation: the deterministic
  # expected FedSGD update. Constant K = 10 runs plain FedAvg (η_s = 1, which
  # contracts by 0.15 per round); the fixed points do not depend on η_s, so
  # the decaying run takes η_s = 2 (≤ 0.71 per round for every K in 1..10).
  n, gamma = 8, 0.1
  runtime.use_local_cpp_context()
  try:
    process = quadratic_toy.build_process(gamma, 10)
    constant_k = schedules.ConstantSchedule(10, schedules.LOCAL_STEPS)
    decaying_k = learning_rate.ExponentialDecay(10, 0.7, quantity=schedules.LOCAL_STEPS)
    constant, _ = quadratic_toy.run(quadratic_toy.driver_for(constant_k), 10,
                                    num_clients=n, process=process)
    decaying, rows = quadratic_toy.run(
        quadratic_toy.driver_for(decaying_k, server_lr=2.0), 24, num_clients=n,
        process=process)
  finally:
    runtime.shutdown_workers()
  # Constant K = 10 settles on the analytic surrogate minimiser x̃*(0.1, 10):
  # exactly that of the 8 clients, and within their discretisation (3e-4) of
  # the continuous p(z).
  assert abs(constant[-1] - constant[-2]) < 1e-6  # converged, not passing through
  assert constant[-1] == pytest.approx(quadratic_toy.discrete_fixed_point(gamma, 10, n), abs=2e-6)
  assert constant[-1] == pytest.approx(quadratic_toy.fixed_point(gamma, 10), abs=5e-4)
  # It is 0.034 from the true minimiser; decaying K reaches the clients' true
  # minimiser 1/E[z] (K = 1's fixed point), within 5e-4 of 0.523373.
  x_star = quadratic_toy.TRUE_MINIMISER
  assert abs(constant[-1] - x_star) > 0.03
  assert decaying[-1] == pytest.approx(quadratic_toy.discrete_fixed_point(gamma, 1, n), abs=1e-5)
  assert abs(decaying[-1] - x_star) < 5e-4
  ks = [r['schedule/local_steps'] for r in rows]
  assert ks[:9] == [10, 7, 5, 4, 3, 2, 2, 1, 1] and set(ks[7:]) == {1}
  assert [r['cost/client_steps'] for r in rows] == [n * k for k in ks]  # ran inside TFF
  assert rows[-1]['schedule/step_fraction_vs_constant_k0'] == pytest.approx(
      local_steps.step_fraction(ks, 10))


# ---------------------------------------------------------------------------
# Bad input: exit 2, one line naming the flag, nothing written.

@pytest.mark.parametrize('overrides, flag', [
    (dict(local_steps=5, local_steps_schedule='exp', local_steps_decay=1.5),
     '--local_steps_decay'),
    (dict(local_steps=5, local_steps_schedule='exp', local_steps_decay=0.0),
     '--local_steps_decay'),
    (dict(local_steps=0, local_steps_schedule='exp', local_steps_decay=0.9), '--local_steps'),
    (dict(local_steps=-2), '--local_steps'),
    (dict(local_steps=5, local_steps_schedule='rounds', local_steps_decay=0.9),
     '--local_steps_decay'),
    (dict(local_steps=5, schedule_window=10), '--schedule_window'),
    (dict(client_lr_schedule='rounds', client_lr_decay_rate=0.9), '--client_lr_decay_rate'),
    (dict(local_steps=5, local_steps_schedule='error', schedule_window=50, total_rounds=10),
     '--schedule_window'),
    # Refuted by the built process: MFL has no server learning rate.
    (dict(algorithm='mfl', client_optimizer='adam', server_lr_schedule='exp',
          server_lr_decay_rate=0.9), '--server_lr_schedule'),
])
def test_bad_schedule_flags_exit_2_with_one_line(tmp_path, capsys, overrides, flag):
  with pytest.raises(errors.UsageError) as raised:
    cli.run_training(_settings(tmp_path / 'out', 'bad', **overrides))
  assert errors.report(raised.value) == 2  # what bin/train prints, its exit status
  lines = [l for l in capsys.readouterr().err.strip().splitlines() if l.strip()]
  assert len(lines) == 1, lines
  assert flag in lines[0] and 'error' in lines[0]
  assert not os.path.exists(tmp_path / 'out' / 'bad' / 'metrics.csv')


def test_bad_decay_from_bin_train(tmp_path):
  result = subprocess.run(
      [sys.executable, TRAIN, '--local_steps=5', '--local_steps_schedule=exp',
       '--local_steps_decay=1.01', f'--root_output_dir={tmp_path}/out'],
      capture_output=True, text=True, timeout=300)
  assert result.returncode == 2
  lines = [l for l in result.stderr.strip().splitlines() if l.strip()]
  assert len(lines) == 1 and '--local_steps_decay' in lines[0], result.stderr
  assert not os.path.exists(tmp_path / 'out')
