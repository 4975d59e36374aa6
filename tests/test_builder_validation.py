"""Builders check `model_fn`, `client_weighting` and the aggregators as TFF's
`build_weighted_fed_avg` does (TFF's own fed_avg_test asserts these): TypeError naming the
argument, raised while building (nothing is run); bad hyperparameters a ValueError naming
the argument."""

import pytest
import tensorflow_federated as tff

import algorithm_testing as at
from tff_adaptive.algorithms import ce_fedavg
from tff_adaptive.algorithms import fedada2
from tff_adaptive.algorithms import fedgbo
from tff_adaptive.algorithms import fedopt
from tff_adaptive.algorithms import mfl
from tff_adaptive.algorithms import mimelite
from tff_adaptive.algorithms import mimexlite
from tff_adaptive.algorithms import mtfl
from tff_adaptive.algorithms import perfedavg
from tff_adaptive.algorithms import pfedme
from tff_adaptive.optimizers import biased as biased_optimizers

opts = tff.learning.optimizers

# name -> (model_fn, **kwargs) -> process; every builder that builds its own round.
BUILDERS = {
    'fedopt': lambda m, **kw: fedopt.build_fedopt(m, opts.build_sgdm(0.1), **kw),
    'fedgbo': lambda m, **kw: fedgbo.build_fedgbo(m, opts.build_adam(0.1), local_steps=2, **kw),
    'mfl': lambda m, **kw: mfl.build_mfl(m, opts.build_adam(0.1), **kw),
    'mimexlite': lambda m, **kw: mimexlite.build_mimexlite(m, opts.build_adam(0.1),
                                                           local_steps=2, **kw),
    'fedada2': lambda m, **kw: fedada2.build_fedada2(m, opts.build_adam(0.1),
                                                     opts.build_adam(0.1), **kw),
    'ce_fedavg': lambda m, **kw: ce_fedavg.build_ce_fedavg(m, opts.build_adam(0.1), sparsity=0.5,
                                                           **kw),
    'perfedavg': lambda m, **kw: perfedavg.build_perfedavg(m, opts.build_sgdm(0.1), beta=0.1,
                                                           **kw),
    'pfedme': lambda m, **kw: pfedme.build_pfedme(m, opts.build_sgdm(0.1), **kw),
    'mtfl': lambda m, **kw: mtfl.build_mtfl(m, at.keras_model, opts.build_sgdm(0.1),
                                            private='none', **kw),
}
AGGREGATING = ('fedopt', 'fedgbo', 'mfl', 'mimexlite', 'fedada2')


@pytest.mark.parametrize('name', sorted(BUILDERS))
def test_model_fn_returning_a_non_model_is_a_type_error_naming_it(name):
  with pytest.raises(TypeError, match='model_fn') as raised:
    BUILDERS[name](lambda: 0)
  assert 'int' in str(raised.value)


@pytest.mark.parametrize('name', sorted(BUILDERS))
def test_a_string_client_weighting_is_a_type_error_naming_it(name):
  with pytest.raises(TypeError, match='client_weighting'):
    BUILDERS[name](at.model_fn, client_weighting='num_examples')


@pytest.mark.parametrize('name', AGGREGATING)
def test_a_model_aggregator_that_is_no_factory_is_a_type_error_naming_it(name):
  with pytest.raises(TypeError, match='model_aggregator'):
    BUILDERS[name](at.model_fn, model_aggregator=tff.aggregators.MeanFactory)  # the class


def test_tffs_own_builder_raises_the_same_type_errors():
  """The behaviour copied: TFF 0.87's build_weighted_fed_avg."""
  with pytest.raises(TypeError, match='model_fn'):
    tff.learning.algorithms.build_weighted_fed_avg(lambda: 0, opts.build_sgdm(0.1))
  with pytest.raises(TypeError, match='client_weighting'):
    tff.learning.algorithms.build_weighted_fed_avg(at.model_fn, opts.build_sgdm(0.1),
                                                   client_weighting='num_examples')


def test_a_model_fn_returning_a_model_still_builds():
  process = BUILDERS['fedopt'](at.model_fn,
                               client_weighting=tff.learning.ClientWeighting.UNIFORM)
  assert isinstance(process, tff.learning.templates.LearningProcess)


def test_builders_refuse_bad_input_naming_the_argument():
  """The library path (no bin/train) refuses the same input, naming its arguments
  (bin/train names the flags: workflow.flags.library_flags)."""
  with pytest.raises(ValueError, match=r'BiasedOptimizer: beta_1 must be in \[0, 1\)'):
    biased_optimizers.BiasedOptimizer('sgdm', beta_1=1.0)
  with pytest.raises(ValueError, match='BiasedOptimizer: beta_2'):
    biased_optimizers.BiasedOptimizer('adam', beta_2=-0.5)
  with pytest.raises(ValueError, match='BiasedOptimizer: epsilon must be > 0'):
    biased_optimizers.BiasedOptimizer('rmsprop', epsilon=0.0)
  with pytest.raises(ValueError, match='BiasedOptimizer: name must be one of'):
    biased_optimizers.BiasedOptimizer('sgd')
  with pytest.raises(ValueError, match='fedgbo: local_steps must be an integer ≥ 1'):
    fedgbo.build_fedgbo(at.model_fn, opts.build_adam(0.1), local_steps=0)
  with pytest.raises(ValueError, match='mimexlite: local_steps must be an integer ≥ 1'):
    mimexlite.build_mimexlite(at.model_fn, opts.build_sgdm(0.1, momentum=0.9), local_steps=0)
  with pytest.raises(TypeError, match='mimelite: full_gradient_aggregator is not supported'):
    mimelite.build_mimelite(at.model_fn, opts.build_sgdm(0.1, momentum=0.9),
                            full_gradient_aggregator=tff.aggregators.MeanFactory())
  with pytest.raises(ValueError, match='mimelite: upload_compression is not supported'):
    mimelite.build_mimelite(at.model_fn, opts.build_sgdm(0.1, momentum=0.9), upload_compression=object())
