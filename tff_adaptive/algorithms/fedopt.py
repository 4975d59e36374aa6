"""FedAvg, FedAvgM, FedAdagrad, FedAdam and FedYogi (the FedOpt family).

Reddi et al., "Adaptive Federated Optimization", ICLR 2021 (seed 003),
Algorithm 2.

  client:  K steps (or E epochs) of SGD from x_t; Δ_i = x_t − y_K^i.
  server:  Δ̄ = Σ_i w_i Δ_i / Σ_i w_i;  x_{t+1} = ServerOpt(x_t, Δ̄).
  network: down |x| (model weights), up |x| (Δ_i) plus the weight w_i.

This is TFF's `build_weighted_fed_avg` with the server optimiser swapped, as TFF
intends it to be used; we add the paper's exact optimiser semantics
(`semantics='paper'`, see `tff_adaptive.optimizers.paper_fedopt`) and client
learning-rate schedules, and keep TFF's composition (distributor, client work,
aggregator, finalizer) so any TFF aggregator plugs in as `model_aggregator`.
"""

from collections.abc import Callable
from typing import Optional

import tensorflow_federated as tff

SERVER_OPTIMIZERS = ('sgd', 'sgdm', 'adagrad', 'adam', 'yogi')
ALGORITHM_SERVER_OPTIMIZER = {
    'fedavg': 'sgd', 'fedavgm': 'sgdm', 'fedadagrad': 'adagrad', 'fedadam': 'adam',
    'fedyogi': 'yogi',
}


def build_server_optimizer(name: str, learning_rate: float, *, semantics: str = 'tff',
                           beta_1: float = 0.9, beta_2: float = 0.99, tau: float = 1e-3,
                           initial_accumulator: Optional[float] = None,
                           momentum: float = 0.9) -> tff.learning.optimizers.Optimizer:
  """Server optimiser of SPEC §1 under `tff` (as shipped) or `paper` semantics.

  `tff` semantics: TFF's optimisers as shipped (Adam/Yogi bias-corrected with ε =
  τ, Adagrad's ε inside the square root; `initial_accumulator` defaults to each
  TFF builder's own default). `paper` semantics: Algorithm 2 exactly.
  """
  if name == 'sgd':
    return tff.learning.optimizers.build_sgdm(learning_rate)
  if name == 'sgdm':
    return tff.learning.optimizers.build_sgdm(learning_rate, momentum=momentum)
  if semantics == 'paper':
    from tff_adaptive.optimizers import paper_fedopt  # pylint: disable=g-import-not-at-top
    builder = {'adagrad': paper_fedopt.build_paper_adagrad, 'adam': paper_fedopt.build_paper_adam,
               'yogi': paper_fedopt.build_paper_yogi}[name]
    kwargs = {} if initial_accumulator is None else {'initial_accumulator_value': initial_accumulator}
    return builder(learning_rate, beta_1=beta_1, beta_2=beta_2, tau=tau, **kwargs)
  if semantics != 'tff':
    raise ValueError(f"--server_optimizer_semantics must be 'tff' or 'paper'; got {semantics!r}")
  if name == 'adagrad':
    kwargs = {} if initial_accumulator is None else {'initial_preconditioner_value': initial_accumulator}
    return tff.learning.optimizers.build_adagrad(learning_rate, epsilon=tau, **kwargs)
  if name == 'adam':
    return tff.learning.optimizers.build_adam(learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=tau)
  if name == 'yogi':
    kwargs = {} if initial_accumulator is None else {'initial_preconditioner_value': initial_accumulator}
    return tff.learning.optimizers.build_yogi(learning_rate, beta_1=beta_1, beta_2=beta_2,
                                              epsilon=tau, **kwargs)
  raise ValueError(f'--server_optimizer must be one of {", ".join(SERVER_OPTIMIZERS)}; got {name!r}')


def build_fedopt(model_fn: Callable[[], tff.learning.models.VariableModel], *,
                 client_learning_rate: float,
                 server_optimizer: tff.learning.optimizers.Optimizer,
                 client_learning_rate_fn: Optional[Callable[[int], float]] = None,
                 client_weighting: tff.learning.ClientWeighting = tff.learning.ClientWeighting.NUM_EXAMPLES,
                 model_aggregator=None) -> tff.learning.templates.LearningProcess:
  """FedOpt: client SGD, any server optimiser on Δ̄.

  Args:
    model_fn: no-arg callable returning a `tff.learning.models.VariableModel`.
    client_learning_rate: η, the client SGD learning rate.
    server_optimizer: the server optimiser, e.g. from `build_server_optimizer`.
    client_learning_rate_fn: optional round → η schedule (TFF's
      `build_weighted_fed_avg_with_optimizer_schedule`); overrides the constant.
    client_weighting: example-weighted (the paper) or uniform.
    model_aggregator: a `tff.aggregators` factory for Δ (weighted, or
      unweighted with uniform weighting; DP factories are unweighted).
  """
  if client_learning_rate_fn is not None:
    return tff.learning.algorithms.build_weighted_fed_avg_with_optimizer_schedule(
        model_fn, client_learning_rate_fn=client_learning_rate_fn,
        client_optimizer_fn=tff.learning.optimizers.build_sgdm,
        server_optimizer_fn=server_optimizer, model_aggregator=model_aggregator)
  if isinstance(model_aggregator, tff.aggregators.UnweightedAggregationFactory):
    return tff.learning.algorithms.build_unweighted_fed_avg(
        model_fn, tff.learning.optimizers.build_sgdm(client_learning_rate),
        server_optimizer, model_aggregator=model_aggregator)
  return tff.learning.algorithms.build_weighted_fed_avg(
      model_fn, tff.learning.optimizers.build_sgdm(client_learning_rate), server_optimizer,
      client_weighting=client_weighting, model_aggregator=model_aggregator)
