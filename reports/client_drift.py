"""Client drift of FedAvg vs FedGBO-SGDm, β ∈ {0.5, 0.9, 0.99}, on digits (FedGBO paper Fig. 6.1).

Regenerate (from the repository root):

  .venv/bin/python reports/client_drift.py --runs_dir=/tmp/client_drift

Runs four bin/train command lines (printed; each is exactly a `bin/train.py`
invocation, run in this one process through `cli.run_training` so TF and TFF
are imported once) with `--measure_client_drift`, the same task, seed, client
samples and learning rate, then plots the per-round mean pairwise cosine
distance between the sampled clients' updates Δ_i (`delta`) and between their
uploaded models y_i (`model`), and writes reports/client_drift.png and a
markdown table (printed, and reports/client_drift_table.md). Runs found
complete in --runs_dir are not rerun (bin/train resumes).
"""

import argparse
import csv
import importlib.util
import math
import os
import shlex
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

ROUNDS = 30
EVAL_EVERY = 10
COMMON = ['--task=digits', '--num_clients=20', '--partition=dirichlet', '--dirichlet_alpha=0.5',
          '--digits_model=mlp', '--local_steps=10', '--client_batch_size=32',
          '--clients_per_round=5', '--client_learning_rate=0.1', '--seed=0',
          '--measure_client_drift', f'--total_rounds={ROUNDS}', f'--rounds_per_eval={EVAL_EVERY}',
          f'--rounds_per_checkpoint={ROUNDS}', '--show_progress=false']
# FedGBO-SGDm with β = 0 is FedAvg (docs/algorithms.md#fedgbo); FedAvg is run as itself.
METHODS = [('fedavg', 'FedAvg', ['--algorithm=fedavg'])] + [
    (f'fedgbo_sgdm_{beta}', f'FedGBO-SGDm β={beta}',
     ['--algorithm=fedgbo', '--client_optimizer=sgdm', f'--client_beta_1={beta}'])
    for beta in (0.5, 0.9, 0.99)]
DELTA = 'train/client_drift/delta_cosine_distance'
MODEL = 'train/client_drift/model_cosine_distance'


def _flags():
  spec = importlib.util.spec_from_file_location('bin_train', os.path.join(ROOT, 'bin', 'train.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)  # defines bin/train's flags; main() is not run
  return module.FLAGS


def _args(runs_dir, name, extra):
  return [*COMMON, *extra, f'--root_output_dir={runs_dir}', f'--experiment_name={name}']


def _read(path):
  with open(path, newline='') as f:
    rows = list(csv.DictReader(f))
  return {k: np.array([float(r[k]) if r.get(k) not in (None, '') else math.nan for r in rows])
          for k in rows[0]}


def _complete(path):
  return os.path.exists(path) and len(_read(path)['round']) >= ROUNDS


def run(runs_dir):
  from workflow.flags import config  # pylint: disable=g-import-not-at-top
  from workflow.flags import train_flags  # pylint: disable=g-import-not-at-top
  from workflow.training import cli  # pylint: disable=g-import-not-at-top
  flag_values = None
  for name, _, extra in METHODS:
    args = _args(runs_dir, name, extra)
    print('.venv/bin/python bin/train.py ' + ' '.join(map(shlex.quote, args)), flush=True)
    if _complete(os.path.join(runs_dir, name, 'metrics.csv')):
      print('  (complete, not rerun)')
      continue
    flag_values = flag_values or _flags()
    flag_values.unparse_flags()
    flag_values(['bin/train.py', *args])
    # The flags as given (no preset, no algorithm defaults): the runs these figures were made of.
    settings = config.from_flags(train_flags.config_from_flags(flag_values))
    started, cpu = time.monotonic(), time.process_time()
    cli.run_training(settings)
    print(f'  {time.monotonic() - started:.0f}s wall, {time.process_time() - cpu:.0f}s CPU',
          flush=True)


def _smooth(y, window=5):
  out = np.full_like(y, np.nan)
  for i in range(len(y)):
    out[i] = np.nanmean(y[max(0, i - window + 1):i + 1])
  return out


def report(runs_dir, out_png, out_table):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 2, figsize=(11, 3.9))
  lines = ['| Method | mean Δ cosine distance, rounds 1–10 | rounds 21–30 | all rounds | '
           'mean model cosine distance (all rounds) | test accuracy after round 30 |',
           '|---|---|---|---|---|---|']
  for (name, label, _), color in zip(METHODS, ('k', 'tab:blue', 'tab:orange', 'tab:green')):
    cols = _read(os.path.join(runs_dir, name, 'metrics.csv'))
    rounds = cols['round']
    for ax, key in zip(axes, (DELTA, MODEL)):
      ax.plot(rounds, cols[key], color=color, alpha=0.25, lw=0.8)
      ax.plot(rounds, _smooth(cols[key]), color=color, lw=1.8, label=label)
    accuracy = cols['eval/accuracy'][~np.isnan(cols['eval/accuracy'])]
    lines.append(f'| {label} | {np.mean(cols[DELTA][:10]):.3f} | {np.mean(cols[DELTA][-10:]):.3f} '
                 f'| {np.mean(cols[DELTA]):.3f} | {np.mean(cols[MODEL]):.2e} '
                 f'| {accuracy[-1]:.3f} |')
  axes[0].set_title('updates Δ_i = x_t − y_i')
  axes[1].set_title('uploaded models y_i')
  axes[1].set_yscale('log')
  for ax in axes:
    ax.set_xlabel('round')
    ax.set_ylabel('mean pairwise cosine distance')
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.suptitle('Client drift on digits (20 clients, Dirichlet α=0.5, 5 per round, K=10, η=0.1); '
               'thin: per round, thick: 5-round mean', fontsize=9)
  fig.tight_layout()
  fig.savefig(out_png, dpi=120)
  table = '\n'.join(lines) + '\n'
  with open(out_table, 'w') as f:
    f.write(table)
  print(table)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--runs_dir', default='/tmp/client_drift')
  parser.add_argument('--report_only', action='store_true', help='Plot existing runs only.')
  args = parser.parse_args()
  if not args.report_only:
    run(args.runs_dir)
  report(args.runs_dir, os.path.join(ROOT, 'reports', 'client_drift.png'),
         os.path.join(ROOT, 'reports', 'client_drift_table.md'))


if __name__ == '__main__':
  main()
