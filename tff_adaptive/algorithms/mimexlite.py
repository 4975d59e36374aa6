"""MimeXlite: Mimelite whose "full" gradient is one minibatch gradient.

Karimireddy et al., "Breaking the centralized barrier for cross-device
federated learning" (Mime), NeurIPS 2021; the cheaper variant of the FedGBO paper
(docs/algorithms.md#mimelite-and-mimexlite). Mime's math (one recipe for
both) is in `mimelite.py`.

  server → clients: x_t and the base optimiser state s_t.
  client:           g_0 = ∇f(x_t; first minibatch)  (one minibatch, not n_i);
                    K steps y_k = BaseOpt_{s_t}(y_{k−1}, g_k) with s_t FIXED
                    (the optimiser's new state is discarded, as in TFF's Mime);
                    Δ_i = x_t − y_K.
  clients → server: Δ_i and g_0 (2|x|).
  server:           x_{t+1} = ServerOpt(x_t, Δ̄);  s_{t+1} = BaseOpt state after
                    one step with the weighted mean of g_0.
  network per client: down |x| + |s|, up 2|x|.

g_0 is the gradient of the first local step, so the extra minibatch costs no
extra forward/backward pass here; with K = 1 and a one-batch dataset this is
exactly TFF's Mimelite (tested).
"""

from typing import Any, Optional

import tensorflow_federated as tff

from tff_adaptive import errors
from tff_adaptive.algorithms import composer
from tff_adaptive.algorithms import mimelite


def build_mimexlite(
    model_fn: composer.ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    local_steps: int,
    ops_per_param: Optional[float] = None,
    **options: Any,
) -> tff.learning.templates.LearningProcess:
  """MimeXlite (see module docstring).

  Args: as `mimelite.build_mimelite`'s (the base optimiser may also be one of
  the paper-semantics or SM3 optimisers), except:
    local_steps: K ≥ 1 (required: MimeXlite runs exactly K local steps per client).
    Others (`**options`): as `fedgbo.build_fedgbo`.
  """
  if not local_steps or local_steps < 1:
    raise errors.ArgumentError('mimexlite', 'local_steps', 'must be an integer ≥ 1 (MimeXlite '
                               f'runs exactly K local steps per client); got {local_steps!r}')
  return mimelite.build_mime('mimexlite', 'first', model_fn, client_optimizer_fn,
                            server_optimizer_fn, local_steps=local_steps,
                            ops_per_param=ops_per_param, options=options)
