"""What a `tff.learning.optimizers.Optimizer` is, read from the optimiser itself.

The builders take their client and server optimisers as TFF `Optimizer`s, as
TFF's own builders do. Most algorithms just call `initialize`/`next`; FedGBO
and MFL cannot: their client step is the table of docs/algorithms.md#fedgbo (fixed-state U,
server inverse I, state track T; `biased.BiasedOptimizer`), which only needs
the optimiser's *kind* and *hyperparameters*. This module reads both:

  * TFF's `build_sgdm` (no momentum: 'sgd'), `build_rmsprop`, `build_adam`,
    `build_adagrad`, `build_yogi`;
  * the package's paper-semantics optimisers (`paper_fedopt.PaperAdaptive`:
    'paper_adam', 'paper_adagrad', 'paper_yogi') and SM3 ('sm3_adam',
    'sm3_adagrad').

The hyperparameters are read through the public optimiser API,
`get_hparams(initialize(()))` (an empty weight structure, so nothing is
allocated); only the kind needs the class. A class this module does not know
is 'other': algorithms that only call `initialize`/`next` still take it.
"""

import collections
import dataclasses
from typing import Any

import tensorflow_federated as tff

from tff_adaptive.optimizers import biased
from tff_adaptive.optimizers import paper_fedopt
from tff_adaptive.optimizers import sm3

TFF_BUILDERS = ('tff.learning.optimizers.build_sgdm', 'build_rmsprop', 'build_adam',
                'build_adagrad', 'build_yogi')
# Ops per parameter per local step (docs/algorithms.md#costs) when the optimiser state moves
# (MFL, FedAda2, FedOpt clients) and when it is held fixed (Mime's base
# optimiser): SGD 2 (w − ηg), momentum 5/8, RMSProp 5/5, Adam 8/11; AdaGrad and
# SM3-AdaGrad as RMSProp without the decay, Yogi as Adam.
_OPS_MOVING = {'sgd': 2, 'sgdm': 8, 'rmsprop': 5, 'adam': 11, 'adagrad': 6, 'yogi': 11,
               'paper_adam': 11, 'paper_adagrad': 6, 'paper_yogi': 11, 'sm3_adam': 11,
               'sm3_adagrad': 6}
_OPS_FIXED = {'sgd': 2, 'sgdm': 5, 'rmsprop': 5, 'adam': 8, 'adagrad': 5, 'yogi': 8,
              'paper_adam': 8, 'paper_adagrad': 5, 'paper_yogi': 8, 'sm3_adam': 8,
              'sm3_adagrad': 5}


@dataclasses.dataclass(frozen=True)
class OptimizerInfo:
  """kind: see the module docstring; hparams: the optimiser's `get_hparams`."""
  kind: str
  hparams: collections.OrderedDict
  bias_correction: bool = False

  @property
  def learning_rate(self) -> float:
    return float(self.hparams[tff.learning.optimizers.LEARNING_RATE_KEY])

  def ops_per_param(self, moving: bool = True) -> float:
    table = _OPS_MOVING if moving else _OPS_FIXED
    return float(table.get(self.kind, table['adam']))


def _kind(optimizer) -> str:
  # TFF's classes are private; import their modules here, not at the top,
  # so a TFF release that moves them breaks only this lookup.
  from tensorflow_federated.python.learning.optimizers import adagrad  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.learning.optimizers import adam  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.learning.optimizers import rmsprop  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.learning.optimizers import sgdm  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.learning.optimizers import yogi  # pylint: disable=g-import-not-at-top
  if isinstance(optimizer, paper_fedopt.PaperAdaptive):
    return 'paper_' + optimizer._kind  # pylint: disable=protected-access
  if isinstance(optimizer, sm3.SM3):
    return 'sm3_adam' if optimizer._form == 'adam' else 'sm3_adagrad'  # pylint: disable=protected-access
  for module, kind in ((sgdm, 'sgdm'), (adam, 'adam'), (rmsprop, 'rmsprop'),
                       (adagrad, 'adagrad'), (yogi, 'yogi')):
    if type(optimizer).__module__ == module.__name__:
      return kind
  return 'other'


def describe(optimizer: Any, *, algorithm: str, role: str = 'client_optimizer_fn') -> OptimizerInfo:
  """Kind and hyperparameters of `optimizer`; TypeError if it is not an Optimizer."""
  if not isinstance(optimizer, tff.learning.optimizers.Optimizer):
    hint = (' (a builder such as tff.learning.optimizers.build_adam(0.01) returns one; pass '
            'its result, not the builder)' if callable(optimizer) else '')
    raise TypeError(f'{algorithm}: {role} must be a tff.learning.optimizers.Optimizer{hint}; '
                    f'got {type(optimizer).__name__}')
  kind = _kind(optimizer)
  hparams = collections.OrderedDict(optimizer.get_hparams(optimizer.initialize(())))
  if kind == 'sgdm' and not float(hparams.get('momentum', 0.0) or 0.0):
    kind = 'sgd'
  bias_correction = bool(getattr(optimizer, '_bias_correction', False))
  return OptimizerInfo(kind, hparams, bias_correction)


def learning_rate(optimizer: Any, *, algorithm: str, role: str = 'client_optimizer_fn') -> float:
  """The optimiser's learning rate; ValueError if it has none."""
  info = describe(optimizer, algorithm=algorithm, role=role)
  if tff.learning.optimizers.LEARNING_RATE_KEY not in info.hparams:
    raise ValueError(f'{algorithm}: {role} {type(optimizer).__name__} has no '
                     f'{tff.learning.optimizers.LEARNING_RATE_KEY!r} hyperparameter, which '
                     'this algorithm schedules')
  return info.learning_rate


def sgd_learning_rate(optimizer: Any, *, algorithm: str) -> float:
  """η of a plain-SGD client optimiser (`build_sgdm(η)`); ValueError for any other."""
  info = describe(optimizer, algorithm=algorithm)
  if info.kind != 'sgd':
    raise ValueError(f'{algorithm} cannot take the client optimiser {type(optimizer).__name__} '
                     f'({info.kind}): its clients run plain SGD; it accepts '
                     'tff.learning.optimizers.build_sgdm(learning_rate) without momentum')
  return info.learning_rate


BIASED_ACCEPTS = ('tff.learning.optimizers.build_sgdm (SGD or momentum), build_rmsprop, '
                  'build_adam, build_adagrad, or tff_adaptive.optimizers.build_paper_client_adam '
                  '/ build_paper_adam / build_paper_client_adagrad')


def to_biased(optimizer: Any, *, algorithm: str,
              bias_correction: bool = False) -> tuple[biased.BiasedOptimizer, float]:
  """(the docs/algorithms.md#fedgbo optimiser with `optimizer`'s hyperparameters, its learning rate).

  SGD → 'sgdm' with β = momentum (0 without momentum: FedGBO is then FedAvg);
  RMSProp → 'rmsprop' with β = decay; Adam (TFF's or paper semantics) →
  'adam' with β1, β2, ε; AdaGrad (TFF's, or the paper-semantics one without
  momentum) → 'adagrad' with ε and its initial accumulator as v_0. The state starts as docs/algorithms.md#fedgbo says (m = 0, v = 1) and
  the table's semantics apply whatever the optimiser's own (TFF's Adam is
  bias-corrected, for instance): the optimiser names the row of the table
  and its hyperparameters. `bias_correction` (or a paper-semantics Adam built
  with it) switches on Adam's bias correction for moving-state steps (MFL).
  """
  info = describe(optimizer, algorithm=algorithm)
  h = info.hparams
  if info.kind in ('sgd', 'sgdm'):
    opt = biased.BiasedOptimizer('sgdm', beta_1=float(h.get('momentum', 0.0) or 0.0))
  elif info.kind == 'rmsprop':
    opt = biased.BiasedOptimizer('rmsprop', beta_1=float(h['decay']),
                                 epsilon=float(h['epsilon']))
  elif info.kind in ('adagrad', 'paper_adagrad'):
    initial = getattr(optimizer, '_initial_precond', getattr(optimizer, '_v0', 1.0))
    if float(h.get('beta_1', 0.0) or 0.0):
      raise ValueError(f'{algorithm} cannot take an AdaGrad with momentum (beta_1 = '
                       f'{h["beta_1"]}); it accepts {BIASED_ACCEPTS}')
    opt = biased.BiasedOptimizer('adagrad', epsilon=float(h['epsilon']),
                                 initial_v=float(initial))
  elif info.kind in ('adam', 'paper_adam'):
    opt = biased.BiasedOptimizer('adam', beta_1=float(h.get('beta_1', 0.0)),
                                 beta_2=float(h['beta_2']), epsilon=float(h['epsilon']),
                                 bias_correction=bias_correction or info.bias_correction)
  else:
    raise ValueError(f'{algorithm} cannot take the client optimiser {type(optimizer).__name__} '
                     f'({info.kind}): its client step is the SGDm / RMSProp / Adam (/ AdaGrad) '
                     f'table of docs/algorithms.md#fedgbo; it accepts {BIASED_ACCEPTS}')
  return opt, info.learning_rate
