"""The cohort's client data as padded tensors: what one compiled round reads.

A shard is `OrderedDict(batches=<the model's batch structure, each leaf
[clients, steps, rows, ...]>, mask=[clients, steps, rows] float32)`: client c's
step s holds its s-th minibatch in the first rows (mask 1), zeros after.
A client with fewer steps than the shard's longest has all-zero masks there and
stops updating; a partial batch is weighted by its real rows only
(`functional.FunctionalView`), so a padded round equals the per-client one.

Clients of very different sizes (epoch-based rounds) are grouped into shards of
similar step counts, so that padding stays small; `ShardStats` measures it.
"""

import collections
import concurrent.futures
import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np
import tensorflow as tf

ClientBatches = list  # of batches, each a structure of NumPy arrays [rows, ...]


def client_batches(dataset: tf.data.Dataset, local_steps: int) -> ClientBatches:
  """The batches one client trains on: exactly K (cycling, as the per-client
  round does) or, for K <= 0, its dataset as given."""
  if local_steps > 0:
    dataset = dataset.repeat().take(local_steps)
  return list(dataset.as_numpy_iterator())


@dataclasses.dataclass
class ShardStats:
  """Rows in the shards: real (examples trained on) and padded (computed)."""
  real_rows: int = 0
  padded_rows: int = 0
  shards: int = 0

  @property
  def waste(self) -> float:
    """The share of computed rows that are padding."""
    return 1.0 - self.real_rows / self.padded_rows if self.padded_rows else 0.0


def padding_waste(shards) -> float:
  """The share of the rows of these shards that are padding."""
  real = sum(float(np.sum(shard['mask'])) for shard in shards)
  total = sum(np.size(shard['mask']) for shard in shards)
  return 1.0 - real / total if total else 0.0


def pad(clients: Sequence[ClientBatches], batch_rows: Optional[int] = None):
  """One shard from the clients' batches (see module docstring)."""
  structure = next((batches[0] for batches in clients if batches), None)
  if structure is None:
    raise ValueError('pad: every client of the shard has no data')
  steps = max(len(batches) for batches in clients)
  rows = batch_rows or max(_rows(b) for batches in clients for b in batches)
  leaves = tf.nest.flatten(structure)
  arrays = [np.zeros((len(clients), steps, rows) + np.shape(leaf)[1:], np.asarray(leaf).dtype)
            for leaf in leaves]
  mask = np.zeros((len(clients), steps, rows), np.float32)
  for c, batches in enumerate(clients):
    for s, batch in enumerate(batches):
      n = _rows(batch)
      mask[c, s, :n] = 1.0
      for array, leaf in zip(arrays, tf.nest.flatten(batch)):
        array[c, s, :n] = leaf
  return collections.OrderedDict(batches=tf.nest.pack_sequence_as(structure, arrays), mask=mask)


def _rows(batch) -> int:
  return int(np.shape(tf.nest.flatten(batch)[0])[0])


def group_by_size(clients: Sequence[ClientBatches], num_shards: Optional[int] = None,
                  max_waste: float = 0.25) -> list[list[int]]:
  """Client indices grouped into shards of similar step counts.

  `num_shards`: exactly that many (or one per client if fewer), e.g. one per
  TFF worker, split by `split_evenly`; None: a new shard starts when a
  client's steps would leave more than `max_waste` of the shard's longest
  client padded.
  """
  order = sorted(range(len(clients)), key=lambda i: (-len(clients[i]), i))
  if num_shards:
    sizes = split_evenly([len(clients[i]) for i in order], num_shards)
    bounds = np.cumsum([0] + sizes)
    return [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
  groups, longest = [], 0
  for i in order:
    steps = len(clients[i])
    if not groups or steps < (1.0 - max_waste) * longest:
      groups.append([])
      longest = steps
    groups[-1].append(i)
  return groups


def split_evenly(steps: Sequence[int], num_shards: int) -> list[int]:
  """Sizes of `min(num_shards, len(steps))` contiguous parts of `steps` (sorted
  longest first) whose largest padded work (clients x longest steps) is smallest.

  Shards on TFF workers run in parallel, so the round waits for the largest
  one; in one process the largest shard sets the peak memory. Equal client
  counts are not that: steps (4, 3, 2, 1, 1) in 2 parts of 3 + 2 clients pad to
  12 + 2, while 2 + 3 pad to 8 + 6. Among the splits of that bound, later parts
  are kept as even as it allows.
  """
  steps = [max(1, int(s)) for s in steps]  # a client without data still takes a slot
  n, parts = len(steps), min(num_shards, len(steps))
  if parts <= 1:
    return [n] if n else []

  def fits(start: int, count: int, bound: int) -> bool:
    # Greedy from the longest: each part takes as many clients as `bound` allows.
    for _ in range(count):
      if start >= n:
        return True
      start += bound // steps[start]
    return start >= n

  low, high = steps[0], steps[0] * -(-n // parts)  # equal counts are within `high`
  while low < high:
    middle = (low + high) // 2
    low, high = (low, middle) if fits(0, parts, middle) else (middle + 1, high)
  sizes, start = [], 0
  for k in range(parts - 1):
    left = parts - k  # parts still to make, this one included
    most = min(low // steps[start], n - start - (left - 1))
    take = min(most, -(-(n - start) // left))
    while take < most and not fits(start + take, left - 1, low):
      take += 1
    sizes.append(take)
    start += take
  return sizes + [n - start]


class Shards(list):
  """A cohort's padded shards, with the clients each one holds.

  `groups[j]`: the indices (into the cohort as given) of shard j's clients,
  in the shard's order: grouping by size reorders clients, and what comes
  back per client (a new client state) is put back in the cohort's order by it.
  """

  def __init__(self, shards=(), groups=None):
    super().__init__(shards)
    self.groups = groups if groups is not None else []

  @property
  def order(self) -> list[int]:
    """The cohort's indices in the order the shards hold them."""
    return [i for group in self.groups for i in group]


def shards(clients: Sequence[ClientBatches], num_shards: Optional[int] = None,
           max_waste: float = 0.25, stats: Optional[ShardStats] = None) -> Shards:
  """The padded shards of a cohort; adds to `stats` if given."""
  clients = list(clients)
  if not any(clients):
    raise ValueError('the sampled clients have no data')
  rows = max(_rows(b) for batches in clients for b in batches)
  groups = group_by_size(clients, num_shards, max_waste)
  result = Shards(groups=groups)
  for group in groups:
    members = [clients[i] for i in group]
    if not any(members):  # clients without data add nothing (weight 0 or 1: see below)
      members = [[_empty_like(next(b for b in clients if b)[0])] for _ in members]
    shard = pad(members, rows)
    result.append(shard)
    if stats is not None:
      stats.real_rows += int(shard['mask'].sum())
      stats.padded_rows += int(shard['mask'].size)
      stats.shards += 1
  return result


def with_client_states(shards: Shards, states: Sequence[Sequence[Any]], structure) -> Shards:
  """`shards`, each with its clients' states stacked as 'client_state'.

  `states[i]`: the leaves (arrays, in `structure`'s order) of the state of the
  cohort's i-th client. The shards are copied, not changed: prefetched data
  is built before the previous round has returned the states.
  """
  held = sum(len(g) for g in getattr(shards, 'groups', []))
  if not isinstance(shards, Shards) or held != len(states):
    raise ValueError(f'with_client_states: {len(states)} client states for shards of {held} '
                     'clients (shards must come from make_shards, given the clients in the '
                     'order of the states)')
  result = Shards(groups=shards.groups)
  for shard, group in zip(shards, shards.groups):
    leaves = [np.stack([np.asarray(states[i][k]) for i in group])
              for k in range(len(tf.nest.flatten(structure)))]
    result.append(collections.OrderedDict(
        shard, client_state=tf.nest.pack_sequence_as(structure, leaves)))
  return result


def with_test_batches(shards: Shards, tests: Sequence[ClientBatches]) -> Shards:
  """`shards`, each with its clients' test batches padded as 'test' (batches, mask).

  `tests[i]`: the test batches of the cohort's i-th client (user accuracy,
  `extensions/user_accuracy.py`). Copied, as `with_client_states`.
  """
  held = sum(len(g) for g in getattr(shards, 'groups', []))
  if not isinstance(shards, Shards) or held != len(tests):
    raise ValueError(f'with_test_batches: test batches of {len(tests)} clients for shards of '
                     f'{held} clients (shards must come from make_shards, given the clients in '
                     'the order of the test batches)')
  like = next((b[0] for b in tests if b), None)
  result = Shards(groups=shards.groups)
  for shard, group in zip(shards, shards.groups):
    members = [list(tests[i]) for i in group]
    if not any(members):  # no test data in the shard: one empty batch, counted as none
      first = like if like is not None else tf.nest.map_structure(lambda a: a[0, 0],
                                                                   shard['batches'])
      members = [[_empty_like(first)] for _ in members]
    result.append(collections.OrderedDict(shard, test=pad(members)))
  return result


def _empty_like(batch):
  return tf.nest.map_structure(lambda a: np.asarray(a)[:0], batch)


class ClientCache:
  """Clients' batches kept as arrays, least recently used first out, under a byte budget.

  Keyed by (client id, K): with the task's fixed shuffle seed a client's K
  batches are the same every round, so they are read from tf.data once.
  """

  def __init__(self, dataset_fn: Callable[[Sequence[str]], Sequence[tf.data.Dataset]],
               budget_bytes: int = 1 << 30):
    self._dataset_fn = dataset_fn
    self._budget = budget_bytes
    self._entries: collections.OrderedDict = collections.OrderedDict()
    self._bytes = 0
    self._lock = threading.Lock()
    # Held while missing clients are read: a second caller (another feeder
    # sharing this cache) waits for them instead of reading them again.
    self._reading = threading.Lock()

  @property
  def nbytes(self) -> int:
    return self._bytes

  def get(self, client_ids: Sequence[str], local_steps: int) -> list[ClientBatches]:
    with self._reading:
      with self._lock:
        missing = [cid for cid in client_ids if (cid, local_steps) not in self._entries]
      if missing:
        built = [client_batches(ds, local_steps) for ds in self._dataset_fn(missing)]
        with self._lock:
          for cid, batches in zip(missing, built):
            self._put((cid, local_steps), batches)
    with self._lock:
      result = []
      for cid in client_ids:
        key = (cid, local_steps)
        batches = self._entries.get(key)
        if batches is None:  # evicted meanwhile: larger than the budget
          batches = client_batches(self._dataset_fn([cid])[0], local_steps)
        else:
          self._entries.move_to_end(key)
        result.append(batches)
      return result

  def _put(self, key, batches):
    size = sum(np.asarray(leaf).nbytes for b in batches for leaf in tf.nest.flatten(b))
    if key in self._entries or size > self._budget:
      return
    self._entries[key] = batches
    self._bytes += size
    while self._bytes > self._budget:
      _, old = self._entries.popitem(last=False)
      self._bytes -= sum(np.asarray(leaf).nbytes for b in old for leaf in tf.nest.flatten(b))


class Prefetcher:
  """Builds the next round's shards on a background thread while this round trains."""

  def __init__(self, build: Callable[..., Any]):
    self._build = build
    self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                       thread_name_prefix='cohort-data')
    self._pending: dict = {}

  def prefetch(self, key, *args) -> None:
    if key not in self._pending:
      self._pending[key] = self._pool.submit(self._build, *args)

  def get(self, key, *args):
    future = self._pending.pop(key, None)
    # Anything else pending is stale (the schedule changed K, say): dropped.
    for stale in self._pending.values():
      stale.cancel()
    self._pending.clear()
    return future.result() if future is not None else self._build(*args)

  def close(self) -> None:
    self._pool.shutdown(wait=True, cancel_futures=True)


def shard_from_ids(client_ids: tf.Tensor, local_steps: tf.Tensor,
                   client_dataset_fn: Callable[[tf.Tensor], tf.data.Dataset]):
  """One shard built in the graph from client ids (TFF workers build their own).

  The layout of `shards`' (see module docstring): each client's batches are
  `client_batches`' (K > 0: exactly K, cycling; K <= 0: the dataset as given),
  padded with zero rows and steps to the shard's longest batch and longest
  client, so K-step shards have K steps and epoch-based ones the steps of the
  shard's longest client. A shard pads rows to its own largest batch, not the
  cohort's: masked rows add exact zeros, so the sums are the same.

  One pass over the data: every batch's rows are appended to one array per
  leaf, with its row count and its client's index; a ragged tensor of
  [clients, (steps), (rows)] then pads them. Batch leaves need fixed shapes
  after the row dimension.
  """
  steps = tf.cast(local_steps, tf.int64)
  cycle = steps > 0

  def one_client(index, client_id):
    batches = client_dataset_fn(client_id)
    # `per_client._batches`: the same K batches as the per-client round.
    batches = batches.repeat(tf.where(cycle, tf.constant(-1, tf.int64), 1)).take(
        tf.where(cycle, steps, -1))
    return batches.map(lambda batch: (index, batch))

  indexed = tf.data.Dataset.from_tensor_slices(
      (tf.range(tf.size(client_ids, out_type=tf.int64)), client_ids))
  batches = indexed.flat_map(one_client)
  specs = tf.nest.flatten(batches.element_spec[1])
  if any(None in s.shape[1:].as_list() for s in specs):
    raise ValueError('shard_from_ids: its batches cannot be padded into one shard, their '
                     f'shapes after the row dimension vary ({[s.shape for s in specs]})')

  def append(state, element):
    index, batch = element
    leaves = tf.nest.flatten(batch)
    rows = tf.shape(leaves[0], out_type=tf.int64)[0]
    arrays, counts, owners = state
    step = counts.size()
    arrays = tuple(a.write(step, leaf) for a, leaf in zip(arrays, leaves))
    return arrays, counts.write(step, rows), owners.write(step, index)

  # Tuples in the state: tf.data would stack a list into one tensor.
  array = lambda dtype, shape: tf.TensorArray(dtype, size=0, dynamic_size=True,
                                              infer_shape=False, element_shape=shape)
  arrays, counts, owners = batches.reduce(
      (tuple(array(s.dtype, [None] + s.shape[1:].as_list()) for s in specs),
       array(tf.int64, []), array(tf.int64, [])), append)
  counts = counts.stack()
  by_step = lambda flat: tf.RaggedTensor.from_value_rowids(
      tf.RaggedTensor.from_row_lengths(flat, counts), owners.stack(),
      nrows=tf.size(client_ids, out_type=tf.int64)).to_tensor()
  leaves = [by_step(a.concat()) for a in arrays]
  mask = by_step(tf.ones([tf.reduce_sum(counts)], tf.float32))
  return collections.OrderedDict(
      batches=tf.nest.pack_sequence_as(batches.element_spec[1], leaves), mask=mask)
