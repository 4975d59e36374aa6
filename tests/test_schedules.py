"""Schedules, step accounting, runtime model and the quadratic toy (docs/algorithms.md#fedopt and #schedules)."""

import fractions
import json
import math

import numpy as np
import pytest

from tff_adaptive.accounting import runtime_model
from tff_adaptive.schedules import core as schedules
from tff_adaptive.schedules import local_steps
from tff_adaptive.schedules import quadratic_toy
from workflow.flags import schedule_flags


def _k_values(schedule, rounds):
  return [schedule.value(t) for t in rounds]


# ----------------------------------------------------------------------------
# Deterministic local-step schedules.

def test_exp_local_steps_values():
  s = schedule_flags.make_local_steps_schedule('exp', 33, decay=0.999)
  # 33 * 0.999**t: 33, 32.97, 12.13 (t=1000), 0.60 (t=3999).
  assert _k_values(s, [0, 1, 1000, 3999]) == [33, 33, 13, 1]
  assert all(isinstance(k, int) for k in _k_values(s, range(50)))
  # An exact product stays exact: 10 * 0.5**1 = 5, not 6.
  assert schedule_flags.make_local_steps_schedule('exp', 10, decay=0.5).value(1) == 5


def test_rounds_local_steps_cube_root_trap():
  # The trap is real in binary floating point ...
  assert math.ceil((1 / 1000)**(1 / 3) * 50) == 6
  s = schedule_flags.make_local_steps_schedule('rounds', 50)
  # ... but K_r for r = t + 1 = 1000 is ceil(50 / 10) = 5.
  assert s.value(999) == 5
  assert _k_values(s, [0, 1, 7, 124, 999, 124999]) == [50, 40, 25, 10, 5, 1]
  # Against the integer definition (smallest k with k**3 r >= K_0**3), by search.
  for k0 in (1, 3, 8, 10, 12, 30, 50, 60, 80):
    for r in range(1, 3000, 7):
      expected = next(k for k in range(1, k0 + 1) if k**3 * r >= k0**3)
      assert s.__class__(k0, schedules.LOCAL_STEPS).value(r - 1) == expected, (k0, r)


def test_theory_local_steps():
  s = schedule_flags.make_local_steps_schedule('theory', 10, b=3)
  # max(10 / (3 + t), 1), rounded up.
  assert _k_values(s, [0, 1, 2, 7, 100]) == [4, 3, 2, 1, 1]
  # 3 / (0.3 + 0) is 10 to the user, though 0.3 is stored slightly below 0.3.
  assert fractions.Fraction(3) / fractions.Fraction(0.3) > 10
  assert schedule_flags.make_local_steps_schedule('theory', 3, b=0.3).value(0) == 10


def test_constant_schedules():
  assert _k_values(schedule_flags.make_local_steps_schedule('constant', 7), [0, 9999]) == [7, 7]
  assert schedule_flags.make_lr_schedule('constant', 0.3).value(12345) == 0.3


# ----------------------------------------------------------------------------
# Learning-rate schedules.

def test_fedopt_lr_schedules():
  stair = schedule_flags.make_lr_schedule('exp_decay', 1.0, decay_rate=0.1, decay_steps=500,
                                          staircase=True)  # The paper's ExpDecay.
  assert stair.value(0) == 1.0 and stair.value(499) == 1.0
  assert stair.value(500) == pytest.approx(0.1, rel=1e-12)
  assert stair.value(1499) == pytest.approx(0.01, rel=1e-12)
  smooth = schedule_flags.make_lr_schedule('exp_decay', 2.0, decay_rate=0.1, decay_steps=500)
  assert smooth.value(250) == pytest.approx(2.0 / math.sqrt(10.0), rel=1e-12)
  lin = schedule_flags.make_lr_schedule('inv_lin_decay', 1.0, decay_rate=1.0, decay_steps=10)
  assert lin.value(10) == pytest.approx(0.5) and lin.value(30) == pytest.approx(0.25)
  lin_stair = schedule_flags.make_lr_schedule('inv_lin_decay', 1.0, decay_rate=1.0, decay_steps=10,
                                              staircase=True)
  assert lin_stair.value(19) == pytest.approx(0.5) and lin_stair.value(9) == 1.0
  sqrt = schedule_flags.make_lr_schedule('inv_sqrt_decay', 0.8, decay_rate=3.0, decay_steps=10)
  assert sqrt.value(10) == pytest.approx(0.4)


def test_decaying_k_papers_lr_schedules():
  exp = schedule_flags.make_lr_schedule('exp', 0.3, decay_rate=0.9996)
  assert exp.value(1000) == pytest.approx(0.3 * 0.9996**1000, rel=1e-12)
  assert exp.value(1000) < exp.value(999) < exp.value(0) == 0.3
  rounds = schedule_flags.make_lr_schedule('rounds', 0.1, flag_prefix='client')
  # eta_r = sqrt(1/r) eta_0 with r = t + 1.
  assert rounds.value(0) == 0.1
  assert rounds.value(3) == pytest.approx(0.05, rel=1e-15)
  assert rounds.value(99) == pytest.approx(0.01, rel=1e-15)


def test_linear_warmup():
  w = schedule_flags.make_lr_schedule('constant', 1.0, warmup_rounds=4)
  assert _k_values(w, [0, 1, 3, 10]) == [0.25, 0.5, 1.0, 1.0]
  w = schedule_flags.make_lr_schedule('exp_decay', 1.0, decay_rate=0.5, decay_steps=2,
                                      staircase=True, warmup_rounds=4)
  # Warm-up multiplies the decayed value; it does not delay the decay.
  assert _k_values(w, [0, 1, 2, 3, 4]) == [0.25, 0.5, 0.375, 0.5, 0.25]
  assert schedule_flags.make_lr_schedule('constant', 1.0, warmup_rounds=0).value(0) == 1.0


# ----------------------------------------------------------------------------
# Accounting.

@pytest.mark.parametrize('k0,decay,fraction', [
    (33, 0.999, 0.2601),   # The decaying-K paper: FEMNIST K=33, "3.8x fewer steps".
    (10, 0.9996, 0.5506),
    (3, 0.9996, 0.6467),
])
def test_step_fractions_4_decimals(k0, decay, fraction):
  s = schedule_flags.make_local_steps_schedule('exp', k0, decay=decay)
  ks = local_steps.local_steps_sequence(s, 4000)
  assert round(local_steps.step_fraction(ks, k0, clients_per_round=10), 4) == fraction


@pytest.mark.parametrize('k0,fraction', [(33, 0.51), (100, 0.50)])
def test_step_fractions_of_the_decaying_k_papers_table1(k0, fraction):
  s = schedule_flags.make_local_steps_schedule('exp', k0, decay=0.9996)
  ks = local_steps.local_steps_sequence(s, 4000)
  assert round(local_steps.step_fraction(ks, k0), 2) == fraction


def test_total_client_steps():
  assert local_steps.total_client_steps([3, 2, 1], 10) == 60
  assert local_steps.total_client_steps([3, 2, 1], [10, 5, 0]) == 40
  # Uneven participation weights rounds: (3*10 + 2*5 + 1*0) / (3*15).
  assert local_steps.step_fraction([3, 2, 1], 3, [10, 5, 0]) == pytest.approx(40 / 45)
  with pytest.raises(ValueError, match='clients_per_round'):
    local_steps.total_client_steps([3, 2, 1], [10, 5])
  with pytest.raises(ValueError, match='feedback'):
    local_steps.local_steps_sequence(schedule_flags.make_local_steps_schedule('error', 10), 5)


# ----------------------------------------------------------------------------
# Runtime model.

def test_runtime_model():
  x = 1_250_852  # The CIFAR100 CNN: 40.0 Mbit in thesis Table 5.1.
  assert round(runtime_model.floats_to_mbit(x), 1) == 40.0
  # 40.027264/20 + 50 * 0.31 + 40.027264/5.
  assert runtime_model.simulated_round_seconds(x, 50, 0.31) == pytest.approx(25.506816, rel=1e-12)
  # The slowest client sets the round time.
  assert runtime_model.simulated_round_seconds(x, [50, 10], [0.31, 2.0]) == pytest.approx(
      2.0013632 + 20.0 + 8.0054528, rel=1e-12)
  assert runtime_model.simulated_round_seconds(x, [5, 5], 0.1, up_mbps=[5.0, 1.0]) == pytest.approx(
      2.0013632 + 0.5 + 40.027264, rel=1e-12)
  # FedGBO-SGDm downloads |x| + |s|.
  assert runtime_model.simulated_round_seconds(x, 1, 0.0, down_floats=2 * x) == pytest.approx(
      4.0027264 + 8.0054528, rel=1e-12)
  assert runtime_model.simulated_total_seconds(x, [50, 25, 10], 0.31) == pytest.approx(
      3 * (2.0013632 + 8.0054528) + 85 * 0.31, rel=1e-12)


# ----------------------------------------------------------------------------
# Feedback-driven schedules.

def _loss_stream(num_rounds, seed=1):
  """Per-round first-minibatch losses: decaying, noisy, varying clients, a NaN."""
  rng = np.random.default_rng(seed)
  rounds = []
  for t in range(num_rounds):
    n = int(rng.integers(3, 8))
    losses = list(2.0 * np.exp(-t / 60.0) + 0.2 + 0.3 * rng.random(n))
    if t % 17 == 5:
      losses.append(float('nan'))
    rounds.append(losses)
  return rounds


def test_error_schedule_values_against_definition():
  window, k0, eta0 = 5, 20, 0.3
  k_sched = schedule_flags.make_local_steps_schedule('error', k0, window=window, total_rounds=200)
  lr_sched = schedule_flags.make_lr_schedule('error', eta0, window=window)
  assert k_sched.feedback == schedules.FEEDBACK_FIRST_MINIBATCH_LOSS
  stream = _loss_stream(120)
  finite = [[x for x in r if math.isfinite(x)] for r in stream]
  f0 = math.fsum(sum(finite[:window], [])) / len(sum(finite[:window], []))
  ks = []
  for t, losses in enumerate(stream):
    k, eta = k_sched.value(t), lr_sched.value(t)
    if t < window:
      assert (k, eta) == (k0, eta0)
    else:
      pooled = sum(finite[t - window:t], [])
      f_r = math.fsum(pooled) / len(pooled)
      ratio = fractions.Fraction(f_r) / fractions.Fraction(f0)
      expected = next(j for j in range(1, 10 * k0) if j**3 >= k0**3 * ratio)
      assert k == expected, t
      assert eta == pytest.approx(eta0 * math.sqrt(f_r / f0), rel=1e-12)
    ks.append(k)
    k_sched.observe(t, losses)
    lr_sched.observe(t, losses)
  assert ks[window] == k0  # F_window == F_0.
  # The loss falls to about a quarter of F_0, so K falls by about cbrt(4).
  assert ks[-1] < ks[window] - 4 and len(set(ks)) > 4


def test_error_schedule_resume_is_bit_identical():
  stream = _loss_stream(200, seed=7)

  def run(schedule, rounds):
    out = []
    for t in rounds:
      out.append(schedule.value(t))
      schedule.observe(t, stream[t])
    return out

  for make in (lambda: schedule_flags.make_local_steps_schedule('error', 33, window=25),
               lambda: schedule_flags.make_lr_schedule('error', 0.1, window=25, warmup_rounds=3)):
    straight = make()
    expected = run(straight, range(200))
    assert len(set(expected)) > 5  # The schedule actually moves.
    for stop in (10, 25, 87):
      first = make()
      head = run(first, range(stop))
      # Through JSON (exact float round-trip) ...
      resumed = schedules.schedule_from_state(json.loads(json.dumps(first.state())))
      # ... and through NumPy arrays, as a TFF program-state manager returns them.
      numpy_state = {k: (np.asarray(v) if not isinstance(v, dict) else
                         {kk: np.asarray(vv) for kk, vv in v.items()})
                     for k, v in first.state().items()}
      resumed_np = schedules.schedule_from_state(numpy_state)
      assert head + run(resumed, range(stop, 200)) == expected
      assert head + run(resumed_np, range(stop, 200)) == expected
      assert json.dumps(resumed.state()) == json.dumps(straight.state())


def test_error_schedule_requires_round_order():
  s = schedule_flags.make_local_steps_schedule('error', 10, window=3)
  s.observe(0, [1.0])
  with pytest.raises(ValueError, match='out of order'):
    s.observe(2, [1.0])
  with pytest.raises(ValueError, match='round 1'):
    s.value(5)


def test_step_schedule_plateau_and_resume():
  def fresh(quantity):
    if quantity == 'k':
      return schedule_flags.make_local_steps_schedule('step', 33, patience=3, min_delta=0.01)
    return schedule_flags.make_lr_schedule('step', 0.3, patience=3, min_delta=0.01)

  accuracies = [0.10, 0.20, 0.203, 0.205, 0.30, 0.302, 0.304, 0.306, 0.5]
  for quantity, high, low in (('k', 33, 4), ('lr', 0.3, 0.03)):
    s = fresh(quantity)
    assert s.feedback == schedules.FEEDBACK_VALIDATION_ACCURACY
    values = []
    for i, acc in enumerate(accuracies):
      t = 10 * i + 9  # Evaluated every 10 rounds.
      values.append(s.value(t))
      s.observe(t, acc)
      if i == 4:  # Mid-plateau checkpoint.
        s = schedules.schedule_from_state(json.loads(json.dumps(s.state())))
    # 0.203 and 0.205 do not beat 0.20 by more than 0.01, but 0.30 resets the
    # wait; 0.302, 0.304, 0.306 are three evaluations without improvement.
    assert s.decay_round == 10 * 7 + 9 + 1
    assert values[:8] == [high] * 8
    assert s.value(79) == high and s.value(80) == pytest.approx(low)
    # It decays once only, and a later improvement does not undo it.
    assert s.value(10_000) == pytest.approx(low)
  with pytest.raises(ValueError, match='not after'):
    s.observe(5, 0.9)


def test_step_schedule_defaults():
  s = schedule_flags.make_local_steps_schedule('step', 80)
  assert (s.patience, s.min_delta) == (local_steps.DEFAULT_PLATEAU_PATIENCE,
                                       local_steps.DEFAULT_PLATEAU_MIN_DELTA)
  for t in range(local_steps.DEFAULT_PLATEAU_PATIENCE):
    s.observe(t, 0.5)  # The first sets the best; the rest do not improve.
  assert s.value(local_steps.DEFAULT_PLATEAU_PATIENCE) == 80
  s.observe(local_steps.DEFAULT_PLATEAU_PATIENCE, float('nan'))
  assert s.value(local_steps.DEFAULT_PLATEAU_PATIENCE + 1) == 8


# ----------------------------------------------------------------------------
# Factory validation.

@pytest.mark.parametrize('kwargs,flag', [
    (dict(name='exp', k0=10, decay=1.5), '--local_steps_decay'),
    (dict(name='exp', k0=10, decay=0.0), '--local_steps_decay'),
    (dict(name='exp', k0=10, decay=-0.5), '--local_steps_decay'),
    (dict(name='exp', k0=10), '--local_steps_decay'),
    (dict(name='rounds', k0=10, decay=0.99), '--local_steps_decay'),
    (dict(name='constant', k0=10, window=5), '--schedule_window'),
    (dict(name='exp', k0=0, decay=0.99), '--local_steps'),
    (dict(name='rounds', k0=2.5), '--local_steps'),
    (dict(name='error', k0=10, window=500, total_rounds=100), '--schedule_window'),
    (dict(name='error', k0=10, window=0), '--schedule_window'),
    (dict(name='step', k0=10, patience=0), '--plateau_patience'),
    (dict(name='step', k0=10, min_delta=-1.0), '--plateau_min_delta'),
    (dict(name='exp', k0=10, decay=0.9, patience=3), '--plateau_patience'),
    (dict(name='theory', k0=10), '--local_steps_theory_b'),
    (dict(name='theory', k0=10, b=0.0), '--local_steps_theory_b'),
    (dict(name='rounds', k0=10, b=3.0), '--local_steps_theory_b'),
    (dict(name='linear', k0=10), '--local_steps_schedule'),
])
def test_local_steps_factory_errors_name_the_flag(kwargs, flag):
  name, k0 = kwargs.pop('name'), kwargs.pop('k0')
  with pytest.raises(ValueError) as e:
    schedule_flags.make_local_steps_schedule(name, k0, **kwargs)
  assert flag in str(e.value)
  assert flag + '_' not in str(e.value).replace(flag + '_schedule', '')


@pytest.mark.parametrize('kwargs,flag', [
    (dict(name='rounds', decay_rate=0.9), '--client_lr_decay_rate'),
    (dict(name='exp', decay_rate=1.01), '--client_lr_decay_rate'),
    (dict(name='exp'), '--client_lr_decay_rate'),
    (dict(name='exp', decay_rate=0.9, decay_steps=10), '--client_lr_decay_steps'),
    (dict(name='inv_sqrt_decay', decay_rate=-1.0), '--client_lr_decay_rate'),
    (dict(name='exp_decay', decay_rate=0.1, decay_steps=0), '--client_lr_decay_steps'),
    (dict(name='constant', staircase=True), '--client_lr_staircase'),
    (dict(name='constant', warmup_rounds=-1), '--client_lr_warmup_rounds'),
    (dict(name='error', window=50, total_rounds=20), '--schedule_window'),
    (dict(name='cosine'), '--client_lr_schedule'),
    (dict(name='constant', base=0.0), '--client_learning_rate'),
    (dict(name='rounds', decay_rate=0.9, flag_prefix='server'), '--server_lr_decay_rate'),
])
def test_lr_factory_errors_name_the_flag(kwargs, flag):
  name, base = kwargs.pop('name'), kwargs.pop('base', 0.1)
  with pytest.raises(ValueError) as e:
    schedule_flags.make_lr_schedule(name, base, **kwargs)
  assert flag in str(e.value)


def test_valid_factory_calls_do_not_raise():
  for name, kw in [('constant', {}), ('exp', {'decay': 1.0}), ('rounds', {}),
                   ('error', {'window': 100, 'total_rounds': 100}),
                   ('step', {'patience': 1, 'min_delta': 0.0}), ('theory', {'b': 1e-3})]:
    assert schedule_flags.make_local_steps_schedule(name, 1, **kw).value(0) >= 1
  for name, kw in [('exp_decay', {'decay_rate': 1.0}), ('inv_lin_decay', {'decay_rate': 0}),
                   ('exp', {'decay_rate': 0.99}), ('error', {}), ('step', {}),
                   ('rounds', {'warmup_rounds': 2})]:
    assert schedule_flags.make_lr_schedule(name, 0.5, flag_prefix='server', **kw).value(0) > 0


def test_deterministic_schedules_round_trip_state():
  for s in [schedule_flags.make_local_steps_schedule('exp', 10, decay=0.99),
            schedule_flags.make_local_steps_schedule('theory', 10, b=2.5),
            schedule_flags.make_lr_schedule('inv_sqrt_decay', 0.1, decay_rate=2.0, decay_steps=7,
                                            staircase=True, warmup_rounds=5)]:
    r = schedules.schedule_from_state(json.loads(json.dumps(s.state())))
    assert type(r) is type(s)
    assert _k_values(r, range(0, 400, 13)) == _k_values(s, range(0, 400, 13))


# ----------------------------------------------------------------------------
# The quadratic toy of decaying-K paper §3.

def test_quadratic_true_minimiser():
  assert round(quadratic_toy.TRUE_MINIMISER, 6) == 0.523373
  # K = 1 is distributed GD, whose fixed point 1/E_p[z] is the true minimiser.
  assert quadratic_toy.fixed_point(0.1, 1) == pytest.approx(quadratic_toy.TRUE_MINIMISER,
                                                            abs=1e-13)
  z, w = quadratic_toy.clients(1000)
  assert z.min() > 1.0 and z.max() < 3.0 and w.sum() == pytest.approx(1.0)


def test_quadratic_fixed_point_moves_away_with_k():
  fixed = [quadratic_toy.fixed_point(0.1, k) for k in (1, 2, 5, 10, 20)]
  assert all(a < b for a, b in zip(fixed, fixed[1:]))
  assert fixed[3] - quadratic_toy.TRUE_MINIMISER > 0.03


@pytest.mark.parametrize('k', [2, 10])
def test_quadratic_simulation_reaches_analytic_fixed_point(k):
  # Independent routes: Gauss-Legendre on the closed form vs. explicit client GD
  # steps on 1000 midpoint-rule clients.
  xs = quadratic_toy.simulate_fedsgd(k, 400, gamma=0.1, server_lr=1.0, x0=0.4)
  analytic = quadratic_toy.fixed_point(0.1, k)
  assert abs(xs[-1] - analytic) < 1e-6
  assert abs(xs[-1] - xs[-2]) < 1e-12  # Converged, not passing through.
  assert abs(xs[-1] - quadratic_toy.TRUE_MINIMISER) > 1e-3


def test_quadratic_decaying_k_approaches_true_minimiser():
  rounds = 3000
  constant = quadratic_toy.simulate_fedsgd(10, rounds, gamma=0.1)
  decaying = quadratic_toy.simulate_fedsgd(
      schedule_flags.make_local_steps_schedule('exp', 10, decay=0.995), rounds, gamma=0.1)
  err_const = abs(constant[-1] - quadratic_toy.TRUE_MINIMISER)
  err_decay = abs(decaying[-1] - quadratic_toy.TRUE_MINIMISER)
  assert err_const > 0.03
  assert err_decay < 1e-6
  # The decaying-K paper: d_K = 0.995 performs "84% less total SGD steps" than constant K = 10
  # over 3000 rounds (84.7%: the paper truncates).
  ks = local_steps.local_steps_sequence(
      schedule_flags.make_local_steps_schedule('exp', 10, decay=0.995), rounds)
  assert 0.84 <= 1.0 - local_steps.step_fraction(ks, 10) < 0.85


def test_quadratic_sampled_clients_are_seeded():
  a = quadratic_toy.simulate_fedsgd(10, 200, clients_per_round=10, server_lr=0.5, seed=3)
  b = quadratic_toy.simulate_fedsgd(10, 200, clients_per_round=10, server_lr=0.5, seed=3)
  c = quadratic_toy.simulate_fedsgd(10, 200, clients_per_round=10, server_lr=0.5, seed=4)
  assert np.array_equal(a, b) and not np.array_equal(a, c)
  # Sampling noise around the surrogate minimiser, not around x*.
  assert abs(np.mean(a[100:]) - quadratic_toy.fixed_point(0.1, 10)) < 0.02
