"""Prints the table of what each algorithm supports (markdown), from workflow/flags/algorithms.py.

  bin/algorithm_table.py           # print it
  bin/algorithm_table.py --write   # put it into README.md, between its markers
  bin/algorithm_table.py --check   # exit 1 if README.md's table is not this one
"""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')  # TF's C++ start-up noise

from tff_adaptive.execution import runtime  # pylint: disable=g-import-not-at-top
from workflow.flags import algorithm_table  # pylint: disable=g-import-not-at-top

README = os.path.join(ROOT, 'README.md')


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  action = parser.add_mutually_exclusive_group()
  action.add_argument('--write', action='store_true', help='update README.md')
  action.add_argument('--check', action='store_true', help='exit 1 if README.md is out of date')
  args = parser.parse_args(argv)
  runtime.shut_down_tff_at_exit()  # the registry may import TFF: a quiet exit
  if not (args.write or args.check):
    sys.stdout.write(algorithm_table.markdown())
    return 0
  with open(README, encoding='utf-8') as f:
    text = f.read()
  try:
    updated = algorithm_table.with_table(text)
  except ValueError as e:
    print(f'algorithm_table: error: README.md: {e}', file=sys.stderr)
    return 2
  if args.check:
    if updated != text:
      print('algorithm_table: README.md\'s table is out of date: run bin/algorithm_table.py '
            '--write', file=sys.stderr)
      return 1
    return 0
  if updated != text:
    with open(README, 'w', encoding='utf-8') as f:
      f.write(updated)
  return 0


if __name__ == '__main__':
  sys.exit(main())
