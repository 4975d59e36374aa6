"""Before training, each client measures a personalised model on its own test
split: user accuracy (UA), the personalised-FL measure of Mills et al. (MTFL).

The round's per-client input gains 'test' (the client's test dataset), and
each client returns OrderedDict(ua=OrderedDict(correct, examples, loss_sum)
[, private=its new state]). The test passes are not training: they count in
no metric. The process also evaluates clients without training them
(`PersonalizedClientsProcess.evaluate_clients`).
"""

from collections.abc import Callable
from typing import Optional

import tensorflow_federated as tff

from tff_adaptive.rounds import extension


class UserAccuracy(extension.Extension):
  """Attributes:
    personalize: (x_t, η, grad_at) → the personalised weights UA measures,
      `grad_at(weights, 0)` being the gradient on the client's first training
      batch; None: the client's start weights (with its private weights).
  """
  name = 'user_accuracy'
  evaluates_clients = True
  # Its evaluation loop over the test batches would be the while loop inside
  # vectorized_map that the steps-outside nesting exists to avoid.
  steps_outside_unsupported = ('measures user accuracy, which the vectorised recurrent '
                               "cohort does not run; use mode='sequential'")

  def __init__(self, personalize: Optional[Callable[..., list]] = None):
    self.personalize = personalize

  def input_fields(self, info) -> list:
    return [('test', tff.SequenceType(info.element_type))]

  def measure(self, passes: extension.ClientPasses) -> dict:
    start = list(passes.start[0])
    personalize = None
    if self.personalize is not None:
      personalize = lambda grad_at: list(self.personalize(start, passes.learning_rate, grad_at))
    return {'ua': passes.evaluate(personalize)}

  def before_steps(self, carry, passes: extension.ClientPasses):
    carry.update(self.measure(passes))
    return carry

  def outputs(self, carry) -> dict:
    return {'ua': carry['ua']}

  def cohort_unsupported(self, view, others: tuple) -> Optional[str]:
    del others
    if self.personalize is not None and view.has_non_trainable:
      return extension.MOVED_STATISTICS
    return None
