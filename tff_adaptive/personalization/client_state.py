"""Persistent per-client state: each client's private values, kept across rounds.

MTFL (thesis ch. 4, Algorithm 5, docs/algorithms.md#mtfl) has every client keep private
"patch" values (batch-norm μ, σ, γ, β) and the optimiser values of those
patches from one round it takes part in to the next, and never upload them.
A simulation must therefore hold one small state per client for the whole run,
for thousands of clients, and checkpoint it with the server state.

`ClientStateStore` is that store. It never touches an accelerator: values are
NumPy arrays in host memory (a bounded cache) backed by one `.npz` file per
client per snapshot on disk:

  <directory>/store.json             layout (names, shapes, dtypes) + fingerprint
  <directory>/clients/<id>@<r>.npz   a client's state as saved at round r
  <directory>/manifest_<r>.json      {client id: round of its latest file} at r

`save(r)` writes only the clients changed since the last save (copy on write),
then the manifest of round r; a client never seen keeps the `initial` value
and has no file. `restore(r)` reads the manifest of round r, so a resumed run
sees exactly (bit for bit) the values saved with the server checkpoint of
round r, even if later snapshots were written before a crash. The last
`keep_total` manifests and the files they reference are kept, like TFF's
`FileProgramStateManager` keeps program state.

The values enter the TFF computation as per-client data and come back as
per-client output (`rounds.stateful.StatefulClientsProcess`); this class is
only the host-side storage between rounds.
"""

import collections
import io
import json
import os
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any, Optional

import numpy as np

State = collections.OrderedDict  # name → np.ndarray
_FORMAT = 1
_MANIFEST = re.compile(r'^manifest_(\d+)\.json$')
_NEW_DIRECTORY = 'give the store a new directory'


class ClientStateError(ValueError):
  """A client-state directory that does not belong to this model or experiment.

  `problem` is the message without its `remedy`: a caller that knows how the
  directory was chosen (bin/train: from its flags) can name its own remedy.
  """

  def __init__(self, problem: str, remedy: str = ''):
    super().__init__(f'{problem}; {remedy}' if remedy else problem)
    self.problem = problem


def _layout(initial: Mapping[str, np.ndarray]) -> list[list[Any]]:
  return [[name, list(np.shape(value)), np.asarray(value).dtype.str]
          for name, value in initial.items()]


def _atomic_write(path: str, write) -> None:
  tmp = f'{path}.tmp{os.getpid()}'
  # O_NOFOLLOW: a link planted at the (predictable) temporary name fails the
  # write instead of redirecting it; the rename then replaces a link at `path`.
  fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
  with os.fdopen(fd, 'wb') as f:
    write(f)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def _npz_bytes(arrays: Mapping[str, Any]) -> bytes:
  """The `.npz` of `arrays`, built in memory.

  NumPy's savez leaves its ZipFile open when an exception (a Ctrl-C) stops it
  mid-write; written straight into the file, that ZipFile's finaliser then
  seeks the closed file at exit and prints a traceback after bin/train's
  one-line message. In memory, the stopped archive is simply dropped.
  """
  buffer = io.BytesIO()
  np.savez(buffer, **arrays)
  return buffer.getvalue()


class ClientStateStore:
  """Each client's private state, in host memory and one `.npz` per client.

  Args:
    directory: where the snapshots live (created if missing).
    initial: name → array, the state of a client that has not trained yet
      (every client starts from the same values, e.g. the initial patches).
    fingerprint: JSON-able description of the model and experiment that owns
      the directory; opening a directory written with another fingerprint or
      layout raises `ClientStateError`.
    keep_total: snapshots (manifests) kept on disk.
    max_cached: clean states kept in host memory; states changed since the
      last `save` are always kept until it.
  """

  def __init__(self, directory: str, initial: Mapping[str, np.ndarray],
               fingerprint: Mapping[str, Any], *, keep_total: int = 3,
               max_cached: int = 4096):
    if keep_total < 1:
      raise ValueError(f'keep_total must be positive; got {keep_total}')
    self._dir = directory
    self._initial = State((k, np.array(v)) for k, v in initial.items())
    self._layout = _layout(self._initial)
    self._fingerprint = json.loads(json.dumps(dict(fingerprint)))
    self._keep_total = keep_total
    self._max_cached = max_cached
    self._cache: dict[str, State] = collections.OrderedDict()
    self._dirty: set[str] = set()
    self._manifest: dict[str, int] = {}  # client → round of its file
    os.makedirs(os.path.join(directory, 'clients'), exist_ok=True)
    self._check_or_write_meta()

  # ---- identity ----

  def _check_or_write_meta(self):
    path = os.path.join(self._dir, 'store.json')
    meta = {'format': _FORMAT, 'fingerprint': self._fingerprint, 'layout': self._layout}
    if not os.path.exists(path):
      _atomic_write(path, lambda f: f.write(json.dumps(meta, indent=1, sort_keys=True).encode()))
      return
    with open(path) as f:
      saved = json.load(f)
    if saved.get('layout') != self._layout:
      raise ClientStateError(
          f'client-state directory {self._dir} holds state of a different model (private '
          f'values {_describe(saved.get("layout"))}; this model has {_describe(self._layout)})',
          _NEW_DIRECTORY)
    old = saved.get('fingerprint', {})
    for key in sorted(set(old) | set(self._fingerprint)):
      if old.get(key) != self._fingerprint.get(key):
        raise ClientStateError(
            f'client-state directory {self._dir} belongs to a different experiment ({key} is '
            f'{old.get(key)!r} there, {self._fingerprint.get(key)!r} here)', _NEW_DIRECTORY)

  @property
  def directory(self) -> str:
    return self._dir

  @property
  def initial(self) -> State:
    return self._copy(self._initial)

  # ---- values ----

  def get(self, client_id: str) -> State:
    """The client's latest state (a copy), or `initial` if it has none."""
    if client_id in self._cache:
      return self._copy(self._cache[client_id])
    if client_id not in self._manifest:
      return self.initial
    value = self._read(client_id, self._manifest[client_id])
    self._remember(client_id, value)
    return self._copy(value)

  def put(self, client_id: str, value: Mapping[str, Any]) -> None:
    """Records the client's new state (written to disk by the next `save`)."""
    value = State((k, np.array(value[k])) for k in self._initial)
    for (name, shape, dtype), array in zip(self._layout, value.values()):
      if list(array.shape) != shape or array.dtype.str != dtype:
        raise ValueError(f'client {client_id!r}: {name} is {array.dtype}{list(array.shape)}, '
                         f'the store holds {np.dtype(dtype)}{shape}')
    self._dirty.add(client_id)
    self._remember(client_id, value)

  def known_clients(self) -> list[str]:
    """Clients with a state of their own (saved or pending)."""
    return sorted(set(self._manifest) | self._dirty)

  def __contains__(self, client_id: str) -> bool:
    return client_id in self._manifest or client_id in self._dirty

  # ---- snapshots ----

  def versions(self) -> list[int]:
    found = []
    for name in os.listdir(self._dir):
      match = _MANIFEST.match(name)
      if match:
        found.append(int(match.group(1)))
    return sorted(found)

  def save(self, version: int) -> None:
    """Writes the changed clients and the manifest of round `version`."""
    for client_id in sorted(self._dirty):
      value = self._cache[client_id]
      _atomic_write(self._file(client_id, version), lambda f, v=value: f.write(_npz_bytes(v)))
      self._manifest[client_id] = version
    self._dirty.clear()
    manifest = json.dumps(dict(sorted(self._manifest.items()))).encode()
    _atomic_write(self._manifest_path(version), lambda f: f.write(manifest))
    self._trim(keep_until=version)
    self._evict()

  def restore(self, version: int) -> None:
    """Returns to the snapshot of round `version` (0: no client has state).

    Snapshots after `version` (written before a crash that lost the matching
    server checkpoint) are deleted: the run continues from `version`.
    """
    self._cache.clear()
    self._dirty.clear()
    if version == 0:
      self._manifest = {}
    else:
      path = self._manifest_path(version)
      if not os.path.exists(path):
        raise ClientStateError(
            f'client-state directory {self._dir} has no snapshot of round {version}, which the '
            f'server checkpoint needs (snapshots: {self.versions() or "none"}); it was deleted '
            f'or belongs to another run')
      with open(path) as f:
        self._manifest = {k: int(v) for k, v in json.load(f).items()}
    for later in [v for v in self.versions() if v > version]:
      os.remove(self._manifest_path(later))
    self._trim(keep_until=version)

  # ---- internals ----

  def _copy(self, value: State) -> State:
    return State((k, v.copy()) for k, v in value.items())

  def _remember(self, client_id: str, value: State) -> None:
    self._cache[client_id] = value
    self._cache.move_to_end(client_id)  # pytype: disable=attribute-error
    self._evict()

  def _evict(self) -> None:
    if len(self._cache) <= self._max_cached:
      return
    for client_id in list(self._cache):
      if len(self._cache) <= self._max_cached:
        break
      if client_id not in self._dirty:
        del self._cache[client_id]

  def _file(self, client_id: str, version: int) -> str:
    # Client ids are arbitrary strings (LEAF user names, TFF ids): quote them.
    return os.path.join(self._dir, 'clients',
                        f'{urllib.parse.quote(client_id, safe="")}@{version}.npz')

  def _manifest_path(self, version: int) -> str:
    return os.path.join(self._dir, f'manifest_{version}.json')

  def _read(self, client_id: str, version: int) -> State:
    path = self._file(client_id, version)
    try:
      with np.load(path, allow_pickle=False) as data:
        value = State((name, data[name]) for name in data.files)
    except FileNotFoundError:
      raise ClientStateError(f'client-state file {path} is missing (the snapshot was '
                             'damaged or trimmed by another run)') from None
    if _layout(value) != self._layout:
      raise ClientStateError(f'client-state file {path} holds {_describe(_layout(value))}, not '
                             f'this model\'s {_describe(self._layout)}')
    return value

  def _trim(self, keep_until: int) -> None:
    versions = [v for v in self.versions() if v <= keep_until]
    for old in versions[:-self._keep_total]:
      os.remove(self._manifest_path(old))
    referenced = set()
    for version in self.versions():
      with open(self._manifest_path(version)) as f:
        referenced.update(self._file(c, int(r)) for c, r in json.load(f).items())
    referenced.update(self._file(c, r) for c, r in self._manifest.items())
    clients_dir = os.path.join(self._dir, 'clients')
    for name in os.listdir(clients_dir):
      path = os.path.join(clients_dir, name)
      if path not in referenced:
        os.remove(path)


def _describe(layout: Optional[Iterable[Any]]) -> str:
  if not layout:
    return 'nothing'
  return ', '.join(f'{name}{list(shape)}' for name, shape, _ in layout)
