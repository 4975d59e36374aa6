"""Full-size stand-ins for TFF's EMNIST and Stack Overflow SQLite files.

Writes, into a directory, files the tasks read exactly as they read TFF's
(`tasks/tff_native.py`: `tff.simulation.datasets.*.load_data`, then
`SqlClientData` per client):

- `emnist_all.sqlite`: the splits `all_train` / `all_test` (3,400 writers,
  671,585 / 77,483 examples, TFF's published totals) and `digits_only_train` /
  `digits_only_test` (3,383 writers, 341,873 / 40,832); 28x28 float pixels
  and an int64 label per `tf.train.Example`, as TFF's file.
- `stackoverflow.sqlite`: `train` (342,477 clients), `heldout` (38,758) and
  `test` (204,088, a subset of the training users, as in TFF's split by
  date) with the six features of TFF's posts (`creation_date`, `score`,
  `tags`, `title`, `tokens`, `type`); plus `stackoverflow.word_count` and
  `stackoverflow.tag_count` (extracted, as Keras leaves them).

What is real and what is not:

- Client counts and per-split example totals are TFF's published ones
  (times `example_scale`). TFF's files are not available offline, so the
  per-client count distributions are assumptions of the right shape: EMNIST
  writers ~ Gamma with coefficient of variation 0.39 (LEAF's FEMNIST: mean
  226.8, s.d. 88.9 samples per writer); Stack Overflow users ~ log-normal
  with sigma 1.2 (heavy tail: a few users with tens of thousands of
  sentences, most with a few hundred), both rescaled to the published mean.
- `example_scale` (default 1 for EMNIST, 1/32 for Stack Overflow: 4.2M
  instead of 136M training rows, ~1 GB instead of ~40 GB) multiplies every
  client's count (at least 1 example each), keeping the distribution's shape.
- Contents are random: each row is drawn from a pool of distinct serialized
  examples (`pool` of them). Stack Overflow tokens are Zipf-distributed over
  a vocabulary of 1,000,000 words and tags over 54,000 tags (Stack Overflow's
  number of tags in 2018); the count files list them in decreasing order of
  frequency, as TFF's.
- Rows are written client by client with an index on (client_id,
  split_name), as `tasks/data_files.write_sql_client_data` writes; whether
  TFF's own files carry one is not known here (without an index every
  per-client query scans the whole table).

  .venv/bin/python bench/standins.py --out_dir=bench/tmp/standins  # both, full size
"""

import argparse
import json
import os
import sqlite3
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # pylint: disable=g-import-not-at-top

from tasks import data_files  # pylint: disable=g-import-not-at-top

# TFF's published sizes (tff.simulation.datasets.{emnist,stackoverflow}.load_data).
EMNIST_WRITERS = 3400
EMNIST_SPLITS = {'all_train': 671_585, 'all_test': 77_483}
EMNIST_DIGIT_WRITERS = 3383
EMNIST_DIGIT_SPLITS = {'digits_only_train': 341_873, 'digits_only_test': 40_832}
EMNIST_CV = 88.94 / 226.83  # LEAF FEMNIST: samples per writer, s.d. / mean
STACKOVERFLOW_SPLITS = {  # split: (clients, examples)
    'train': (342_477, 135_818_730),
    'heldout': (38_758, 16_491_230),
    'test': (204_088, 16_586_035),
}
STACKOVERFLOW_SIGMA = 1.2
STACKOVERFLOW_WORDS = 1_000_000
STACKOVERFLOW_TAGS = 54_000


def per_client_counts(rng, clients: int, total: int, distribution: str, spread: float,
                      example_scale: float = 1.0) -> np.ndarray:
  """`clients` counts with mean total/clients × example_scale, at least 1 each."""
  mean = total / clients * example_scale
  if distribution == 'gamma':
    shape = 1.0 / spread**2
    raw = rng.gamma(shape, 1.0 / shape, clients)
  else:
    raw = rng.lognormal(0.0, spread, clients)
  return np.maximum(1, np.round(raw / raw.mean() * mean)).astype(np.int64)


def _write(path: str, splits, index: bool = True) -> dict:
  """splits: iterable of (split_name, client_ids, counts, pool); rows drawn from pool."""
  tmp = f'{path}.tmp{os.getpid()}'
  if os.path.exists(tmp):
    os.remove(tmp)
  con = sqlite3.connect(tmp)
  con.execute('PRAGMA journal_mode=OFF;')
  con.execute('PRAGMA synchronous=OFF;')
  con.execute('CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, '
              'serialized_example_proto BLOB NOT NULL);')
  con.execute('CREATE TABLE client_metadata (client_id TEXT NOT NULL, '
              'split_name TEXT NOT NULL, num_examples INTEGER NOT NULL);')
  totals = {}
  for split, ids, counts, pool, rng in splits:
    picks = rng.integers(0, len(pool), int(counts.sum()))
    bounds = np.concatenate([[0], np.cumsum(counts)])

    def rows():
      for cid, lo, hi in zip(ids, bounds[:-1], bounds[1:]):
        for k in picks[lo:hi]:
          yield (split, cid, pool[k])

    con.executemany('INSERT INTO examples VALUES (?, ?, ?);', rows())
    con.executemany('INSERT INTO client_metadata VALUES (?, ?, ?);',
                    ((cid, split, int(n)) for cid, n in zip(ids, counts)))
    totals[split] = {'clients': len(ids), 'examples': int(counts.sum()),
                     'min': int(counts.min()), 'median': float(np.median(counts)),
                     'max': int(counts.max())}
  if index:
    con.execute('CREATE INDEX examples_by_client ON examples (client_id, split_name);')
  con.commit()
  con.close()
  os.replace(tmp, path)
  return totals


def write_emnist(data_dir: str, example_scale: float = 1.0, client_scale: float = 1.0,
                 pool: int = 4096, digits: bool = True, seed: int = 0) -> dict:
  """`emnist_all.sqlite` with TFF's writer counts × client_scale."""
  rng = np.random.default_rng(seed)
  writers = max(1, round(EMNIST_WRITERS * client_scale))
  ids = [f'f{w // 100:04d}_{w % 100:02d}' for w in range(writers)]

  def images(classes):
    return [data_files.serialize_example({
        'label': int(rng.integers(classes)),
        'pixels': rng.uniform(0, 1, (28, 28)).astype(np.float32)}) for _ in range(pool)]

  all_pool = images(62)
  train = per_client_counts(rng, writers, EMNIST_SPLITS['all_train'] * client_scale, 'gamma',
                            EMNIST_CV, example_scale)
  # TFF splits each writer's examples into train and test (~10%, >= 1 each).
  ratio = EMNIST_SPLITS['all_test'] / EMNIST_SPLITS['all_train']
  test = np.maximum(1, np.round(train * ratio)).astype(np.int64)
  splits = [('all_train', ids, train, all_pool, rng), ('all_test', ids, test, all_pool, rng)]
  if digits:
    digit_pool = images(10)
    digit_writers = max(1, round(writers * EMNIST_DIGIT_WRITERS / EMNIST_WRITERS))
    share = EMNIST_DIGIT_SPLITS['digits_only_train'] / EMNIST_SPLITS['all_train']
    d_train = np.maximum(1, np.round(train[:digit_writers] * share)).astype(np.int64)
    d_test = np.maximum(1, np.round(d_train * ratio)).astype(np.int64)
    splits += [('digits_only_train', ids[:digit_writers], d_train, digit_pool, rng),
               ('digits_only_test', ids[:digit_writers], d_test, digit_pool, rng)]
  os.makedirs(data_dir, exist_ok=True)
  return _write(os.path.join(data_dir, 'emnist_all.sqlite'), splits)


def _zipf_ranks(rng, n: int, size: int, a: float = 1.1) -> np.ndarray:
  """Ranks in [0, n) with P(rank r) ∝ (r + 1)^-a (inverse-CDF on a sampled grid)."""
  weights = (np.arange(1, n + 1, dtype=np.float64))**-a
  cdf = np.cumsum(weights)
  return np.searchsorted(cdf, rng.uniform(0, cdf[-1], size))


def write_stackoverflow(data_dir: str, example_scale: float = 1 / 32, client_scale: float = 1.0,
                        pool: int = 50_000, words: int = STACKOVERFLOW_WORDS,
                        tags: int = STACKOVERFLOW_TAGS, seed: int = 0) -> dict:
  """`stackoverflow.sqlite` and the word/tag count files (see the module docstring)."""
  rng = np.random.default_rng(seed)
  vocab = np.array([f'w{i}' for i in range(words)])
  # Real tokens first, so that the tasks' top words look like words.
  vocab[:9] = ['the', '.', ',', 'to', 'i', 'a', 'is', 'and', 'it']
  tag_names = np.array([f'tag{i}' for i in range(tags)])
  lengths = np.clip(rng.lognormal(2.6, 0.6, pool).astype(int), 1, 200)  # ~15 tokens
  tokens = _zipf_ranks(rng, words, int(lengths.sum()))
  tag_draws = _zipf_ranks(rng, tags, 5 * pool)
  posts, at = [], 0
  for i, n in enumerate(lengths):
    sentence = ' '.join(vocab[tokens[at:at + n]])
    at += n
    post_tags = '|'.join(dict.fromkeys(tag_names[tag_draws[5 * i:5 * i + 1 + i % 5]]))
    posts.append(data_files.serialize_example({
        'creation_date': f'2016-{1 + i % 12:02d}-{1 + i % 28:02d} 12:00:00.000 UTC',
        'score': int(rng.integers(-2, 50)), 'tags': post_tags,
        'title': ' '.join(vocab[tokens[at - n:at - n + 6]]), 'tokens': sentence,
        'type': 'question' if i % 3 == 0 else 'answer'}))
  splits, train_ids = [], None
  for split, (clients, total) in STACKOVERFLOW_SPLITS.items():
    n = max(1, round(clients * client_scale))
    if split == 'train':
      ids = [f'{u:08d}' for u in range(1, 10 * n, 10)][:n]  # not divisible by 10
      train_ids = ids
    elif split == 'heldout':
      ids = [f'{u:08d}' for u in range(10, 10 * n + 1, 10)]  # user_id % 10 == 0
    else:  # test users: the training users active after 2018-01-01
      ids = sorted(rng.choice(train_ids, min(n, len(train_ids)), replace=False).tolist())
    counts = per_client_counts(rng, len(ids), total * client_scale, 'lognormal',
                               STACKOVERFLOW_SIGMA, example_scale)
    splits.append((split, ids, counts, posts, rng))
  os.makedirs(data_dir, exist_ok=True)
  totals = _write(os.path.join(data_dir, 'stackoverflow.sqlite'), splits)
  # Counts files: words by decreasing count (users using them), tags as JSON.
  word_counts = np.sort(rng.zipf(1.5, words))[::-1] + 1
  with open(os.path.join(data_dir, 'stackoverflow.word_count'), 'w') as f:
    f.writelines(f'{w} {c}\n' for w, c in zip(vocab, word_counts))
  tag_counts = np.sort(rng.zipf(1.5, tags))[::-1] + 1
  with open(os.path.join(data_dir, 'stackoverflow.tag_count'), 'w') as f:
    json.dump({str(t): int(c) for t, c in zip(tag_names, tag_counts)}, f)
  return totals


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--out_dir', default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   'tmp', 'standins'))
  p.add_argument('--datasets', default='emnist,stackoverflow')
  p.add_argument('--emnist_example_scale', type=float, default=1.0)
  p.add_argument('--stackoverflow_example_scale', type=float, default=1 / 32)
  p.add_argument('--client_scale', type=float, default=1.0)
  p.add_argument('--seed', type=int, default=0)
  args = p.parse_args(argv)
  summary = {}
  for name in args.datasets.split(','):
    t0 = time.perf_counter()
    if name == 'emnist':
      totals = write_emnist(args.out_dir, args.emnist_example_scale, args.client_scale,
                            seed=args.seed)
    else:
      totals = write_stackoverflow(args.out_dir, args.stackoverflow_example_scale,
                                   args.client_scale, seed=args.seed)
    summary[name] = {'splits': totals, 'seconds': round(time.perf_counter() - t0, 1)}
    print(name, json.dumps(summary[name]), flush=True)
  with open(os.path.join(args.out_dir, 'standins.json'), 'w') as f:
    json.dump(summary, f, indent=1)
  return summary


if __name__ == '__main__':
  main()
