"""Wall-clock of bin/train's answers that need no TensorFlow: --help and a refused flag.

  .venv/bin/python bench/cli_startup.py [--repeats=5]

Prints the median and the range of each command over the repeats, and its exit
status. Both commands are answered before TensorFlow is imported
(tests/test_layering.py checks that the modules they use never import it).
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = (('--help',), ('--algorithm=nope',), ('--client_learning_rate=-1',),
            ('--algorithm=mfl', '--dp'))


def time_command(args, repeats: int):
  seconds, status = [], None
  for _ in range(repeats):
    start = time.perf_counter()
    status = subprocess.run([sys.executable, os.path.join(ROOT, 'bin', 'train.py'), *args],
                            capture_output=True, check=False).returncode
    seconds.append(time.perf_counter() - start)
  return statistics.median(seconds), min(seconds), max(seconds), status


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--repeats', type=int, default=5)
  repeats = parser.parse_args().repeats
  for args in COMMANDS:
    median, low, high, status = time_command(args, repeats)
    print(f'bin/train.py {" ".join(args):32s} exit {status}  median {median:.2f} s '
          f'(range {low:.2f}-{high:.2f}, {repeats} runs)')


if __name__ == '__main__':
  main()
