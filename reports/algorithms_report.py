"""The report that shows it works: six algorithms on digits and synthetic.

Regenerate (from the repository root):

  .venv/bin/python reports/algorithms_report.py

For each task (digits, synthetic) and algorithm (fedavg, fedadam, fedgbo-sgdm,
fedgbo-adam, mfl-adam, mimelite-sgdm) it
  1. runs a small learning-rate grid (GRIDS below) for SEARCH_ROUNDS rounds,
  2. picks the configuration with the best mean eval accuracy over the last 3
     evaluations (a diverged run scores −∞; ties go to the first in grid order),
  3. continues the chosen run to FINAL_ROUNDS rounds (bin/train resumes from
     its checkpoint; runs are deterministic in --seed, so this is the same
     curve as a fresh FINAL_ROUNDS-round run),
then plots the final runs with bin/plot.py against rounds and against
`cost/cumulative_upload_bits`, and writes reports/algorithms.md.

Every run is one bin/train.py command (listed in the report), --jobs of them
at a time; each run's output goes to <run dir>.log. Run directories go to
--runs_dir (default runs/algorithms_report, git-ignored); only the PNGs and the
markdown are meant to be committed.
"""

import argparse
import concurrent.futures
import csv
import math
import os
import resource
import shlex
import shutil
import subprocess
import sys
import time
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, 'bin', 'train.py')
PLOT = os.path.join(ROOT, 'bin', 'plot.py')

TASKS = ('digits', 'synthetic')
SEARCH_ROUNDS = 20
FINAL_ROUNDS = 60
ROUNDS_PER_EVAL = 5
# Shared by every run: K = 10 local steps of B = 10 examples, 5 of the task's
# clients per round (digits: 20 clients, Dirichlet α = 0.5 label split, MLP;
# synthetic(1, 1): 30 clients, multinomial logistic regression).
COMMON = ['--local_steps=10', '--client_batch_size=10', '--clients_per_round=5', '--seed=0',
          f'--rounds_per_eval={ROUNDS_PER_EVAL}', f'--rounds_per_checkpoint={SEARCH_ROUNDS}',
          '--show_progress=false']
CLIENT_LRS = (0.01, 0.03, 0.1, 0.3, 1.0)
SERVER_LRS = (0.01, 0.03, 0.1)  # FedAdam
# name → (label, fixed flags, grid of (client lr, server lr or None)).
ALGORITHMS = {
    'fedavg': ('FedAvg', ['--algorithm=fedavg'], [(lr, None) for lr in CLIENT_LRS]),
    'fedadam': ('FedAdam', ['--algorithm=fedadam'],
                [(lr, slr) for lr in CLIENT_LRS for slr in SERVER_LRS]),
    'fedgbo_sgdm': ('FedGBO-SGDm', ['--algorithm=fedgbo', '--client_optimizer=sgdm'],
                    [(lr, None) for lr in CLIENT_LRS]),
    'fedgbo_adam': ('FedGBO-Adam', ['--algorithm=fedgbo', '--client_optimizer=adam'],
                    [(lr, None) for lr in CLIENT_LRS]),
    'mfl_adam': ('MFL-Adam', ['--algorithm=mfl', '--client_optimizer=adam'],
                 [(lr, None) for lr in CLIENT_LRS]),
    'mimelite_sgdm': ('Mimelite-SGDm', ['--algorithm=mimelite', '--client_optimizer=sgdm'],
                      [(lr, None) for lr in CLIENT_LRS]),
}


def run_args(task, algorithm, lr, server_lr, runs_dir):
  _, flags, _ = ALGORITHMS[algorithm]
  name = f'{algorithm}_lr{lr:g}' + (f'_slr{server_lr:g}' if server_lr is not None else '')
  args = [f'--task={task}', *flags, f'--client_learning_rate={lr:g}', *COMMON,
          f'--root_output_dir={os.path.join(runs_dir, task)}', f'--experiment_name={name}']
  if server_lr is not None:
    args.append(f'--server_learning_rate={server_lr:g}')
  return args


def command_line(args, total_rounds):
  return ' '.join(['bin/train.py', *map(shlex.quote, args), f'--total_rounds={total_rounds}'])


# ---- Running bin/train.py ----


def _train(job):
  """Runs one bin/train.py command; returns (job, status, seconds). Output → <run>.log.

  A run already complete with the same command (recorded in <run>.cmd) is not
  rerun, so an interrupted report picks up where it stopped; an incomplete one
  resumes from its last checkpoint (bin/train), or starts over if it has none.
  """
  args, total_rounds = job
  directory = run_dir(args)
  command = ' '.join(args)
  recorded = directory + '.cmd'
  same = os.path.exists(recorded) and open(recorded).read() == command
  if same and _rounds_done(directory) >= total_rounds:
    return job, 'ok', 0.0, True
  checkpoints = os.path.join(directory, 'checkpoints')
  has_checkpoint = os.path.isdir(checkpoints) and bool(os.listdir(checkpoints))
  if os.path.isdir(directory) and not (same and has_checkpoint):
    shutil.rmtree(directory)
  os.makedirs(os.path.dirname(directory), exist_ok=True)
  with open(recorded, 'w') as f:
    f.write(command)
  started = time.monotonic()
  with open(directory + '.log', 'a') as f:
    rc = subprocess.run([sys.executable, TRAIN, *args, f'--total_rounds={total_rounds}'],
                        cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')).returncode
  status = 'ok' if rc == 0 else f'failed (exit {rc}, see {directory}.log)'
  if rc == 1:  # bin/train: 1 = diverged (its message says so), or a crash
    with open(directory + '.log') as f:
      if 'error: training diverged at round' in f.read():
        status = 'diverged'
  seconds = time.monotonic() - started
  with open(directory + '.seconds', 'a') as f:  # wall time of every stretch that trained it
    f.write(f'{seconds:.1f}\n')
  return job, status, seconds, False


def recorded_seconds(directory) -> Optional[float]:
  """Wall seconds spent training this run over all invocations (None if not recorded)."""
  try:
    with open(directory + '.seconds') as f:
      return sum(float(line) for line in f if line.strip())
  except FileNotFoundError:
    return None


def _rounds_done(directory):
  path = os.path.join(directory, 'metrics.csv')
  if not os.path.exists(path):
    return 0
  rows = read_rows(directory)
  return int(rows[-1]['round']) if rows else 0


RUN_LOG = {'trained': [], 'reused': []}  # (run directory, seconds) of this invocation


def _run_all(jobs, pool):
  results = {}
  futures = [pool.submit(_train, job) for job in jobs]
  for future in concurrent.futures.as_completed(futures):
    (args, total_rounds), status, seconds, reused = future.result()
    print(f'  [{status}{", reused" if reused else ""}, {seconds:.0f}s] '
          f'{command_line(args, total_rounds)}', flush=True)
    RUN_LOG['reused' if reused else 'trained'].append((run_dir(args), seconds))
    results[tuple(args)] = status
  return results


def timing_text(minutes, cpu_minutes, jobs) -> str:
  """What this invocation measured and reused, and the recorded training time of every run."""
  trained, reused = RUN_LOG['trained'], RUN_LOG['reused']
  dirs = sorted({d for d, _ in trained + reused})
  recorded = [recorded_seconds(d) for d in dirs]
  known = [r for r in recorded if r is not None]
  text = (f'The invocation that wrote this file took {minutes:.0f} minutes wall clock and '
          f'{cpu_minutes:.0f} CPU-minutes ({jobs} bin/train.py runs at a time): it trained '
          f'{len(trained)} run stretches and reused {len(reused)} already finished in the runs '
          'directory' + (', so its time is not a from-scratch time' if reused else
                         ', i.e. from scratch') + '. ')
  if known:
    text += (f'Training times recorded with the runs ({len(known)} of {len(dirs)} runs): '
             f'{sum(known) / 60:.0f} minutes of wall time in all, about '
             f'{sum(known) / 60 / jobs:.0f} minutes with {jobs} at a time.')
  else:
    text += ('The runs\' own training times were not recorded (runs made before the script '
             'kept them), so no from-scratch time has been measured.')
  return text


# ---- Reading results ----


def read_rows(run_dir):
  with open(os.path.join(run_dir, 'metrics.csv'), newline='') as f:
    return list(csv.DictReader(f))


def evals(rows, upto=None):
  return [float(r['eval/accuracy']) for r in rows
          if r.get('eval/accuracy') not in (None, '') and (upto is None or int(r['round']) <= upto)]


def run_dir(args):
  get = lambda flag: next(a.split('=', 1)[1] for a in args if a.startswith(flag + '='))
  return os.path.join(get('--root_output_dir'), get('--experiment_name'))


def score(args, status, upto):
  if status != 'ok' or not os.path.exists(os.path.join(run_dir(args), 'metrics.csv')):
    return -math.inf
  accuracies = evals(read_rows(run_dir(args)), upto)
  if len(accuracies) < 3 or not all(math.isfinite(a) for a in accuracies):
    return -math.inf
  return sum(accuracies[-3:]) / 3


def _override(opts):
  global TASKS, ALGORITHMS, SEARCH_ROUNDS, FINAL_ROUNDS, COMMON
  TASKS = tuple(opts.tasks.split(','))
  ALGORITHMS = {k: ALGORITHMS[k] for k in opts.algorithms.split(',')}
  SEARCH_ROUNDS, FINAL_ROUNDS = opts.search_rounds, opts.final_rounds
  COMMON = [a for a in COMMON if not a.startswith('--rounds_per_checkpoint')] + [
      f'--rounds_per_checkpoint={SEARCH_ROUNDS}']


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--runs_dir', default=os.path.join(ROOT, 'runs', 'algorithms_report'))
  parser.add_argument('--out_dir', default=os.path.join(ROOT, 'reports'))
  parser.add_argument('--jobs', type=int, default=2, help='bin/train.py runs at a time')
  # For smoke tests of this script only (the committed report uses the defaults):
  parser.add_argument('--tasks', default=','.join(TASKS))
  parser.add_argument('--algorithms', default=','.join(ALGORITHMS))
  parser.add_argument('--search_rounds', type=int, default=SEARCH_ROUNDS)
  parser.add_argument('--final_rounds', type=int, default=FINAL_ROUNDS)
  opts = parser.parse_args()
  _override(opts)
  os.makedirs(opts.runs_dir, exist_ok=True)
  figures = os.path.join(opts.out_dir, 'figures')
  os.makedirs(figures, exist_ok=True)
  started = time.monotonic()

  with concurrent.futures.ThreadPoolExecutor(opts.jobs) as pool:
    search = [(task, alg, lr, slr) for task in TASKS for alg, (_, _, grid) in ALGORITHMS.items()
              for lr, slr in grid]
    print(f'Search: {len(search)} runs of {SEARCH_ROUNDS} rounds', flush=True)
    statuses = _run_all([(run_args(t, a, lr, slr, opts.runs_dir), SEARCH_ROUNDS)
                         for t, a, lr, slr in search], pool)
    scores = {key: score(run_args(*key, opts.runs_dir), statuses[tuple(run_args(*key, opts.runs_dir))],
                         SEARCH_ROUNDS) for key in search}
    chosen = {}
    for task in TASKS:
      for alg, (_, _, grid) in ALGORITHMS.items():
        candidates = [(task, alg, lr, slr) for lr, slr in grid]
        chosen[(task, alg)] = max(candidates, key=lambda k: scores[k])  # first max wins ties
    print(f'Final: {len(chosen)} runs continued to {FINAL_ROUNDS} rounds', flush=True)
    final_statuses = _run_all([(run_args(*key, opts.runs_dir), FINAL_ROUNDS)
                               for key in chosen.values()], pool)

  # ---- Figures (bin/plot.py) ----
  figure_paths = {}
  for task in TASKS:
    runs = [run_dir(run_args(*chosen[(task, alg)], opts.runs_dir)) for alg in ALGORITHMS]
    labels = [ALGORITHMS[alg][0] for alg in ALGORITHMS]
    for x, suffix in (('round', 'rounds'), ('cost/cumulative_upload_bits', 'upload_bits')):
      out = os.path.join(figures, f'algorithms_{task}_{suffix}.png')
      subprocess.run([sys.executable, PLOT, f'--runs={",".join(runs)}',
                      f'--labels={",".join(labels)}', f'--x={x}',
                      '--metrics=eval/accuracy,eval/loss', f'--out={out}',
                      f'--title={task}: final runs (K=10, B=10, 5 clients/round)'],
                     check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
      figure_paths[(task, suffix)] = os.path.relpath(out, opts.out_dir)

  cpu_minutes = sum(getattr(resource.getrusage(resource.RUSAGE_CHILDREN), f)
                    for f in ('ru_utime', 'ru_stime')) / 60
  write_markdown(opts, chosen, scores, statuses, final_statuses, figure_paths,
                 (time.monotonic() - started) / 60, cpu_minutes)


def _fmt_bits(bits):
  return f'{bits / 8 / 2**20:.1f} MiB'


def write_markdown(opts, chosen, scores, statuses, final_statuses, figure_paths, minutes,
                   cpu_minutes):
  lines = _protocol_lines(opts, minutes, cpu_minutes)
  for task in TASKS:
    lines += _task_lines(task, opts, chosen, scores, final_statuses, figure_paths)
  lines += _search_lines(opts, chosen, scores, statuses)
  lines += _command_lines(opts, chosen)
  path = os.path.join(opts.out_dir, 'algorithms.md')
  with open(path, 'w') as f:
    f.write('\n'.join(lines))
  print(f'Wrote {path} ({minutes:.1f} min wall, {cpu_minutes:.1f} CPU-min)')


def _protocol_lines(opts, minutes, cpu_minutes) -> list:
  """The title, how it was made and the protocol."""
  return [
      '# Algorithms on digits and synthetic',
      '',
      'Generated by `reports/algorithms_report.py`. Regenerate with',
      '',
      '```',
      '.venv/bin/python reports/algorithms_report.py',
      '```',
      '',
      f'{timing_text(minutes, cpu_minutes, opts.jobs)} From scratch the script makes '
      f'{sum(len(g) for _, _, g in ALGORITHMS.values()) * len(TASKS)} search runs plus the '
      'final continuations. Run directories go to `runs/algorithms_report/` (git-ignored, not '
      'committed).',
      '',
      '## Protocol',
      '',
      f'- Tasks: `digits` (scikit-learn digits, 20 clients, Dirichlet α = 0.5 label split, MLP) '
      'and `synthetic` (FedProx synthetic(1, 1), 30 clients, multinomial logistic regression).',
      f'- Every run: K = 10 local steps (`--local_steps=10`), B = 10, 5 clients per round, '
      f'seed 0, evaluation of the global model on the task\'s test data every {ROUNDS_PER_EVAL} '
      'rounds. Optimiser constants are bin/train\'s defaults (client β1 = 0.9, β2 = 0.99, '
      'ε = 1e-8; server β1 = 0.9, β2 = 0.99, τ = 1e-3, `tff` semantics).',
      f'- Search: client learning rate η ∈ {{{", ".join(f"{v:g}" for v in CLIENT_LRS)}}} for '
      'every algorithm, and for FedAdam also server learning rate η_s ∈ '
      f'{{{", ".join(f"{v:g}" for v in SERVER_LRS)}}} (the other '
      f'algorithms use server SGD with η_s = 1). Each configuration runs {SEARCH_ROUNDS} rounds; '
      'the score is the mean eval accuracy of the last 3 evaluations (rounds '
      f'{SEARCH_ROUNDS - 2 * ROUNDS_PER_EVAL}, {SEARCH_ROUNDS - ROUNDS_PER_EVAL}, {SEARCH_ROUNDS}); '
      'the best wins (ties: the first in grid order).',
      f'- Final run: the chosen configuration continued to {FINAL_ROUNDS} rounds (bin/train '
      'resumes from its checkpoint; runs are deterministic in the seed, so this equals a fresh '
      f'{FINAL_ROUNDS}-round run).',
      '- Upload bits are the process\'s own `cost/` measurements (exact sizes of what each '
      'client sends: FedAvg/FedAdam/FedGBO |x| floats, Mimelite 2|x|, MFL-Adam 3|x| + 1), summed '
      'over all sampled clients and rounds.',
      '',
      '## Chosen hyperparameters and results',
      '',
  ]


def _task_lines(task, opts, chosen, scores, final_statuses, figure_paths) -> list:
  """A task's chosen configurations, their final runs and its figures."""
  lines = [f'### {task}', '',
           '| algorithm | client η | server η_s | search score | final accuracy '
           f'(round {FINAL_ROUNDS}) | mean of last 3 evals | upload bits / client / round '
           '| total upload |',
           '|---|---|---|---|---|---|---|---|']
  for alg, (label, _, _) in ALGORITHMS.items():
    key = chosen[(task, alg)]
    args = run_args(*key, opts.runs_dir)
    status = final_statuses.get(tuple(args), '?')
    rows = read_rows(run_dir(args)) if status == 'ok' else []
    accs = evals(rows)
    last = rows[-1] if rows else {}
    lines.append(
        f'| {label} | {key[2]:g} | {key[3] if key[3] is not None else 1:g} | '
        f'{scores[key]:.4f} | {accs[-1] if accs else float("nan"):.4f} | '
        f'{sum(accs[-3:]) / 3 if len(accs) >= 3 else float("nan"):.4f} | '
        f'{float(last.get("cost/upload_bits_per_client", "nan")):,.0f} | '
        f'{float(last.get("cost/cumulative_upload_bits", "nan")):,.0f} bits '
        f'({_fmt_bits(float(last.get("cost/cumulative_upload_bits", "nan")))}) |'
        + ('' if status == 'ok' else f' final run: {status}'))
  return lines + ['',
                  f'![{task}: accuracy and loss vs rounds]({figure_paths[(task, "rounds")]})', '',
                  f'![{task}: accuracy and loss vs cumulative upload bits]'
                  f'({figure_paths[(task, "upload_bits")]})', '']


def _search_lines(opts, chosen, scores, statuses) -> list:
  """Every search run's score, and the choices at the edge of their grid."""
  lines = ['## Search (score = mean eval accuracy of the last 3 evaluations)', '',
           '| task | algorithm | client η | server η_s | score |', '|---|---|---|---|---|']
  for key, value in scores.items():
    task, alg, lr, slr = key
    status = statuses[tuple(run_args(*key, opts.runs_dir))]
    shown = f'{value:.4f}' if math.isfinite(value) else status
    mark = ' **chosen**' if chosen[(task, alg)] == key else ''
    lines.append(f'| {task} | {ALGORITHMS[alg][0]} | {lr:g} | '
                 f'{slr if slr is not None else 1:g} | {shown}{mark} |')
  edges = []
  for (task, alg), (_, _, lr, slr) in chosen.items():
    grid = ALGORITHMS[alg][2]
    lrs, slrs = {g[0] for g in grid}, {g[1] for g in grid if g[1] is not None}
    if lr in (min(lrs), max(lrs)) or (slrs and slr in (min(slrs), max(slrs))):
      edges.append(f'{ALGORITHMS[alg][0]} on {task}')
  if edges:
    lines += ['', f'Chosen at the edge of its grid: {", ".join(edges)}. The grid was widened '
              'once (from η ∈ {0.03, 0.1, 0.3}, η_s ∈ {0.01, 0.03}) because the first pass chose '
              'edge values; these remaining edge choices mean a better value may lie outside '
              'the grid, so their curves are a lower bound on what the algorithm can do here.']
  return lines


def _command_lines(opts, chosen) -> list:
  """The final runs as bin/train command lines."""
  lines = ['', '## The final runs as bin/train commands', '',
           'Each is one command (the search runs are the same with '
           f'`--total_rounds={SEARCH_ROUNDS}`):', '', '```']
  for task in TASKS:
    for alg in ALGORITHMS:
      args = [a for a in run_args(*chosen[(task, alg)], opts.runs_dir)
              if not a.startswith('--root_output_dir')] + ['--root_output_dir=runs/algorithms_report/'
                                                            + task]
      lines.append(command_line(args, FINAL_ROUNDS))
  return lines + ['```', '', 'Figures: `bin/plot.py --runs=<final run dirs> --x=round` and '
                  '`--x=cost/cumulative_upload_bits`, metrics `eval/accuracy,eval/loss`.', '']


if __name__ == '__main__':
  main()
