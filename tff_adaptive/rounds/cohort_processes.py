"""The cohort processes: TFF's learning processes whose `next` runs shard programs.

`cohort.build` makes one of them: `CohortProcess` (a `LearningProcess`),
`StatefulCohortProcess` (clients that keep state, SCAFFOLD's c_i) or
`PersonalizedCohortProcess` (clients that measure user accuracy,
`Recipe.user_accuracy`). What they add to TFF's processes is the same:
padded shards (`make_shards`) and in-process rounds (`cohort_next.py`).
"""

from typing import Optional

import numpy as np
import tensorflow_federated as tff

from tff_adaptive.rounds import cohort_data
from tff_adaptive.rounds import cohort_next
from tff_adaptive.rounds import recipe as recipe_lib
from tff_adaptive.rounds import stateful


class _CohortRounds:
  """What both cohort processes add to TFF's: padded shards, in-process rounds.

  `next(state, client_data)` (`cohort_next.CohortNext`) takes TFF's client
  datasets or `make_shards`' shards; it runs the shards in process when
  `execution.in_process`, else through the TFF computation `tff_next`, whose
  `type_signature` it has. `recipe` is the algorithm's `Recipe` the program
  runs, for tools that time or inspect its functions on their own.
  """
  stateful_clients = False

  def __init__(self, *args, execution, in_process_next, vectorized: bool,
               jit_compile, **kwargs):
    super().__init__(*args, **kwargs)
    self.recipe: Optional[recipe_lib.Recipe] = None  # set by `build`
    self.execution = execution
    self.vectorized = vectorized
    self.jit_compile = jit_compile  # what `execution.jit_compile` resolved to
    self.shard_stats = cohort_data.ShardStats()
    self._next = cohort_next.CohortNext(self, in_process_next or self.tff_next)

  @property
  def next(self) -> cohort_next.CohortNext:
    return self._next

  @property
  def tff_next(self) -> tff.Computation:
    return tff.templates.IterativeProcess.next.fget(self)

  def batches_per_client(self, local_steps: int) -> int:
    """What `cohort_data.client_batches` takes for K local steps: K × the
    recipe's `batches_per_step` (K <= 0, one pass: as given)."""
    return local_steps * self.recipe.batches_per_step if local_steps > 0 else local_steps

  def make_shards(self, client_batches, num_shards: Optional[int] = None) -> cohort_data.Shards:
    """Padded shards from each client's batches (`cohort_data.client_batches`)."""
    return cohort_data.shards(client_batches, num_shards or self.execution.num_shards,
                              self.execution.max_waste, self.shard_stats)


class CohortProcess(_CohortRounds, tff.learning.templates.LearningProcess):
  """A `LearningProcess` whose `next` takes client datasets or padded shards."""


class StatefulCohortProcess(_CohortRounds, stateful.StatefulClientsProcess):
  """The cohort process of a recipe whose clients keep state (SCAFFOLD's c_i).

  `next(state, [process.client_input(dataset, state) for each client])`, as
  per client, or `next(state, process.with_client_states(shards, states))`
  with the sampled clients' stored states (`stateful.flat_state` form, in the
  order their batches were given to `make_shards`), returns their new states
  in `output.clients`, in that same order, as the per-client process does.
  """
  stateful_clients = True

  def with_client_states(self, shards: cohort_data.Shards, states) -> cohort_data.Shards:
    leaves = [[np.asarray(state[k]) for k in self.client_state_initial] for state in states]
    return cohort_data.with_client_states(shards, leaves, self._structure)

  def with_client_inputs(self, shards: cohort_data.Shards, client_data) -> cohort_data.Shards:
    """`shards` with what `client_input` gives each client besides its dataset."""
    return self.with_client_states(shards, [stateful.flat_state(e['private'])
                                            for e in client_data])

  def missing_inputs(self, shard) -> list[str]:
    return [] if 'client_state' in shard else ['client_state']


class PersonalizedCohortProcess(StatefulCohortProcess, stateful.PersonalizedClientsProcess):
  """The cohort process of a recipe whose clients measure user accuracy.

  `next(state, [process.client_input(train, client_state, test=test) ...])`
  as per client, or `next(state, process.with_client_inputs(shards, tests,
  states))`: `tests` are the clients' test batches
  (`cohort_data.client_batches(test, 0)`), in the order their training
  batches were given to `make_shards`; `states` their stored states (when the
  recipe keeps one). `evaluate_clients` runs per client.
  """

  def with_test_batches(self, shards, tests, states=None) -> cohort_data.Shards:
    shards = cohort_data.with_test_batches(shards, tests)
    return self.with_client_states(shards, states) if self.has_private_state else shards

  def with_client_inputs(self, shards, client_data) -> cohort_data.Shards:
    tests = [cohort_data.client_batches(e['test'], 0) for e in client_data]
    states = ([stateful.flat_state(e['private']) for e in client_data]
              if self.has_private_state else None)
    return self.with_test_batches(shards, tests, states)

  def missing_inputs(self, shard) -> list[str]:
    wanted = ['test'] + (['client_state'] if self.has_private_state else [])
    return [key for key in wanted if key not in shard]


def is_cohort(process) -> bool:
  """Whether `process` runs its rounds as cohort programs (`make_shards` applies)."""
  return isinstance(process, _CohortRounds)
