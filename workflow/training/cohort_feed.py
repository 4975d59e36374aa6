"""Client data for the cohort execution: cached arrays, next round built in the background.

`program.run` uses a `CohortFeeder` when the process is a
`tff_adaptive.rounds.cohort.CohortProcess`: each sampled client's K batches come
from the task's own datasets (its preprocessing), are kept as arrays under a
memory budget (`cohort_data.ClientCache`), and while round t trains, round
t+1's shards are padded on a background thread (`cohort_data.Prefetcher`).
"""

from collections.abc import Sequence
from typing import Optional

from tasks import base as task_base
from tff_adaptive.rounds import cohort
from tff_adaptive.rounds import cohort_data

# Client arrays kept between rounds (bytes): the digits and EMNIST-sized tasks'
# whole training sets fit; larger ones cycle through it.
DEFAULT_CACHE_BYTES = 1 << 30


class CohortFeeder:
  """(sampled ids, K, next round's ids) → the padded shards of this round."""

  def __init__(self, task: task_base.FederatedTask, process: cohort.CohortProcess,
               cache_bytes: int = DEFAULT_CACHE_BYTES,
               cache: Optional[cohort_data.ClientCache] = None):
    """`cache`: one shared with other feeders of the same task (a population's
    members of one seed); else its own of `cache_bytes`."""
    self._process = process
    self._cache = cache or cohort_data.ClientCache(task.client_train_datasets, cache_bytes)
    self._prefetcher = cohort_data.Prefetcher(self._build)
    self.padding_waste = 0.0

  def _build(self, client_ids: Sequence[str], local_steps: int):
    return self._process.make_shards(
        self._cache.get(client_ids, self._process.batches_per_client(local_steps)))

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
