"""The real Shakespeare round's cost per client step, beside the bench's raw loop.

In one run on this machine, each in its own process:

  raw        bench_rounds.build_raw on the bench's `gru` setting (the Shakespeare GRU,
             10 clients x 10 steps x B4, Keras' GRU in one tf.function): seconds per
             client step (median of --reps rounds / 100 steps);
  train      bin/train on the real task as a new user runs it, FedAvg at its defaults
             (`--task=shakespeare_character --shakespeare_character_model=gru128
             --client_batch_size=4 --clients_per_round=10 --client_learning_rate=0.3`,
             E = 1, so clients run their whole data, unequal steps): per round, the
             round's seconds (metrics.csv `round_seconds`) over the client steps it ran
             (`num_batches`, summed over the cohort), median over rounds 2 to --rounds;
  together   the same command for --members runs differing in client learning rate
             (0.3 × 1.25^i), as one `bin/train --together` population: seconds per
             member-client step.

Regenerate bench/results/shakespeare_round.json (--data_dir: bin/build_shakespeare.py's):

  .venv/bin/python bench/shakespeare_round.py --data_dir=data/shakespeare
"""

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, 'bench')]

import machine_info  # pylint: disable=g-import-not-at-top

COMMAND = ['--task=shakespeare_character', '--shakespeare_character_model=gru128',
           '--client_batch_size=4', '--clients_per_round=10', '--show_progress=false']
RAW = '''
import statistics, sys, time
sys.path[:0] = [{root!r}, {bench!r}]
import bench_rounds
setting = bench_rounds.Setting(*bench_rounds.SETTINGS['gru'])
raw = bench_rounds.build_raw(setting)
raw()
times = []
for _ in range({reps}):
  t = time.perf_counter(); raw(); times.append(time.perf_counter() - t)
print(statistics.median(times) / (setting.clients * setting.steps))
'''
STEPS = 'cost/client_steps'


def raw_step_seconds(reps: int) -> float:
  code = RAW.format(root=ROOT, bench=os.path.join(ROOT, 'bench'), reps=reps)
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
  return float(out.stdout.strip().splitlines()[-1])


def _rows(metrics_csv: str) -> list[dict]:
  with open(metrics_csv, newline='') as f:
    return [r for r in csv.DictReader(f) if r.get('round_seconds') and r.get(STEPS)]


def per_step(metrics_csvs: list[str]) -> dict:
  """Seconds per (member-)client step of each round after the first, and their median.
  A population's members finish a round one after another, each row timed from the
  round's start: the round's seconds are the largest, its steps every member's."""
  runs = [_rows(path) for path in metrics_csvs]
  values, steps = [], []
  for rows in list(zip(*runs))[1:]:
    steps.append(sum(float(r[STEPS]) for r in rows))
    values.append(max(float(r['round_seconds']) for r in rows) / steps[-1])
  return dict(median=statistics.median(values), rounds=len(values), steps_per_round=steps)


def train(work: str, name: str, flags: list[str]) -> str:
  subprocess.run([sys.executable, os.path.join(ROOT, 'bin', 'train.py'), *flags,
                  f'--root_output_dir={work}', f'--experiment_name={name}'],
                 check=True, cwd=ROOT, capture_output=True, text=True)
  return os.path.join(work, name, 'metrics.csv')


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--data_dir', required=True)
  parser.add_argument('--rounds', type=int, default=8)
  parser.add_argument('--members', type=int, default=4)
  parser.add_argument('--reps', type=int, default=5)
  parser.add_argument('--out', default=os.path.join(ROOT, 'bench', 'results',
                                                    'shakespeare_round.json'))
  args = parser.parse_args()
  load_before = machine_info.load_average()
  common = [*COMMAND, f'--data_dir={os.path.abspath(args.data_dir)}',
            f'--total_rounds={args.rounds}', f'--rounds_per_eval={args.rounds}',
            '--eval_stride=50']
  rates = [round(0.3 * 1.25 ** i, 4) for i in range(args.members)]  # none diverges in 8 rounds
  with tempfile.TemporaryDirectory(prefix='shakespeare_round_') as work:
    raw = raw_step_seconds(args.reps)
    alone = per_step([train(work, 'alone', [*common, '--client_learning_rate=0.3'])])
    together_file = os.path.join(work, 'together.json')
    with open(together_file, 'w') as f:
      json.dump([[*common, f'--client_learning_rate={r:g}', f'--root_output_dir={work}',
                  f'--experiment_name=member{i}'] for i, r in enumerate(rates)], f)
    subprocess.run([sys.executable, os.path.join(ROOT, 'bin', 'train.py'),
                    f'--together={together_file}'], check=True, cwd=ROOT, capture_output=True,
                   text=True)
    together = per_step([os.path.join(work, f'member{i}', 'metrics.csv')
                         for i in range(len(rates))])
  report = dict(machine=machine_info.machine(), command=common, load_before=load_before,
                load_after=machine_info.load_average(), raw_step_s=raw,
                train_step_s=alone['median'], train_over_raw=alone['median'] / raw,
                train=alone, together_member_step_s=together['median'], together=together,
                together_members=len(rates),
                together_rates=rates)
  with open(args.out, 'w') as f:
    json.dump(report, f, indent=1)
  print(json.dumps({k: v for k, v in report.items() if k != 'machine'}, indent=1))


if __name__ == '__main__':
  main()
