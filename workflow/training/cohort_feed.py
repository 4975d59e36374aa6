"""Client data for the cohort execution: cached arrays, next round built in the background.

`program.run` uses a `CohortFeeder` when the process is a
`tff_adaptive.rounds.cohort.CohortProcess`: each sampled client's K batches come
from the task's own datasets (its preprocessing), are kept as arrays under a
memory budget (`cohort_data.ClientCache`), and while round t trains, round
t+1's shards are padded on a background thread (`cohort_data.Prefetcher`).
"""

import collections
import threading
from collections.abc import Sequence
from typing import Optional

from tasks import base as task_base
from tff_adaptive.rounds import cohort
from tff_adaptive.rounds import cohort_data

# Client arrays kept between rounds (bytes): the digits and EMNIST-sized tasks'
# whole training sets fit; larger ones cycle through it.
DEFAULT_CACHE_BYTES = 1 << 30


class ShardBuilder:
  """(sampled ids, K) → the round's padded shards, from one task's cached client arrays.

  A population's members of one seed sample the same clients every round
  (bin/train --together): their feeders share one builder with `keep` > 0,
  which pads each round's clients once and hands every member the same
  shards. Padding them per member was the largest cost of a 25-member digits
  population after its round (`docs/performance.md`). Nothing changes shards
  in place once built (`cohort_data.with_client_states` and the population's
  joins copy), so members may share them.
  """

  def __init__(self, task: task_base.FederatedTask, process: cohort.CohortProcess,
               cache_bytes: int = DEFAULT_CACHE_BYTES, keep: int = 0):
    """`keep`: how many recent (ids, K) to remember (this round's and the next
    one's, for every member: 2 and a margin); 0 for a single run."""
    self._process, self._keep = process, keep
    self._cache = cohort_data.ClientCache(task.client_train_datasets, cache_bytes)
    self._built = collections.OrderedDict()
    self._lock = threading.Lock()  # the members' prefetch threads ask at once

  def __call__(self, client_ids: Sequence[str], local_steps: int) -> cohort_data.Shards:
    key = (tuple(client_ids), local_steps)
    with self._lock:
      if key in self._built:
        return self._built[key]
      shards = self._process.make_shards(
          self._cache.get(client_ids, self._process.batches_per_client(local_steps)))
      if self._keep:
        self._built[key] = shards
        while len(self._built) > self._keep:
          self._built.popitem(last=False)
      return shards


class CohortFeeder:
  """(sampled ids, K, next round's ids) → the padded shards of this round."""

  def __init__(self, task: task_base.FederatedTask, process: cohort.CohortProcess,
               cache_bytes: int = DEFAULT_CACHE_BYTES, builder: Optional[ShardBuilder] = None):
    """`builder`: one shared with other feeders of the same task and process (a
    population's members of one seed); else its own over `cache_bytes`."""
    self._prefetcher = cohort_data.Prefetcher(builder or ShardBuilder(task, process, cache_bytes))
    self.padding_waste = 0.0

  def __call__(self, client_ids: Sequence[str], local_steps: int,
               next_ids: Optional[Sequence[str]] = None):
    shards = self._prefetcher.get((tuple(client_ids), local_steps), client_ids, local_steps)
    # This round's own: a resumed run reports the same values.
    self.padding_waste = cohort_data.padding_waste(shards)
    if next_ids:  # K may change by schedule: a stale prefetch is dropped then
      self._prefetcher.prefetch((tuple(next_ids), local_steps), next_ids, local_steps)
    return shards

  def close(self) -> None:
    self._prefetcher.close()
