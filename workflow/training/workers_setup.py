"""bin/train's TFF workers (--workers, --data_on_workers): connected, and told to come back.

`connect` sets the workers' execution context before anything is built (a dead
worker fails fast, named); `with_data_on_workers` composes a process with the
building of its clients' data on the workers; `WORKER_BACK` is what a run that
lost a worker tells its user.
"""

from workflow import errors
from workflow.flags import config

WORKER_BACK = ('Rerun the same command once the worker is back (or without it in --workers) to '
               'resume from the last checkpoint.')


def connect(execution: config.ExecutionSettings) -> list[str]:
  """The --workers addresses, connected before anything is built (a dead worker fails fast)."""
  from tff_adaptive.execution import remote_context  # pylint: disable=g-import-not-at-top
  from tff_adaptive.execution import worker_process  # pylint: disable=g-import-not-at-top
  addresses = worker_process.parse_addresses(execution.workers or '')
  if addresses:
    try:
      remote_context.set_workers_context(addresses, retry=execution.worker_retry)
    except worker_process.WorkerError as e:
      raise errors.RunFailed(str(e)) from None
  return addresses


def with_data_on_workers(settings: config.Settings, task, process):
  """(`process` taking client ids, its `client_data_fn`): the cohort's shards or each
  client's dataset built on the workers."""
  from tff_adaptive.execution import data_on_workers  # pylint: disable=g-import-not-at-top
  from tff_adaptive.rounds import cohort  # pylint: disable=g-import-not-at-top
  if cohort.is_cohort(process) and not process.execution.in_process:
    composed = data_on_workers.compose_cohort_data_on_workers(process, task)
    client_data_fn = data_on_workers.shard_ids_fn(process.execution.num_shards)
  else:
    composed, data_steps = data_on_workers.compose_data_on_workers(
        process, task, settings.client.local_steps or None)
    client_data_fn = data_on_workers.client_ids_fn(data_steps)
  return composed, client_data_fn
