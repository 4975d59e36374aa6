"""A learnable Stack Overflow–shaped data set for `--task=stackoverflow_tag` (offline).

Writes, in the exact on-disk layout `tasks.tff_native` reads for TFF's Stack
Overflow (`stackoverflow.sqlite` with `train`/`heldout`/`test` splits of
serialized posts, and Keras-cached `datasets/stackoverflow.{word,tag}_count`
archives), a synthetic corpus whose tags can be predicted from the words:

  * a vocabulary of `num_words` words and `num_tags` tags; each tag owns
    `topic_words` words, the rest are generic;
  * every client has its own tag preferences, Dirichlet(`alpha`) over tags
    (non-IID, as real Stack Overflow users are);
  * a post has 1–3 tags drawn from its client's preferences; its tokens are a
    few topic words of each tag mixed with generic words, its title a few
    more words.

So the task pipeline (TFF's tag-prediction preprocessing: normalised bag of
words → multi-hot tags; a sigmoid logistic regression; Recall@5) is the real
one, on a problem small enough for the FedAda2 report's DP variant
(`fedada2_report.py`). `tasks.fixtures.write_tff_stackoverflow` writes the same
layout with random, unlearnable posts (for tests).
"""

import io
import json
import os
import tarfile

import numpy as np

from tasks import data_files


def _tar_bz2(path: str, member: str, payload: bytes) -> None:
  with tarfile.open(path, 'w:bz2') as tar:
    info = tarfile.TarInfo(member)
    info.size = len(payload)
    tar.addfile(info, io.BytesIO(payload))


def write(data_dir: str, *, num_clients: int = 500, posts_per_client: int = 16,
          test_posts_per_client: int = 2, num_words: int = 300, num_tags: int = 20,
          topic_words: int = 8, alpha: float = 0.3, seed: int = 0) -> str:
  """Writes the corpus under `data_dir` (use it as `--data_dir`); returns the SQLite path."""
  rng = np.random.default_rng(seed)
  words = [f'w{i:04d}' for i in range(num_words)]
  tags = [f'tag{i:02d}' for i in range(num_tags)]
  topic = rng.permutation(num_words)[:num_tags * topic_words].reshape(num_tags, topic_words)
  generic = np.setdiff1d(np.arange(num_words), topic.ravel())

  def post(prefs):
    chosen = rng.choice(num_tags, size=int(rng.integers(1, 4)), replace=False, p=prefs)
    tokens = [words[w] for t in chosen for w in rng.choice(topic[t], 3, replace=False)]
    tokens += [words[w] for w in rng.choice(generic, int(rng.integers(4, 12)))]
    rng.shuffle(tokens)
    title = [words[w] for w in rng.choice(topic[chosen[0]], 2)] + [
        words[w] for w in rng.choice(generic, 2)]
    return data_files.serialize_example({
        'creation_date': '2016-01-01 00:00:00.1 UTC', 'score': int(rng.integers(0, 20)),
        'tags': '|'.join(tags[t] for t in chosen), 'title': ' '.join(title),
        'tokens': ' '.join(tokens), 'type': 'question'})

  rows = {'train': [], 'heldout': [], 'test': []}
  for c in range(num_clients):
    cid = f'{c:06d}'
    prefs = rng.dirichlet(alpha * np.ones(num_tags))
    rows['train'].append(('train', cid, [post(prefs) for _ in range(posts_per_client)]))
    for split in ('heldout', 'test'):
      rows[split].append((split, cid, [post(prefs) for _ in range(test_posts_per_client)]))
  os.makedirs(data_dir, exist_ok=True)
  path = os.path.join(data_dir, 'stackoverflow.sqlite')
  data_files.write_sql_client_data(path, rows['train'] + rows['heldout'] + rows['test'])
  cache = os.path.join(data_dir, 'datasets')
  os.makedirs(cache, exist_ok=True)
  word_counts = ''.join(f'{w} {10 * num_words - i}\n' for i, w in enumerate(words))
  _tar_bz2(os.path.join(cache, 'stackoverflow.word_count.tar.bz2'), 'stackoverflow.word_count',
           word_counts.encode())
  tag_counts = {t: 10 * num_tags - i for i, t in enumerate(tags)}
  _tar_bz2(os.path.join(cache, 'stackoverflow.tag_count.tar.bz2'), 'stackoverflow.tag_count',
           json.dumps(tag_counts).encode())
  return path
