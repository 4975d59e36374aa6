"""A TFF worker for multi-machine training (bin/train.py --workers=host:port,...).

Example (on each worker machine):
  bin/worker.py --port=8000
then on the trainer:
  bin/train.py --workers=host1:8000,host2:8000 ...

Runs TFF's own gRPC executor service (tensorflow_federated/data/worker_binary)
in the foreground, forwarding --port, --max_concurrent_computation_calls and
--grpc_max_message_length_megabytes, and any arguments after `--` verbatim.
Stops it cleanly on SIGINT (Ctrl-C) or SIGTERM; the binary is also killed if
this process dies.

SECURITY: the worker executes ANY computation sent to it (TensorFlow graphs
can read and write files and run code on this host), without authentication
or encryption. It listens on all interfaces: it must only be reachable from
the trainer's hosts (private network, firewall rule, or an SSH tunnel).
"""

import os
import signal
import socket
import sys
import threading

from absl import app
from absl import flags
from absl import logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')  # TF's C++ log only when asked
# pylint: disable=g-import-not-at-top
# No TensorFlow here: the binary is self-contained, and this stays light.
from tff_adaptive.execution import runtime
from tff_adaptive.execution import worker_process

flags.DEFINE_integer('port', 10000, 'Port the worker serves on (all interfaces). '
                     + worker_process.SECURITY_NOTE)
flags.DEFINE_integer('max_concurrent_computation_calls', 0,
                     'Max parallel calls of a computation on this worker (clients trained at '
                     'once; limits memory). 0: two per CPU core of this machine (the fastest '
                     'measured, docs/performance.md); -1: no limit.')
flags.DEFINE_integer('grpc_max_message_length_megabytes', 10000,
                     'Largest gRPC message accepted (models and datasets travel in them).')
flags.DEFINE_string('log_file', '', 'Where the binary\'s own output goes; empty: this '
                    'process\'s stdout/stderr.')
flags.DEFINE_float('ready_timeout', 60.0, 'Seconds the binary has to start serving.')
FLAGS = flags.FLAGS


def main(argv):
  runtime.track_tff_workers()  # disarms TFF's exit-time ServiceManager noise
  logging.set_verbosity(logging.INFO)
  if not 0 < FLAGS.port < 65536:
    print(f'{os.path.basename(sys.argv[0])}: error: --port must be in 1..65535; got '
          f'{FLAGS.port}', file=sys.stderr)
    sys.exit(2)
  logging.warning('SECURITY: %s', worker_process.SECURITY_NOTE)
  worker = worker_process.WorkerProcess(
      FLAGS.port, max_concurrent_computation_calls=FLAGS.max_concurrent_computation_calls,
      extra_args=[f'--grpc_max_message_length_megabytes={FLAGS.grpc_max_message_length_megabytes}',
                  *argv[1:]],
      log_path=FLAGS.log_file or '-')

  stop = threading.Event()
  received = []

  def on_signal(signum, frame):
    del frame
    received.append(signal.Signals(signum).name)
    stop.set()

  # Installed explicitly: a shell starting us in the background ignores
  # SIGINT, and Python would not install its own handler.
  signal.signal(signal.SIGINT, on_signal)
  signal.signal(signal.SIGTERM, on_signal)

  try:
    worker.start(wait=True, timeout=FLAGS.ready_timeout)
  except worker_process.WorkerError as e:
    logging.error('%s', e)
    worker.stop()
    sys.exit(1)
  logging.info('TFF worker (pid %d, binary pid %d) listening on port %d on all interfaces; '
               'trainer flag: --workers=%s:%d', os.getpid(), worker.pid, worker.port,
               socket.getfqdn(), worker.port)
  logging.info('Executes any computation sent to it: keep port %d reachable only from the '
               'trainer\'s hosts. Stop with Ctrl-C or SIGTERM.', worker.port)
  while not stop.is_set():
    if worker.poll() is not None:
      logging.error('TFF worker binary exited with status %s', worker.poll())
      sys.exit(1)
    stop.wait(0.5)
  logging.info('%s received: stopping the TFF worker on port %d', received[0], worker.port)
  worker.stop()
  logging.info('TFF worker stopped')


if __name__ == '__main__':
  app.run(main)
