"""The local step takes more gradients than the engine's one per step.

Per-FedAvg (Fallah et al. 2020) reads two batches a meta-step and takes
∇f(ỹ; D') at a point of its own; pFedMe (T. Dinh et al. 2020) takes the
step's gradient at its personalised θ and more at its inner points. The
local step receives `grad_at(weights, j)` → (∇f(weights; the step's batch j),
loss) by keyword: each call is one more forward/backward pass, whose
examples count in the model's metrics, as every forward pass of TFF's
training does.
"""

from collections.abc import Callable
from typing import Optional

from tff_adaptive.rounds import extension


class MoreGradients(extension.Extension):
  """Attributes:
    batches_per_step: minibatches one local step consumes, consecutive in the
      client's stream (Per-FedAvg's D, D'): K steps read K × this many batches
      (cycling); one pass reads whole groups, a last incomplete group is left
      out. The engine's g is on the group's first batch.
    gradient_at: (local, y) → where the engine's g of each step is taken
      (pFedMe: its θ); None: at y.
    passes_per_example: forward/backward passes a step makes per trained
      example, for the FLOP count (pFedMe: its inner steps).
  """
  name = 'more_gradients'
  extra_training_passes = True
  steps_outside_unsupported = ('takes more gradients per step (grad_at), which the '
                               'vectorised recurrent program does not give')

  def __init__(self, batches_per_step: int = 1,
               gradient_at: Optional[Callable[..., list]] = None,
               passes_per_example: float = 1.0):
    if batches_per_step < 1:
      raise ValueError(f'more_gradients: batches_per_step must be at least 1; got '
                       f'{batches_per_step}')
    self.batches_per_step = batches_per_step
    self._gradient_at = gradient_at
    self.extra_passes_per_example = passes_per_example - 1.0

  def gradient_point(self, carry):
    if self._gradient_at is None:
      return None
    return list(self._gradient_at(carry['local'], list(carry['y'])))

  def step_context(self, carry, grad_at) -> dict:
    return {'grad_at': grad_at}
