"""A long round says it is alive: a line after a while, then less and less often."""

import contextlib
import sys
import threading
import time

import tqdm


@contextlib.contextmanager
def while_running(round_num: int, config):
  """While the block runs (a round; `config`: `program.LoopConfig`): a line after
  `heartbeat_seconds`, then every 6x as long."""
  if not (config.show_progress and config.heartbeat_seconds > 0):
    yield
    return
  done = threading.Event()
  started = time.monotonic()

  def beat():
    wait = config.heartbeat_seconds
    while not done.wait(wait):
      tqdm.tqdm.write(f'round {round_num}/{config.total_rounds}: still running after '
                      f'{time.monotonic() - started:.0f} s', file=sys.stderr)
      sys.stderr.flush()
      wait = 6 * config.heartbeat_seconds

  thread = threading.Thread(target=beat, name='round-heartbeat', daemon=True)
  thread.start()
  try:
    yield
  finally:
    done.set()
    thread.join()
