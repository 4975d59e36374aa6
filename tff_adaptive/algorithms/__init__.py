"""Algorithm builders, one module per paper algorithm.

Every builder is shaped like TFF's `build_weighted_fed_avg`:

  build_<algorithm>(model_fn, client_optimizer_fn[, server_optimizer_fn], *,
                    local_steps, client_weighting, model_distributor,
                    model_aggregator, metrics_aggregator, loop_implementation,
                    <algorithm-specific keywords>, fb_flops_per_example)

`model_fn` is a no-arg callable returning a `tff.learning.models.VariableModel`
or a `tff.learning.models.FunctionalModel`; the optimisers are
`tff.learning.optimizers.Optimizer`s (the client learning rate is the client
optimiser's). Each returns a `tff.learning.templates.LearningProcess` whose
state is a `tff.learning.templates.LearningAlgorithmState` and whose metrics
have TFF's top-level keys plus `cost` (see `composer`). The personalised
builders return processes whose clients also take back their user accuracy
(mtfl, perfedavg, pfedme: a `rounds.stateful.PersonalizedClientsProcess`), with
the same state layout. An argument that cannot apply to an algorithm is an error,
not ignored.

Importing this package changes nothing in TFF: to keep TFF's `worker_binary`
children from outliving the program, call
`tff_adaptive.execution.runtime.track_tff_workers()` (or `use_local_cpp_context()`)
once at the start (docs/library.md).
"""
