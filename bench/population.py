"""A sweep as separate bin/train processes against one population (bin/sweep --together).

The same sweep, started as a user starts it (`bin/sweep.py`, a fresh --sweep_dir each
time, start-up included), in one run on this machine:

  separate_1    every trial its own bin/train process, --max_parallel=1
  separate_2    the same, --max_parallel=2 (both cores)
  together      bin/sweep --together: the trials of one program shape as one process

The setting (--setting): `digits` is FedAdam on the digits MLP, 5 client × 5 server
learning rates (25 members), 10 clients per round, 100 rounds, evaluation at the last
round; `shakespeare` is FedAvg on the Shakespeare report's GRU-128 (E = 1, B = 4, 10
clients per round), 4 client learning rates × 2 seeds (8 members), 100 rounds, evaluated
at the last round on every 10th test example (--data_dir: bin/build_shakespeare.py's
output). `digits_small` and `shakespeare_small` are the shapes, quickly.

Reported per mode: the sweep's wall-clock and CPU seconds (the children's user +
system), member-rounds per second, the training FLOPs the runs counted
(`cost/client_flops` of every metrics.csv row) per wall second beside this CPU's
matmul rate (a 2048² float32 matmul, same run), the peak resident memory of the largest
child (one bin/train process, or the population), the load before and after; and per
member, the first round whose train loss differs from its separate run's (--max_parallel=2)
by more than 1e-5 relative, and the final relative differences of train loss and eval
accuracy (float summation order differs; unstable members amplify it). Regenerate
bench/results/population_<setting>.json:

  .venv/bin/python bench/population.py --setting=digits
  .venv/bin/python bench/population.py --setting=shakespeare --data_dir=data/shakespeare
"""

import argparse
import csv
import glob
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, 'bench')]

import machine_info  # pylint: disable=g-import-not-at-top

DIGITS = 'task=digits;algorithm=fedadam;clients_per_round=10'
# The Shakespeare report's part fedopt: the GRU-128, E = 1, B = 4, 10 clients per round.
SHAKESPEARE = ('task=shakespeare_character;shakespeare_character_model=gru128;'
               'algorithm=fedavg;client_batch_size=4;client_epochs_per_round=1;'
               'clients_per_round=10;eval_stride=10')
SETTINGS = {
    'digits': dict(fixed=DIGITS, grid='client_learning_rate=0.03,0.1,0.3,1,3;'
                   'server_learning_rate=0.001,0.003,0.01,0.03,0.1', rounds=100),
    'digits_small': dict(fixed=DIGITS, grid='client_learning_rate=0.1,0.3;'
                         'server_learning_rate=0.01,0.03', rounds=10),
    'shakespeare': dict(fixed=SHAKESPEARE, grid='client_learning_rate=0.1,0.3,1,3', seeds=2,
                        rounds=100),
    'shakespeare_small': dict(fixed=SHAKESPEARE, grid='client_learning_rate=0.3,1', rounds=5),
}
MODES = {'separate_1': ['--max_parallel=1', '--notogether'],
         'separate_2': ['--max_parallel=2', '--notogether'], 'together': ['--together']}


def sweep_command(setting: dict, sweep_dir: str, mode: str, data_dir: str) -> list[str]:
  fixed = (f"{setting['fixed']};total_rounds={setting['rounds']};"
           f"rounds_per_eval={setting['rounds']};show_progress=false")
  if data_dir:
    fixed += f';data_dir={data_dir}'
  return [sys.executable, os.path.join(ROOT, 'bin', 'sweep.py'), f'--sweep_dir={sweep_dir}',
          f'--fixed={fixed}', f"--grid={setting['grid']}", f"--num_seeds={setting.get('seeds', 1)}",
          '--select_rule=final', *MODES[mode]]


def run_mode(setting: dict, mode: str, work: str, data_dir: str = '') -> dict:
  """One sweep from a fresh directory: its cost and every trial's metrics.csv rows."""
  sweep_dir = os.path.join(work, mode)
  shutil.rmtree(sweep_dir, ignore_errors=True)
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  load_before = machine_info.load_average()
  started = time.monotonic()
  result = subprocess.run(sweep_command(setting, sweep_dir, mode, data_dir), capture_output=True,
                          text=True, cwd=ROOT, check=False)
  seconds = time.monotonic() - started
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  if result.returncode != 0:
    raise SystemExit(f'{mode}: bin/sweep exited {result.returncode}: {result.stderr[-2000:]}')
  trials = {}
  for path in glob.glob(os.path.join(sweep_dir, 'trials', '*', 'metrics.csv')):
    with open(path, newline='') as f:
      trials[os.path.basename(os.path.dirname(path))] = list(csv.DictReader(f))
  rounds = sum(len(rows) for rows in trials.values())
  flops = sum(float(r.get('cost/client_flops') or 0) for rows in trials.values() for r in rows)
  return dict(mode=mode, seconds=seconds,
              cpu_seconds=(after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
              member_rounds=rounds, member_rounds_per_s=rounds / seconds,
              train_gflop_per_s=flops / seconds / 1e9,
              peak_child_rss_mib=after.ru_maxrss / 1024, load_before=load_before,
              load_after=machine_info.load_average(), trials=trials)


def matmul_gflops() -> float:
  """This CPU's float32 matmul rate through TensorFlow (2048², best of 5)."""
  code = ('import time, tensorflow as tf\n'
          'a = tf.random.normal([2048, 2048]); b = tf.random.normal([2048, 2048])\n'
          'f = tf.function(lambda: tf.matmul(a, b)); f().numpy()\n'
          'best = min(((lambda t: (f().numpy(), time.perf_counter() - t)[1])('
          'time.perf_counter())) for _ in range(5))\n'
          'print(2 * 2048 ** 3 / best / 1e9)\n')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
  return float(out.stdout.strip().splitlines()[-1])


def differences(separate: dict, together: dict, key='train/client_work/train/loss') -> dict:
  """Per member: the first round whose `key` differs from its separate run's by more than
  1e-5 relative (None: none), the relative difference of its first 10 rounds, and the
  final relative differences."""
  out = {}
  for name, rows in separate.items():
    pairs = [(float(a[key]), float(b[key]), int(a['round'])) for a, b in zip(rows, together[name])]
    first = next((r for want, got, r in pairs if abs(got - want) > 1e-5 * abs(want)), None)
    final = {k: abs(float(together[name][-1][k]) - float(rows[-1][k])) /
             max(abs(float(rows[-1][k])), 1e-12) for k in (key, 'eval/accuracy')}
    # The size, not only the round: summation order alone stays near 1e-6.
    by_round = [abs(got - want) / max(abs(want), 1e-12) for want, got, _ in pairs]
    out[name] = dict(first_round_over_1e5=first, final_relative=final,
                     final_loss=float(rows[-1][key]), relative_by_round=by_round[:10])
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--setting', choices=sorted(SETTINGS), default='digits')
  parser.add_argument('--out', default=os.path.join(ROOT, 'bench', 'results'))
  parser.add_argument('--modes', default=','.join(MODES),
                      help='which of ' + ', '.join(MODES) + ' to run (together and one other)')
  parser.add_argument('--data_dir', default='',
                      help='--data_dir of the runs (Shakespeare: bin/build_shakespeare.py\'s)')
  args = parser.parse_args()
  if not os.path.isdir(args.out):
    parser.error(f'--out must be an existing directory (the result is written there as '
                 f'population_{args.setting}.json); got {args.out!r}')
  modes = args.modes.split(',')
  if 'together' not in modes or len(modes) < 2 or not set(modes) <= set(MODES):
    parser.error(f'--modes must be together and at least one of separate_1, separate_2; '
                 f'got {args.modes!r}')
  setting = SETTINGS[args.setting]
  work = tempfile.mkdtemp(prefix='population_bench_')
  try:
    peak = matmul_gflops()
    results = {mode: run_mode(setting, mode, work, args.data_dir)
               for mode in MODES if mode in modes}
  finally:
    shutil.rmtree(work, ignore_errors=True)
  separate = results.get('separate_2') or results['separate_1']
  together = results['together']
  report = dict(
      machine=machine_info.machine(), setting=dict(setting, name=args.setting),
      matmul_gflop_per_s=peak,
      modes={m: {k: v for k, v in r.items() if k != 'trials'} for m, r in results.items()},
      **{f'together_over_{m}': results[m]['seconds'] / together['seconds']
         for m in results if m != 'together'},
      member_differences=differences(separate['trials'], together['trials']))
  path = os.path.join(args.out, f'population_{args.setting}.json')
  with open(path, 'w') as f:
    json.dump(report, f, indent=1)
  print(json.dumps({k: v for k, v in report.items() if k != 'machine'}, indent=1))
  print(path)


if __name__ == '__main__':
  main()
