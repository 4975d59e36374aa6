"""The FedOpt server optimisers: one entry each, importable without TensorFlow.

An entry names its FedOpt algorithm and its builders; everything else follows
from it: `names.FEDOPT_SERVER_OPTIMIZERS` and the algorithm's name (which
bin/train offers), `fedopt.build_server_optimizer(<name>, ...)` and
`fedopt.build_<algorithm>`. docs/algorithms.md#adding-a-server-optimiser shows
one added.

A builder is named as 'module:attribute.path' and imported only when a process
is built, so that a binary checks its arguments against this table before
TensorFlow loads.
"""

import dataclasses
from collections.abc import Mapping
from typing import Optional


@dataclasses.dataclass(frozen=True)
class Builder:
  """function(learning_rate, **{keyword: the hyperparameter it maps from}) → Optimizer.

  The hyperparameters are `fedopt.build_server_optimizer`'s: beta_1, beta_2,
  tau, momentum, initial_accumulator. One left None (initial_accumulator unless
  given) is not passed, so that the builder's own default holds.
  """
  function: str
  keywords: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ServerOptimizer:
  """A server optimiser of FedOpt (Reddi et al. 2021, Algorithm 2).

  algorithm: the FedOpt algorithm that is FedAvg's round with this server step.
  tff: its builder under `semantics='tff'` (TFF's optimiser as shipped).
  paper: its builder under `semantics='paper'` (the paper's Algorithm 2
    exactly); None where the rule has one form (SGD, momentum), which then
    ignores the semantics.
  adaptive: a per-coordinate adaptive step, which wants a server learning rate
    far below FedAvg's 1 (bin/train's default for its algorithm).
  """
  algorithm: str
  tff: Builder
  paper: Optional[Builder] = None
  adaptive: bool = False


_TFF = 'tensorflow_federated:learning.optimizers.'
_PAPER = 'tff_adaptive.optimizers.paper_fedopt:'
# tau is TFF's epsilon; the paper's builders call it tau and start v from initial_accumulator.
_TFF_ADAPTIVE = {'beta_1': 'beta_1', 'beta_2': 'beta_2', 'epsilon': 'tau'}
_PAPER_ADAPTIVE = {'beta_1': 'beta_1', 'beta_2': 'beta_2', 'tau': 'tau',
                   'initial_accumulator_value': 'initial_accumulator'}

SERVER_OPTIMIZERS: dict[str, ServerOptimizer] = {
    'sgd': ServerOptimizer('fedavg', Builder(_TFF + 'build_sgdm')),
    'sgdm': ServerOptimizer('fedavgm', Builder(_TFF + 'build_sgdm', {'momentum': 'momentum'})),
    'adagrad': ServerOptimizer(
        'fedadagrad',
        Builder(_TFF + 'build_adagrad',
                {'epsilon': 'tau', 'initial_preconditioner_value': 'initial_accumulator'}),
        Builder(_PAPER + 'build_paper_adagrad', _PAPER_ADAPTIVE), adaptive=True),
    'adam': ServerOptimizer('fedadam', Builder(_TFF + 'build_adam', _TFF_ADAPTIVE),
                            Builder(_PAPER + 'build_paper_adam', _PAPER_ADAPTIVE), adaptive=True),
    'yogi': ServerOptimizer(
        'fedyogi',
        Builder(_TFF + 'build_yogi',
                {**_TFF_ADAPTIVE, 'initial_preconditioner_value': 'initial_accumulator'}),
        Builder(_PAPER + 'build_paper_yogi', _PAPER_ADAPTIVE), adaptive=True),
}
