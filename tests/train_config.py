"""bin/train for the tests: small in-process `digits` runs, and refused runs.

`small_run`'s values are bin/train's defaults except where a short test run
needs others (a few clients and rounds, unlimited concurrency, no progress
bar, the clients of a cohort in sequence). `train` runs a bin/train command
line in this process, for the tests whose behaviour does not need the process
boundary (signals, another process's lock and the interpreter's exit status
do). `refused_runs` runs the real binary on bad flags, two at a time.

The clients run in sequence (`--cohort_mode=sequential`) where the test is
not about the execution: tracing the vectorised cohort program costs about
three times as much per built process (the digits MLP, measured), and what
these tests check (resume, checkpoints, messages) does not depend on it. The
executions' equality is tests/test_cohort*.py's; bin/train's default
execution runs in test_train_workflow's runs of every algorithm by its name.
"""

import asyncio
import concurrent.futures
import contextlib
import io
import os
import signal
import subprocess
import sys

from workflow import errors
from workflow.flags import config
from workflow.training import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BASE = dict(
    task='digits', partition='dirichlet', num_clients=6, dirichlet_alpha=0.5,
    digits_model='mlp', clients_per_round=3, client_batch_size=20,
    client_epochs_per_round=1, local_steps=0, client_optimizer='sgd',
    client_learning_rate=0.1, client_beta_1=0.9, client_beta_2=0.99,
    client_epsilon=1e-8, client_weighting='default', algorithm='fedavg',
    server_optimizer='', server_learning_rate=1.0, server_optimizer_semantics='tff',
    server_beta_1=0.9, server_beta_2=0.99, server_epsilon=1e-3,
    local_steps_schedule='constant', client_lr_schedule='constant',
    server_lr_schedule='constant', step_time_seconds=0.0, measure_step_time=False,
    download_mbps=20.0, upload_mbps=5.0, total_rounds=5, rounds_per_eval=5,
    rounds_per_checkpoint=5, seed=3, execution_concurrency=-1, show_progress=False,
    workers='', worker_retry=False, data_on_workers=False, data_dir='', dp=False,
    trust_command_line=False, cohort_mode='sequential')


def small_run(root, name: str, **overrides) -> config.Settings:
  """The settings of a run named `name` under `root`, with `overrides` (by flag name)."""
  return config.from_flags({**BASE, 'root_output_dir': str(root), 'experiment_name': name,
                            **overrides})


def _in_process(run, program: str) -> tuple[int, str]:
  """(exit status, stdout and stderr) of `run()` reported as bin/train reports a RunError.

  The caller's SIGINT/SIGTERM handlers are put back afterwards (a stopped run
  leaves the default actions).
  """
  out = io.StringIO()
  handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
  with contextlib.redirect_stderr(out), contextlib.redirect_stdout(out):
    try:
      run()
      code = 0
    except errors.RunError as e:
      code = errors.report(e, program)
    finally:
      for s, handler in handlers.items():
        signal.signal(s, handler)
  return code, out.getvalue()


def train(args, program: str = 'train.py') -> tuple[int, str]:
  """(exit status, output) of bin/train's command line `args`, run in this process: what
  bin/train does once absl has parsed it (resolve the flags, check them, run, report;
  --together: its members')."""
  def run():
    from workflow.training import together  # pylint: disable=g-import-not-at-top
    values = cli.parsed_args(args, program)
    settings, notes = cli.resolve_flags(values)
    members = together.members_of(settings, values, cli.config_from_args)
    for member, _ in members or [(settings, notes)]:
      cli.check_settings(member)
    cli.run_training(settings, notes, members)

  return _in_process(run, program)


def train_settings(settings: config.Settings) -> tuple[int, list[str]]:
  """(exit status, the output's non-empty lines) of `cli.run_training(settings)` in this
  process, its error reported as bin/train would."""
  code, output = _in_process(lambda: cli.run_training(settings), 'train.py')
  return code, [line for line in output.splitlines() if line.strip()]


def refused_runs(tmp_path, arg_lists):
  """bin/train on `--task=digits` + each argument list, two at a time: [(result, out dir)]."""
  def run(i):
    out = tmp_path / f'out{i}'
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, 'bin', 'train.py'), '--task=digits',
         f'--root_output_dir={out}', '--show_progress=false', *arg_lists[i]],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    return result, out

  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    return list(pool.map(run, range(len(arg_lists))))


def assert_refused(result, out, flag: str, args=()) -> None:
  """Exit 2 with one line naming `flag`, before anything was written."""
  lines = [l for l in result.stderr.splitlines() if l.strip()]
  assert result.returncode == 2, (args, result.stderr[-2000:])
  assert len(lines) == 1 and 'error' in lines[0] and flag in lines[0], (args, result.stderr)
  assert not out.exists()  # failed before writing anything


def final_checkpoint(out_dir):
  """(latest version, flattened saved program state) of a run, read without a structure."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.program import file_utils  # pylint: disable=g-import-not-at-top
  ckpt_dir = os.path.join(out_dir, 'checkpoints')
  version = max(int(name.rsplit('_', 1)[1]) for name in os.listdir(ckpt_dir))
  state = asyncio.run(file_utils.read_saved_model(os.path.join(ckpt_dir, f'program_state_{version}')))
  return version, [np.asarray(x) for x in tf.nest.flatten(state)]
