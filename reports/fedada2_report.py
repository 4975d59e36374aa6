"""The report that shows it works: FedAda2 and its baselines (the FedAda2 paper, docs/algorithms.md#fedada2).

Regenerate (from the repository root; reports/make_fedada2.sh runs exactly this):

  .venv/bin/python reports/fedada2_report.py --runs_dir=/tmp/fedada2_report

Runs, through bin/train's own flags (`report_runner`), with fixed (untuned)
hyperparameters listed in the report:
  * on `digits` and `synthetic`: FedAvg, FedAdam, DJA (Adam–Adam), no-PC
    (Adam–Adam) and FedAda2 (Adam–SM3-Adam), `ROUNDS` rounds each;
  * a DP variant on a Stack Overflow–shaped corpus read by the real
    `stackoverflow_tag` task (`so_shaped_data.py`; TFF's Stack Overflow itself is
    not on this machine): FedAvg, FedAdaGrad, DJA (AdaGrad–AdaGrad), no-PC
    (AdaGrad–AdaGrad) and FedAda2 (AdaGrad–SM3-AdaGrad), all with TFF's DP
    aggregator, the FedAda2 paper's DP setting in miniature;
then plots accuracy against rounds and against communicated bits and writes
reports/fedada2.md with the per-round communication and client-memory costs
that the processes measure (`cost/*` columns of metrics.csv).
"""

import math
import os
import sys
import time

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report_runner as rr  # pylint: disable=g-import-not-at-top

sys.path.insert(0, rr.ROOT)  # so_shaped_data reads with tasks/
import so_shaped_data  # pylint: disable=g-import-not-at-top

ROUNDS = 30
EVAL_EVERY = 3
COMMON = ['--local_steps=10', '--client_batch_size=10', '--clients_per_round=5', '--seed=0',
          f'--rounds_per_eval={EVAL_EVERY}', f'--rounds_per_checkpoint={ROUNDS}',
          f'--total_rounds={ROUNDS}', '--show_progress=false']
TASKS = {
    'digits': ['--task=digits', '--num_clients=20', '--partition=dirichlet',
               '--dirichlet_alpha=0.5', '--digits_model=mlp'],
    'synthetic': ['--task=synthetic', '--num_clients=30', '--synthetic_alpha=1',
                  '--synthetic_beta=1'],
}
# Joint methods share η, η_s so that they differ only in the preconditioner handling.
JOINT = ['--algorithm=fedada2', '--server_optimizer=adam', '--client_learning_rate=0.01',
         '--server_learning_rate=0.03']
METHODS = [
    ('fedavg', 'FedAvg', ['--algorithm=fedavg', '--client_learning_rate=0.1']),
    ('fedadam', 'FedAdam', ['--algorithm=fedadam', '--server_optimizer_semantics=paper',
                            '--client_learning_rate=0.1', '--server_learning_rate=0.03']),
    ('dja', 'DJA (Adam–Adam)', [*JOINT, '--client_optimizer=adam', '--preconditioner=dja']),
    ('nopc', 'no-PC (Adam–Adam)', [*JOINT, '--client_optimizer=adam', '--preconditioner=none']),
    ('fedada2', 'FedAda2 (Adam–SM3-Adam)',
     [*JOINT, '--client_optimizer=sm3_adam', '--preconditioner=none']),
]

# ---- DP on the Stack Overflow–shaped corpus ----
# Small on purpose: each Stack Overflow client's posts are read from SQLite every round, and
# each evaluation reads every client's test posts.
DP_CLIENTS, DP_PER_ROUND, DP_ROUNDS, DP_EVAL_EVERY = 200, 10, 20, 4
DP_WORDS, DP_TAGS = 100, 12
DP_NOISE, DP_CLIP = 0.7, 0.5
DP_COMMON = ['--task=stackoverflow_tag', '--local_steps=5', '--client_batch_size=8',
             f'--clients_per_round={DP_PER_ROUND}', '--seed=0',
             f'--rounds_per_eval={DP_EVAL_EVERY}', f'--rounds_per_checkpoint={DP_ROUNDS}',
             f'--total_rounds={DP_ROUNDS}', '--show_progress=false']
DP_FLAGS = ['--dp', f'--dp_clip_norm={DP_CLIP}', f'--dp_noise_multiplier={DP_NOISE}']
DP_JOINT = ['--algorithm=fedada2', '--server_optimizer=adagrad', '--client_learning_rate=0.1',
            '--server_learning_rate=0.1']
DP_METHODS = [
    ('fedavg', 'FedAvg', ['--algorithm=fedavg', '--client_learning_rate=30', *DP_FLAGS]),
    ('fedadagrad', 'FedAdaGrad', ['--algorithm=fedadagrad', '--server_optimizer_semantics=paper',
                                  '--client_learning_rate=30', '--server_learning_rate=0.1',
                                  *DP_FLAGS]),
    ('dja', 'DJA (AdaGrad–AdaGrad)',
     [*DP_JOINT, '--client_optimizer=adagrad', '--preconditioner=dja', *DP_FLAGS]),
    ('nopc', 'no-PC (AdaGrad–AdaGrad)',
     [*DP_JOINT, '--client_optimizer=adagrad', '--preconditioner=none', *DP_FLAGS]),
    ('fedada2', 'FedAda2 (AdaGrad–SM3-AdaGrad)',
     [*DP_JOINT, '--client_optimizer=sm3_adagrad', '--preconditioner=none', *DP_FLAGS]),
]


def main_jobs(runs_dir):
  return {(task, key): [*TASKS[task], *flags, *COMMON, f'--root_output_dir={runs_dir}/{task}',
                        f'--experiment_name={key}']
          for task in TASKS for key, _, flags in METHODS}


def dp_jobs(runs_dir, data_dir):
  return {('so_dp', key): [*DP_COMMON, f'--data_dir={data_dir}', *flags,
                           f'--root_output_dir={runs_dir}/so_dp', f'--experiment_name={key}']
          for key, _, flags in DP_METHODS}


def communicated_bits(cols):
  """Cumulative bits per client (download + upload), one value per round."""
  return [(d + u) for d, u in zip(cols['cost/cumulative_download_bits_per_client'],
                                  cols['cost/cumulative_upload_bits_per_client'])]


def plot(task, jobs, methods, metric, out, title):
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for key, label, _ in methods:
    cols = rr.read_columns(jobs[(task, key)])
    cols['bits'] = communicated_bits(cols)
    for ax, x in zip(axes, ('round', 'bits')):
      pts = rr.points(cols, x, metric)
      ax.plot([p[0] / (8 * 2**20) if x == 'bits' else p[0] for p in pts], [p[1] for p in pts],
              marker='.', label=label)
  axes[0].set_xlabel('round')
  axes[1].set_xlabel('MiB communicated per client (download + upload, cumulative)')
  for ax in axes:
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(out, dpi=100)
  plt.close(fig)


def _evals(cols, metric):
  return [v for _, v in rr.points(cols, 'round', metric)]


def _fmt(v, digits=3):
  return 'n/a' if v is None or (isinstance(v, float) and math.isnan(v)) else f'{v:.{digits}f}'


def main():
  parser = rr.report_parser(__doc__, '/tmp/fedada2_report')
  opts = parser.parse_args()
  started = time.monotonic()
  data_dir = os.path.join(opts.runs_dir, 'so_shaped_data')
  if not os.path.exists(os.path.join(data_dir, 'stackoverflow.sqlite')):
    so_shaped_data.write(data_dir, num_clients=DP_CLIENTS, num_words=DP_WORDS,
                         num_tags=DP_TAGS, topic_words=5)
  jobs = {**main_jobs(opts.runs_dir), **dp_jobs(opts.runs_dir, data_dir)}
  print(f'{len(jobs)} runs', flush=True)
  statuses = rr.run_all(list(jobs.values()), opts.jobs)
  minutes = (time.monotonic() - started) / 60
  figures = os.path.join(opts.out_dir, 'figures')
  os.makedirs(figures, exist_ok=True)
  for task in TASKS:
    plot(task, jobs, METHODS, 'eval/accuracy', os.path.join(figures, f'fedada2_{task}.png'),
         f'{task}: K=10, B=10, 5 clients/round')
  plot('so_dp', jobs, DP_METHODS, 'eval/recall_at_5', os.path.join(figures, 'fedada2_so_dp.png'),
       f'Stack Overflow–shaped tags, DP (C={DP_CLIP}, σ={DP_NOISE}, {DP_PER_ROUND} of '
       f'{DP_CLIENTS} clients/round)')
  write_markdown(opts, jobs, statuses, minutes)


def write_markdown(opts, jobs, statuses, minutes):
  lines = _setting_lines(opts, minutes)
  for task in TASKS:
    lines += _task_lines(task, jobs, statuses)
  lines += _memory_lines(jobs, statuses) + _dp_lines(jobs, statuses)
  rr.write_with_commands(lines, jobs, statuses, os.path.join(opts.out_dir, 'fedada2.md'))


def _setting_lines(opts, minutes) -> list:
  """The title, how it was made and the setting."""
  return rr.report_head('FedAda2 family: joint adaptivity, SM3 clients, DP (the FedAda2 paper)', 'fedada2', '/tmp/fedada2_report', minutes, opts.jobs) + [
      f'- `digits` (20 clients, Dirichlet α = 0.5 label split, MLP) and `synthetic(1, 1)` (30 '
      f'clients, multinomial logistic regression 60 → 10): K = 10 local steps, B = 10, 5 clients '
      f'per round, {ROUNDS} rounds, seed 0, evaluation every {EVAL_EVERY} rounds.',
      '- Hyperparameters are fixed, not tuned (one setting per method, the same on both tasks): '
      'FedAvg η = 0.1; FedAdam η = 0.1, η_s = 0.03 (FedOpt Algorithm 2 semantics, τ = 1e-3); '
      'the three joint methods share client η = 0.01 (Adam or SM3-Adam, β1 = 0.9, β2 = 0.99, '
      'ε = 1e-8 outside the √, no bias correction) and server Adam η_s = 0.03 (β1 = 0.9, '
      'β2 = 0.99, τ = 1e-3, Algorithm 2 semantics), so they differ only in how the client '
      'preconditioner starts (server v for DJA, zeros for no-PC / FedAda2) and in its form '
      '(dense or SM3). Differences of a few points between methods are within what tuning '
      'would change.',
      '- Communicated bits are the processes\' own `cost/` measurements per client: download = '
      'the model (+ the server\'s v for DJA) + 64 bits of round hyperparameters (η as float32, '
      'K as int32); upload = Δ.',
      '',
  ]


def _task_lines(task, jobs, statuses) -> list:
  """A task's figure and its table of methods."""
  lines = [f'## {task}', '', f'![{task}](figures/fedada2_{task}.png)', '',
           '| method | final accuracy | mean of last 3 evals | download bits / client / round '
           '| upload bits / client / round | MiB communicated per client (total) '
           '| client optimiser state (floats) |',
           '|---|---|---|---|---|---|---|']
  for key, label, _ in METHODS:
    args = jobs[(task, key)]
    if statuses.get(tuple(args)) != 'ok':
      lines.append(f'| {label} | {statuses.get(tuple(args))} | | | | | |')
      continue
    cols = rr.read_columns(args)
    acc = _evals(cols, 'eval/accuracy')
    lines.append(
        f'| {label} | {_fmt(acc[-1])} | {_fmt(sum(acc[-3:]) / 3)} '
        f'| {cols["cost/download_bits_per_client"][-1]:,.0f} '
        f'| {cols["cost/upload_bits_per_client"][-1]:,.0f} '
        f'| {communicated_bits(cols)[-1] / (8 * 2**20):.2f} '
        f'| {cols["cost/client_optimizer_state_floats"][-1]:,.0f} |')
  lines.append('')
  return lines


def _memory_lines(jobs, statuses) -> list:
  """Client optimiser state: measured on both tasks, and at Stack Overflow LR scale from
  the same formula."""
  # Imported late: only this table needs TF (SM3 cover sizes at Stack Overflow scale).
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tff_adaptive.optimizers import sm3  # pylint: disable=g-import-not-at-top
  lines = ['## Client optimiser memory', '',
           'Floats of client optimiser state besides the model (scalars such as η, β and the '
           'step counter excluded), as the processes report them in '
           '`cost/client_optimizer_state_floats`, and at the size of the FedAda2 paper\'s Stack Overflow '
           'logistic regression (10,000 × 500 kernel + 500 bias) from '
           '`sm3.client_state_floats`:', '',
           '| client optimiser | digits MLP (measured) | synthetic LR (measured) '
           '| Stack Overflow LR 10k×500 | formula |', '|---|---|---|---|---|']
  so_specs = [tf.TensorSpec((10000, 500)), tf.TensorSpec((500,))]
  measured = {}
  for task in TASKS:
    for key, _, _ in METHODS:
      if statuses.get(tuple(jobs[(task, key)])) == 'ok':
        measured[(task, key)] = rr.read_columns(jobs[(task, key)])[
            'cost/client_optimizer_state_floats'][-1]
  for name, key, formula in (('SGD (FedAvg, FedAdam)', 'fedavg', '0'),
                             ('Adam (DJA, no-PC)', 'nopc', '2\\|x\\|'),
                             ('SM3-Adam (FedAda2)', 'fedada2', '\\|x\\| + Σ covers')):
    opt = {'fedavg': 'sgd', 'nopc': 'adam', 'fedada2': 'sm3_adam'}[key]
    cells = [f'{measured[(t, key)]:,.0f}' if (t, key) in measured else 'n/a' for t in TASKS]
    lines.append(f'| {name} | {" | ".join(cells)} | '
                 f'{sm3.client_state_floats(opt, so_specs):,} | {formula} |')
  lines += ['', 'SM3-Adam\'s second moment costs Σ covers = rows + columns (+ bias diagonal): '
            '10,000 + 500 + 500 = 11,000 floats for the Stack Overflow LR instead of 5,000,500; '
            'its dense first moment remains |x|. (SM3-AdaGrad keeps no first moment: Σ covers '
            'only.)', '']
  return lines


def _dp_lines(jobs, statuses) -> list:
  """The DP variant: its setting and its table."""
  lines = ['## DP variant: Stack Overflow–shaped tag prediction', '',
           '![so dp](figures/fedada2_so_dp.png)', '',
           f'Data: `reports/so_shaped_data.py` writes a {DP_CLIENTS}-client corpus in TFF\'s '
           f'Stack Overflow layout (SQLite posts + word/tag count archives) with {DP_WORDS} words '
           f'and {DP_TAGS} tags whose topic words predict them (1–3 tags per post), non-IID tag '
           'preferences per client; the real `--task=stackoverflow_tag` pipeline reads it '
           '(TFF\'s bag-of-words preprocessing, sigmoid logistic regression '
           f'{DP_WORDS} → {DP_TAGS}, Recall@5 on {2 * DP_CLIENTS} test posts). TFF\'s Stack '
           'Overflow is not on this machine, and its 10k × 500 model is too slow here, so this '
           'is the FedAda2 paper\'s DP experiment in shape, not in scale.', '',
           f'Every DP run: TFF\'s `DifferentiallyPrivateFactory.gaussian_fixed` (clip C = '
           f'{DP_CLIP}, noise multiplier σ = {DP_NOISE}, uniform weighting), {DP_PER_ROUND} '
           f'clients per round of {DP_CLIENTS}, K = 5 local steps of B = 8, {DP_ROUNDS} rounds. '
           'Server AdaGrad (the FedAda2 paper\'s: v = Σ Δ̄² from 0, momentum β1 = 0.9, τ = 1e-3, '
           'η_s = 0.1); client AdaGrad / SM3-AdaGrad η = 0.1 (ε = 1e-8 outside the √); '
           'FedAvg / FedAdaGrad client SGD η = 30 (normalised bag-of-words inputs make '
           'gradients small). ε is the RDP accountant\'s (dp_accounting, Poisson sampling with '
           f'q = {DP_PER_ROUND}/{DP_CLIENTS}, δ = 1/{DP_CLIENTS}); bin/train samples clients '
           'uniformly without replacement within a round, so the Poisson accounting is the '
           'usual approximation.', '',
           '| method | final Recall@5 | mean of last 3 evals | ε after the last round (δ) '
           '| download bits / client / round | client optimiser state (floats) |',
           '|---|---|---|---|---|---|']
  for key, label, _ in DP_METHODS:
    args = jobs[('so_dp', key)]
    if statuses.get(tuple(args)) != 'ok':
      lines.append(f'| {label} | {statuses.get(tuple(args))} | | | | |')
      continue
    cols = rr.read_columns(args)
    rec = _evals(cols, 'eval/recall_at_5')
    eps = (f'{cols["dp/epsilon"][-1]:.2f} ({cols["dp/delta"][-1]:.0e})'
           if 'dp/epsilon' in cols else '∞ (no DP)')
    lines.append(f'| {label} | {_fmt(rec[-1])} | {_fmt(sum(rec[-3:]) / 3)} | {eps} '
                 f'| {cols["cost/download_bits_per_client"][-1]:,.0f} '
                 f'| {cols["cost/client_optimizer_state_floats"][-1]:,.0f} |')
  return lines


if __name__ == '__main__':
  main()
