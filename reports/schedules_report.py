"""The report that shows it works: decaying K vs constant K vs decaying γ (docs/algorithms.md#schedules).

The decaying-K paper ("Faster Federated Learning with Decaying Number of Local SGD
Steps") and thesis ch. 5. Regenerate from the repository root
(reports/make_schedules.sh runs exactly this):

  .venv/bin/python reports/schedules_report.py --runs_dir=/tmp/schedules_report

It writes reports/schedules.md and reports/figures/schedules_*.png from:
  1. decaying-K paper Table 1's step fractions, recomputed by `local_steps.step_fraction`;
  2. the quadratic toy (decaying-K paper §3): Figure 1 in NumPy
     (`quadratic_toy.simulate_fedsgd`, the decaying-K paper's setting: 10 of 1000
     clients per round, η = 0.001, 10 trials), and the same toy as a TFF
     federated process (`tff_adaptive.schedules.quadratic_toy`, full participation)
     with constant K, decaying K and decaying γ;
  3. `digits` runs through bin/train's own flags (each is printed as a
     bin/train command line): FedSGD with constant K and γ, decaying γ,
     decaying K (exp, rounds, error, step) and K = 1, then bin/plot curves
     against rounds, cumulative client steps and simulated minutes.
Finished runs in --runs_dir are reused (bin/train resumes them at their end).
"""

import argparse
import importlib.util
import math
import os
import shlex
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from tff_adaptive.schedules import core as schedules  # pylint: disable=g-import-not-at-top
from tff_adaptive.schedules import learning_rate  # pylint: disable=g-import-not-at-top
from tff_adaptive.schedules import local_steps  # pylint: disable=g-import-not-at-top
from tff_adaptive.schedules import quadratic_toy  # pylint: disable=g-import-not-at-top
import report_runner as rr  # pylint: disable=g-import-not-at-top,wrong-import-position

FIGURES = os.path.join(ROOT, 'reports', 'figures')
REPORT = os.path.join(ROOT, 'reports', 'schedules.md')


def _exp_k(k0, decay):
  """The decaying-K paper's K_t = ⌈K_0 d^t⌉."""
  return learning_rate.ExponentialDecay(k0, decay, quantity=schedules.LOCAL_STEPS)


# ---- 1. decaying-K paper Table 1 (4000 rounds; decay rates from its Table 5) ----
TABLE1 = [  # (dataset, K_0, d_K, fraction printed in decaying-K paper Table 1)
    ('StackOverflow', 10, 0.9996, 0.55), ('StackOverflow', 33, 0.9996, 0.51),
    ('StackOverflow', 100, 0.9996, 0.50), ('FEMNIST', 3, 0.9996, 0.65),
    ('FEMNIST', 10, 0.9996, 0.55), ('FEMNIST', 33, 0.999, 0.26),
    ('Shakespeare', 10, 0.9996, 0.55), ('Shakespeare', 33, 0.9996, 0.51),
    ('Shakespeare', 100, 0.9996, 0.50)]

# ---- 3. digits ----
ROUNDS = 60
EVAL_EVERY = 2
K0 = 30
GAMMA = 0.1
DECAY = 0.95
BETA = 0.017  # s per minibatch: thesis Table 5.2's FEMNIST DNN on a Raspberry Pi 3B+
COMMON = ['--task=digits', '--num_clients=20', '--partition=dirichlet', '--dirichlet_alpha=0.1',
          '--digits_model=mlp', '--clients_per_round=5', '--client_batch_size=10',
          '--algorithm=fedavg', f'--client_learning_rate={GAMMA}', '--server_learning_rate=1.0',
          f'--total_rounds={ROUNDS}', f'--rounds_per_eval={EVAL_EVERY}',
          f'--rounds_per_checkpoint={ROUNDS}', f'--step_time_seconds={BETA}', '--seed=0',
          '--show_progress=false']
RUNS = [  # (name, label, flags)
    ('k_fixed', f'Kγ-fixed (K={K0})', [f'--local_steps={K0}']),
    ('gamma_exp', f'γ-exp (d={DECAY})',
     [f'--local_steps={K0}', '--client_lr_schedule=exp', f'--client_lr_decay_rate={DECAY}']),
    ('k_exp', f'K-exp (d={DECAY})',
     [f'--local_steps={K0}', '--local_steps_schedule=exp', f'--local_steps_decay={DECAY}']),
    ('k_rounds', 'K-rounds (∛(1/r))', [f'--local_steps={K0}', '--local_steps_schedule=rounds']),
    ('k_error', 'K-error (s=10)',
     [f'--local_steps={K0}', '--local_steps_schedule=error', '--schedule_window=10']),
    ('k_step', 'K-step (patience 5)',
     [f'--local_steps={K0}', '--local_steps_schedule=step', '--plateau_patience=5']),
    ('dsgd', 'dSGD (K=1)', ['--local_steps=1']),
]


def command_line(args):
  return ' '.join(['.venv/bin/python bin/train.py', *map(shlex.quote, args)])


def _load_train_flags():
  """bin/train's flag definitions (its main() is not run)."""
  spec = importlib.util.spec_from_file_location('bin_train', os.path.join(ROOT, 'bin', 'train.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.FLAGS


def train(flag_values, args) -> str:
  """Exactly `bin/train.py args`, in this process (TF/TFF imported once)."""
  from workflow.flags import config  # pylint: disable=g-import-not-at-top
  from workflow.flags import train_flags  # pylint: disable=g-import-not-at-top
  from workflow.training import cli  # pylint: disable=g-import-not-at-top
  flag_values.unparse_flags()
  flag_values(['bin/train.py', *args])
  # The flags as given (no preset, no algorithm defaults), as this report always ran them.
  settings = config.from_flags(train_flags.config_from_flags(flag_values))
  try:
    cli.run_training(settings)
  except SystemExit as e:
    return f'exit {e.code}'
  return 'ok'


def evaluated(cols, x, y):
  return [(a, b) for a, b in zip(cols[x], cols[y]) if not math.isnan(b)]


# ---- 2. the toy ----
TOY_ROUNDS = 3000
TOY_TRIALS = 10
# decaying-K paper §3 says η = 0.001 with M = 10 clients per round. With the MEAN of
# the 10 client updates that barely moves in 3000 rounds (K = 1 contracts by
# 2e-4 per round), while its Figure 1 has the decaying-γ curve overshooting x*
# near round 500; η = 0.001 on the SUM of the 10 updates, i.e. 0.01 on their
# mean, reproduces that timing.
TOY_SERVER_LR = 0.01


def toy_numpy_figure(out):
  """decaying-K paper Figure 1: |x_t − x*| for constant K, decaying γ and decaying K."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  x_star = quadratic_toy.TRUE_MINIMISER

  def mean_run(k, gamma=0.1):
    runs = [quadratic_toy.simulate_fedsgd(k, TOY_ROUNDS, gamma=gamma, server_lr=TOY_SERVER_LR,
                                          clients_per_round=10, seed=s)
            for s in range(TOY_TRIALS)]
    return np.mean(runs, axis=0)

  exp_g = lambda d: learning_rate.ExponentialDecay(0.1, d)
  panels = {
      '(a) constant γ = 0.1, and decaying γ': [
          ('K = 1', mean_run(1)), ('K = 10', mean_run(10)), ('K = 20', mean_run(20)),
          ('K = 50', mean_run(50)), ('K = 10, d_γ = 0.995', mean_run(10, exp_g(0.995)))],
      '(b) decaying K from K_0 = 10, constant γ': [
          ('K = 10', mean_run(10)), ('d_K = 0.99', mean_run(_exp_k(10, 0.99))),
          ('d_K = 0.995', mean_run(_exp_k(10, 0.995))),
          ('d_K = 0.9995', mean_run(_exp_k(10, 0.9995)))],
  }
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
  finals = {}
  for ax, (title, curves) in zip(axes, panels.items()):
    for label, xs in curves:
      ax.semilogy(np.abs(xs - x_star) + 1e-12, label=label)
      finals[(title[:3], label)] = xs[-1]
    ax.set_title(title)
    ax.set_xlabel('round')
    ax.set_ylabel('|x_t − x*| (mean of 10 trials)')
    ax.legend()
  fig.tight_layout()
  fig.savefig(out, dpi=110)
  plt.close(fig)
  return finals


TOY_CLIENTS = 8


def toy_tff():
  """The toy as a TFF federated process: constant K, decaying K, decaying γ."""
  from tff_adaptive.schedules import quadratic_toy as qt  # pylint: disable=g-import-not-at-top
  from tff_adaptive.execution import runtime  # pylint: disable=g-import-not-at-top
  runtime.use_local_cpp_context()
  try:
    process = qt.build_process(0.1, 10)
    runs = {
        'constant K = 10 (η_s = 1, 10 rounds)': qt.run(
            qt.driver_for(schedules.ConstantSchedule(10, schedules.LOCAL_STEPS)), 10,
            num_clients=TOY_CLIENTS, process=process),
        'K-exp d_K = 0.7 (η_s = 2, 24 rounds)': qt.run(
            qt.driver_for(_exp_k(10, 0.7), server_lr=2.0), 24, num_clients=TOY_CLIENTS,
            process=process),
        'γ-exp d_γ = 0.7, K = 10 (η_s = 2, 24 rounds)': qt.run(
            qt.driver_for(schedules.ConstantSchedule(10, schedules.LOCAL_STEPS), gamma_decay=0.7,
                          server_lr=2.0), 24,
            num_clients=TOY_CLIENTS, process=process),
    }
  finally:
    runtime.shutdown_workers()
  return {name: (xs[-1], rows[-1]['cost/cumulative_client_steps']
                 if 'cost/cumulative_client_steps' in rows[-1]
                 else sum(r['cost/client_steps'] for r in rows),
                 rows[-1].get('schedule/step_fraction_vs_constant_k0'))
          for name, (xs, rows) in runs.items()}


def plot(runs_dir, names, labels, x, out, metrics='eval/accuracy,eval/loss'):
  cmd = [sys.executable, os.path.join(ROOT, 'bin', 'plot.py'),
         '--runs=' + ','.join(os.path.join(runs_dir, n) for n in names),
         '--labels=' + ','.join(labels), f'--x={x}', f'--metrics={metrics}', f'--out={out}']
  subprocess.run(cmd, check=True, capture_output=True, text=True)
  return ' '.join(['.venv/bin/python bin/plot.py', *map(shlex.quote, cmd[2:])]).replace(
      ROOT + '/', '')


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--runs_dir', default='/tmp/schedules_report')
  parser.add_argument('--skip_tff_toy', action='store_true')
  opts = parser.parse_args()
  os.makedirs(FIGURES, exist_ok=True)
  started = time.monotonic()

  # 1. Step fractions.
  table1 = []
  for dataset, k0, d, paper in TABLE1:
    seq = local_steps.local_steps_sequence(_exp_k(k0, d), 4000)
    table1.append((dataset, k0, d, paper, local_steps.step_fraction(seq, k0)))
  toy_seq = local_steps.local_steps_sequence(_exp_k(10, 0.995), 3000)
  toy_fraction = local_steps.step_fraction(toy_seq, 10)

  # 2. Toy.
  print('toy (NumPy) ...', flush=True)
  toy_finals = toy_numpy_figure(os.path.join(FIGURES, 'schedules_toy.png'))
  toy_tff_results = None
  if not opts.skip_tff_toy:
    print('toy (TFF process) ...', flush=True)
    toy_tff_results = toy_tff()

  # 3. digits.
  flag_values = _load_train_flags()
  from absl import logging  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.WARNING)
  commands = []
  timing = {'trained': [], 'reused': []}  # run name -> wall seconds of this invocation
  for name, label, flags in RUNS:
    args = [*COMMON, *flags, f'--root_output_dir={opts.runs_dir}', f'--experiment_name={name}']
    reused = _finished(os.path.join(opts.runs_dir, name))
    t0 = time.monotonic()
    status = train(flag_values, args)
    seconds = time.monotonic() - t0
    timing['reused' if reused else 'trained'].append((name, seconds))
    print(f'  [{status}{", reused" if reused else ""}, {seconds:.0f}s] {command_line(args)}',
          flush=True)
    commands.append(command_line(args))
    if status != 'ok':
      raise SystemExit(f'run {name} failed ({status})')
  names = [r[0] for r in RUNS]
  labels = [r[1] for r in RUNS]
  plot_cmds = []
  for x, suffix in (('round', 'rounds'), ('cost/cumulative_client_steps', 'steps'),
                    ('sim/cumulative_minutes', 'minutes')):
    plot_cmds.append(plot(opts.runs_dir, names, labels, x,
                          os.path.join(FIGURES, f'schedules_digits_{suffix}.png')))
  plot_cmds.append(plot(opts.runs_dir, names, labels, 'round',
                        os.path.join(FIGURES, 'schedules_digits_k.png'),
                        metrics='schedule/local_steps,schedule/client_learning_rate,'
                                'train/client_work/first_minibatch_loss'))

  results = {}
  for name, label, _ in RUNS:
    cols = rr.read_csv_columns(os.path.join(opts.runs_dir, name, 'metrics.csv'))
    acc = [a for _, a in evaluated(cols, 'round', 'eval/accuracy')]
    results[name] = dict(
        label=label, max_acc=max(acc), last_acc=float(np.mean(acc[-5:])),
        steps=cols['cost/cumulative_client_steps'][-1],
        fraction=cols['schedule/step_fraction_vs_constant_k0'][-1],
        minutes=cols['sim/cumulative_minutes'][-1],
        final_k=cols['schedule/local_steps'][-1])
  write_report(results, table1, toy_fraction, toy_finals, toy_tff_results, commands, plot_cmds,
               opts.runs_dir, time.monotonic() - started, timing)
  print(REPORT)


def _minutes_to(cols_path, target):
  cols = rr.read_csv_columns(cols_path)
  for minutes, acc in evaluated(cols, 'sim/cumulative_minutes', 'eval/accuracy'):
    if acc >= target:
      return minutes
  return None


def _finished(run_dir: str) -> bool:
  """Whether the run already holds all ROUNDS rounds (bin/train then only reloads it)."""
  try:
    rounds = rr.read_csv_columns(os.path.join(run_dir, 'metrics.csv')).get('round', [])
  except FileNotFoundError:
    return False
  return bool(rounds) and rounds[-1] >= ROUNDS


def timing_text(seconds: float, timing: dict, runs_dir: str, load: float) -> str:
  """What the invocation that wrote the report measured, and what it reused."""
  trained, reused = timing['trained'], timing['reused']
  text = (f'the invocation that wrote this file took {seconds / 60:.1f} minutes wall clock on a '
          f'2-core machine with load average {load:.1f}; ')
  if not reused:
    text += (f'it trained all {len(trained)} digits runs ({sum(t for _, t in trained) / 60:.1f} '
             'minutes of it), i.e. this is a from-scratch time')
  elif not trained:
    text += (f'it reused all {len(reused)} digits runs already finished in `{runs_dir}` (so this '
             'is not a from-scratch time, which was not measured)')
  else:
    text += (f'it trained {len(trained)} digits runs ({", ".join(n for n, _ in trained)}: '
             f'{sum(t for _, t in trained) / 60:.1f} minutes) and reused {len(reused)} already '
             f'finished in `{runs_dir}` (so this is not a from-scratch time)')
  return text


def write_report(results, table1, toy_fraction, toy_finals, toy_tff_results, commands,
                 plot_cmds, runs_dir, seconds, timing):
  lines = _step_fraction_lines(table1, toy_fraction, runs_dir, seconds, timing)
  lines += _toy_lines(toy_finals)
  if toy_tff_results:
    lines += _toy_tff_lines(toy_tff_results)
  lines += _digits_lines(results, runs_dir) + _digits_verdict_lines(results, commands, plot_cmds)
  with open(REPORT, 'w') as f:
    f.write('\n'.join(lines))


def _step_fraction_lines(table1, toy_fraction, runs_dir, seconds, timing) -> list:
  """The title, how it was made, and the step fractions of decaying-K paper Table 1."""
  lines = [
      '# Decaying local steps and learning rates (docs/algorithms.md#schedules)',
      '',
      'The decaying-K paper ("Faster Federated Learning with Decaying Number of Local SGD Steps") and '
      'thesis ch. 5. Regenerate with `reports/make_schedules.sh` (runs go to '
      f'`{runs_dir}`; {timing_text(seconds, timing, runs_dir, os.getloadavg()[1])}). '
      'Everything below is produced by that script.',
      '',
      '## Step fractions: decaying-K paper Table 1',
      '',
      'Fraction of client SGD steps of K_t = ⌈K_0 d^t⌉ against constant K_0 over 4000 rounds, '
      '`local_steps.step_fraction` (decay rates from decaying-K paper Table 5; its FEMNIST K_0 = 33 '
      'column uses d_K = 0.999, the abstract\'s "3.8×").',
      '',
      '| dataset | K_0 | d_K | decaying-K paper Table 1 | recomputed |',
      '|---|---|---|---|---|',
  ]
  for dataset, k0, d, paper, ours in table1:
    lines.append(f'| {dataset} | {k0} | {d} | {paper:.2f} | {ours:.4f} |')
  lines += [
      '',
      f'The toy\'s K_0 = 10, d_K = 0.995 over 3000 rounds uses {toy_fraction:.4f} of the steps '
      f'(decaying-K paper §3: "84% less"). 1/0.2601 = {1 / 0.2601:.2f}×.',
      '',
  ]
  return lines


def _toy_lines(toy_finals) -> list:
  """The quadratic toy in NumPy: its fixed points and final iterates per schedule."""
  x_star = quadratic_toy.TRUE_MINIMISER
  lines = [
      '## The quadratic toy (decaying-K paper §3)',
      '',
      'f(x; z) = ½zx² − x, p(z) ∝ z^(−1/2) on [1, 3]; true minimiser '
      f'x* = {x_star:.6f}; FedSGD\'s fixed point with constant γ = 0.1 is '
      'x̃*(γ, K) = E_p[(1−(1−γz)^K)/z] / E_p[1−(1−γz)^K]: '
      + ', '.join(f'K = {k}: {quadratic_toy.fixed_point(0.1, k):.4f}'
                  for k in (1, 10, 20, 50)) + '.',
      '',
      '![toy](figures/schedules_toy.png)',
      '',
      'decaying-K paper Figure 1\'s setting (NumPy, `quadratic_toy.simulate_fedsgd`): 10 of 1000 '
      'clients per round, γ = 0.1, x_1 = 0.4, mean of 10 trials, '
      f'{TOY_ROUNDS} rounds, server step η = {TOY_SERVER_LR} on the mean client update. The decaying-K paper '
      'says η = 0.001; on the mean of 10 updates that hardly moves in 3000 rounds (K = 1 '
      'contracts by 2e-4 per round), whereas its Figure 1 shows decaying γ overshooting x* near '
      'round 500 — which 0.001 on the SUM of the 10 updates (= 0.01 on their mean) reproduces. '
      'Final |x − x*| (the sampling noise floor is a few 1e-4):',
      '',
      '| panel | schedule | final x | abs(x − x*) |',
      '|---|---|---|---|',
  ]
  for (panel, label), x in toy_finals.items():
    lines.append(f'| {panel} | {label} | {x:.5f} | {abs(x - x_star):.2e} |')
  lines += [
      '',
      'As in the decaying-K paper: with constant γ the iterate settles further from x* the larger K is; '
      'decaying γ or decaying K both remove the bias; too fast a K decay (0.99) is slow like '
      'K = 1, too slow a decay (0.9995) has not yet shed the bias.',
      '',
  ]
  return lines


def _toy_tff_lines(toy_tff_results) -> list:
  """The same toy as a TFF federated process, against its analytic fixed points."""
  x_star = quadratic_toy.TRUE_MINIMISER
  lines = [
      f'The same toy as a TFF federated process (`tff_adaptive.schedules.quadratic_toy`: the package\'s '
      f'FedAvg/FedSGD with K_t and γ_t set by `round_schedules`, {TOY_CLIENTS} '
      'equal-probability clients, full participation, so the run is deterministic):',
      '',
      '| run | final x | abs(x − x*) | analytic x̃* (these clients) | client steps | '
      'step fraction |',
      '|---|---|---|---|---|---|',
  ]
  from tff_adaptive.schedules import quadratic_toy as qt  # pylint: disable=g-import-not-at-top
  for name, (x, steps, fraction) in toy_tff_results.items():
    analytic = (qt.discrete_fixed_point(0.1, 10, TOY_CLIENTS) if name.startswith('constant')
                else qt.discrete_fixed_point(0.1, 1, TOY_CLIENTS))
    frac = '' if fraction is None else f'{fraction:.3f}'
    lines.append(f'| {name} | {x:.6f} | {abs(x - x_star):.2e} | {analytic:.6f} | '
                 f'{steps:.0f} | {frac} |')
  lines += ['', 'Constant K lands on x̃*(0.1, 10) of these clients; decaying K lands on their '
            'K = 1 fixed point 1/E[z] (the true minimiser up to the 8-client discretisation, '
            '2e-4); decaying γ this fast stops moving before it gets there.', '']
  return lines


def _digits_lines(results, runs_dir) -> list:
  """The digits runs: their setting and their table."""
  target = 0.95 * results['k_fixed']['max_acc']
  lines = [
      '## digits: constant K, decaying γ, decaying K',
      '',
      f'FedSGD (server SGD, η_s = 1) on `digits` (20 clients, Dirichlet α = 0.1 label skew, MLP), '
      f'5 clients per round, batch 10, γ_0 = {GAMMA}, K_0 = {K0}, {ROUNDS} rounds, one seed, '
      f'evaluation every {EVAL_EVERY} rounds. Runtime model: β = {BETA} s per minibatch '
      '(thesis Table 5.2, FEMNIST DNN on a Raspberry Pi), D = 20 and U = 5 Mbit/s, model size '
      'from the process\'s measured bits.',
      '',
      '| schedule | max test acc | mean of last 5 evals | client steps | fraction of Kγ-fixed steps '
      f'| simulated minutes | minutes to {target:.3f} acc | final K |',
      '|---|---|---|---|---|---|---|---|',
  ]
  for name, r in results.items():
    reach = _minutes_to(os.path.join(runs_dir, name, 'metrics.csv'), target)
    reach = '—' if reach is None else f'{reach:.2f}'
    lines.append(f'| {r["label"]} | {r["max_acc"]:.4f} | {r["last_acc"]:.4f} | {r["steps"]:.0f} | '
                 f'{r["fraction"]:.3f} | {r["minutes"]:.2f} | {reach} | {r["final_k"]:.0f} |')
  return lines


def _digits_verdict_lines(results, commands, plot_cmds) -> list:
  """Decaying K against constant K and decaying γ, the figures and the commands."""
  fixed, gamma, kexp = results['k_fixed'], results['gamma_exp'], results['k_exp']
  verdict_fixed = kexp['max_acc'] >= fixed['max_acc']
  verdict_gamma = kexp['max_acc'] >= gamma['max_acc']
  return [
      '',
      f'Decaying K (exp, d = {DECAY}) reached a best test accuracy of {kexp["max_acc"]:.4f}, '
      f'{"at least" if verdict_fixed else "below"} constant K ({fixed["max_acc"]:.4f}) and '
      f'{"at least" if verdict_gamma else "below"} decaying γ ({gamma["max_acc"]:.4f}), with '
      f'{kexp["fraction"]:.2f} of their client SGD steps and {kexp["minutes"]:.1f} instead of '
      f'{fixed["minutes"]:.1f} simulated minutes. One seed and {ROUNDS} rounds: differences of a '
      'point or so in accuracy are within run-to-run noise.',
      '',
      '![accuracy vs rounds](figures/schedules_digits_rounds.png)',
      '',
      '![accuracy vs cumulative client steps](figures/schedules_digits_steps.png)',
      '',
      '![accuracy vs simulated minutes](figures/schedules_digits_minutes.png)',
      '',
      'K_t, γ_t and the first-minibatch loss (the error schedule\'s signal) per round:',
      '',
      '![schedules](figures/schedules_digits_k.png)',
      '',
      '## Commands',
      '',
      '```',
      *commands,
      *plot_cmds,
      '```',
      '',
  ]


if __name__ == '__main__':
  main()
