"""The machine a benchmark ran on, for its JSON (no TensorFlow: bench/peers.py's
orchestrator imports it too)."""

import collections
import json
import os
import platform


def load_average() -> list[float]:
  return [round(x, 2) for x in os.getloadavg()]


def machine(**versions) -> collections.OrderedDict:
  """Cores, CPU model, memory, Python, the load now, and the given `versions`."""
  cpu = platform.processor() or 'unknown'
  try:
    with open('/proc/cpuinfo') as f:
      cpu = next(l.split(':', 1)[1].strip() for l in f if l.startswith('model name'))
  except (OSError, StopIteration):
    pass
  mem = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30
  return collections.OrderedDict(
      nproc=os.cpu_count(), sched_affinity=len(os.sched_getaffinity(0)), cpu_model=cpu,
      memory_gib=round(mem, 1), python=platform.python_version(), **versions,
      load_average=load_average())


def print_and_save(result, out: str = '') -> None:
  """A probe's result: printed as JSON, and written to `out` when given (its --out)."""
  print(json.dumps(result, indent=1))
  if out:
    with open(out, 'w') as f:
      json.dump(result, f, indent=1)
