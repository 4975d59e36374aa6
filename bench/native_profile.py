"""Where a round's CPU time goes, below TFF's executor (the round-overhead profile, docs/performance.md).

cProfile only sees Python waiting on TFF's C++ runtime; the work happens in
the `worker_binary` child process that the local C++ context starts. This
samples both processes (and, for comparison, the raw-compute `tf.function` in
this process) with Linux `perf record`, then sorts every sampled symbol into
a category (oneDNN convolutions, element-wise Eigen kernels by operation,
random-number generation, copies, allocation, kernel time, protobuf/gRPC
serialisation, Python, ...).

For each measured thing it writes CPU seconds per round (from /proc, in
rounds run without sampling), wall seconds per round, cores used (CPU ÷
wall) and each category's share of the samples (from as many further rounds
under `perf`), to `<out_dir>/native_profile[_TAG].json`; `bench/run.py`'s
markdown table generator lists it.

  .venv/bin/python bench/native_profile.py --algorithms=fedavg,fedgbo-adam --rounds=4

Needs `perf` (linux-perf) and permission to sample one's own processes
(`/proc/sys/kernel/perf_event_paranoid` ≤ 2); without them it says so and
exits with status 2.
"""

import argparse
import collections
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_results  # pylint: disable=g-import-not-at-top
import bench_rounds  # pylint: disable=g-import-not-at-top
import bench_sections  # pylint: disable=g-import-not-at-top
import machine_info  # pylint: disable=g-import-not-at-top
from tff_adaptive.execution import runtime  # pylint: disable=g-import-not-at-top

# First match wins: (category, regular expression over "dso symbol").
CATEGORIES = (
    ('convolution (oneDNN JIT code)', r'\[JIT\]'),
    ('oneDNN other', r'dnnl'),
    ('element-wise: sqrt', r'scalar_sqrt_op'),
    ('element-wise: relu gradient', r'scalar_cmp_op'),
    ('element-wise: select (tf.where)', r'TensorSelectOp'),
    ('element-wise: max (relu)', r'scalar_max_op'),
    ('element-wise: divide', r'scalar_quotient_op'),
    ('element-wise: multiply', r'scalar_product_op'),
    ('element-wise: subtract', r'scalar_difference_op'),
    ('element-wise: add / bias add', r'scalar_sum_op'),
    ('element-wise: square', r'scalar_square_op'),
    ('tensor copies / transposes (Eigen block IO, shuffling)', r'TensorBlockIO|Shuffling'),
    ('random numbers (Philox)', r'Philox'),
    ('reductions', r'Reduc|reduce'),
    ('XLA-compiled kernels', r'xla|__xla|_cluster'),
    ('memcpy / memmove / memset', r'memmove|memcpy|memset'),
    ('malloc / free', r'malloc|_int_free|cfree|free@|consolidate|unlink_chunk'),
    ('protobuf (value serialisation)', r'protobuf|_message\.abi3'),
    ('gRPC', r'grpc'),
    ('operating system kernel (page faults, scheduling)', r'\[k\]'),
    ('Python interpreter', r'python|_Py'),
    ('Eigen other', r'Eigen'),
    ('TensorFlow runtime other', r'tensorflow|tsl'),
)


def perf_usable() -> str:
  """'' if `perf record` can sample our processes, else the reason."""
  if shutil.which('perf') is None:
    return 'perf is not installed (Debian: apt-get install linux-perf)'
  try:
    with open('/proc/sys/kernel/perf_event_paranoid') as f:
      level = int(f.read())
  except OSError:
    return ''
  if level > 2:
    return (f'/proc/sys/kernel/perf_event_paranoid is {level}; perf needs ≤ 2 to sample '
            'one\'s own processes')
  return ''


def categorize(report_text: str) -> collections.OrderedDict:
  """Category → % of samples, from `perf report --sort dso,sym -g none`."""
  shares = collections.Counter()
  for line in report_text.splitlines():
    m = re.match(r'\s+([\d.]+)%\s+(\S+)\s+(.*)', line)
    if not m:
      continue
    share, text = float(m.group(1)), f'{m.group(2)} {m.group(3)}'
    for name, pattern in CATEGORIES:
      if re.search(pattern, text):
        shares[name] += share
        break
    else:
      shares[f'other ({m.group(2)})'] += share
  return collections.OrderedDict((k, round(v, 2)) for k, v in shares.most_common())


def _cpu_seconds(pid: int) -> float:
  with open(f'/proc/{pid}/stat') as f:
    fields = f.read().rsplit(')', 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def _children(pid: int):
  out = subprocess.run(['pgrep', '-P', str(pid)], capture_output=True, text=True).stdout
  return [int(p) for p in out.split()]


def _timed_rounds(fn, rounds: int, pids):
  cpu0, wall = sum(_cpu_seconds(p) for p in pids), []
  for _ in range(rounds):
    t0 = time.perf_counter()
    fn()
    wall.append(time.perf_counter() - t0)
  return wall, sum(_cpu_seconds(p) for p in pids) - cpu0


def profile_rounds(fn, rounds: int, frequency: int, workdir: str, label: str):
  """Times `rounds` calls of `fn`, then samples as many more under perf.

  Wall and CPU seconds come from the unsampled calls (sampling slows the
  sampled process, unevenly across workloads); the categories from the
  sampled ones.
  """
  pids = [os.getpid()] + _children(os.getpid())
  wall, cpu = _timed_rounds(fn, rounds, pids)
  data = os.path.join(workdir, f'{label}.data')
  perf = subprocess.Popen(
      ['perf', 'record', '-F', str(frequency), '-p', ','.join(map(str, pids)), '-o', data],
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  time.sleep(1.0)  # perf attaches asynchronously
  _timed_rounds(fn, rounds, pids)
  perf.send_signal(signal.SIGINT)
  perf.wait(timeout=120)
  report = subprocess.run(
      ['perf', 'report', '-i', data, '--no-children', '--sort', 'dso,sym', '--stdio', '-g',
       'none'], capture_output=True, text=True, check=False).stdout
  wall_per_round = statistics.median(wall)
  return collections.OrderedDict(
      wall_s_per_round=wall_per_round, wall_s=wall, cpu_s_per_round=cpu / rounds,
      cores_used=cpu / sum(wall), categories_percent=categorize(report))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--out_dir', default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   'results'))
  p.add_argument('--algorithms', default='fedavg,fedgbo-adam,mfl-adam,fedada2-sm3,tff_fedavg')
  p.add_argument('--model', default='cnn', choices=sorted(bench_rounds.MODELS))
  p.add_argument('--clients', type=int, default=10)
  p.add_argument('--local_steps', type=int, default=10)
  p.add_argument('--batch', type=int, default=20)
  p.add_argument('--rounds', type=int, default=4)
  p.add_argument('--frequency', type=int, default=499, help='perf samples per second')
  p.add_argument('--execution_concurrency', type=int, default=None,
                 help="C++ executor's max_concurrent_computation_calls (default: the "
                      "package's default, see tff_adaptive/execution/runtime.py)")
  p.add_argument('--tag', default='')
  args = p.parse_args(argv)
  reason = perf_usable()
  if reason:
    print(f'bench/native_profile.py: {reason}', file=sys.stderr)
    return 2
  runtime.use_local_cpp_context(args.execution_concurrency)
  setting = bench_rounds.Setting(args.model, args.clients, args.local_steps, args.batch)
  results = collections.OrderedDict()
  load_before = machine_info.load_average()
  with tempfile.TemporaryDirectory() as workdir:
    raw = bench_rounds.build_raw(setting)
    raw()
    results['raw'] = profile_rounds(raw, args.rounds, args.frequency, workdir, 'raw')
    for name in [a for a in args.algorithms.split(',') if a]:
      runner = bench_rounds.Runner(name, setting, 'python')
      runner()  # tracing and session creation are not the steady state
      results[name] = profile_rounds(runner, args.rounds, args.frequency, workdir, name)
      print(name, {k: round(v, 3) for k, v in results[name].items()
                   if isinstance(v, float)}, flush=True)
  raw_cpu = results['raw']['cpu_s_per_round']
  for row in results.values():
    row['cpu_over_raw_cpu'] = bench_sections.finite_ratio(row['cpu_s_per_round'], raw_cpu)
  tag = f'_{args.tag}' if args.tag else ''
  path = bench_results.write(args.out_dir, f'native_profile{tag}', collections.OrderedDict(
      setting=bench_sections.vars_of(setting), rounds=args.rounds, frequency=args.frequency,
      execution_concurrency=args.execution_concurrency, load_before=load_before,
      load_after=machine_info.load_average(), profiles=results))
  bench_results.markdown(args.out_dir)
  runtime.shutdown_workers()
  print('wrote', path)
  return 0


if __name__ == '__main__':
  sys.exit(main())
