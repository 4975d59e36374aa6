"""The round engine: one federated round in small parts every execution shares.

  recipe.py             an algorithm's math (`Recipe`): the only place it is written
                        (the equations of each: docs/algorithms.md)
  extension.py          `Extension`: the hooks through which a client behaviour beyond
                        the core recipe runs in every execution (the behaviours:
                        tff_adaptive/extensions/)
  skeleton.py           the round, written once: broadcast → client phase → aggregation
                        → server step → output (TFF intrinsics, or calls in process)
  client.py             one client's round: init / before the steps / step / final
                        (+ the sums sent up), calling the extensions' hooks
  server.py             the server step, costs and metrics of a round
  layout.py             the state layout (TFF's `LearningAlgorithmState`) and hparams
  model_info.py         `ModelInfo`: the model and the recipe's types a round needs
  options.py            `RoundOptions`: how a round is aggregated, measured, executed
  validation.py         the checks of the arguments every builder shares, as TFF's
                        builders make them (TypeError/ValueError naming the argument)
  functional.py         a Keras-backed model as pure functions of its weights
  stateful.py           processes whose clients keep state across rounds (SCAFFOLD's c_i,
                        MTFL's private weights), or measure user accuracy
                        (`PersonalizedClientsProcess`)
  processes.py          what both executions build around their round: the process,
                        its client-state arguments, a client's input type
  on_variables.py       a client's passes on the model's variables: the per-client
                        round's, and both executions' evaluations of clients
  per_client.py         client phase 1: each client its own TFF computation call
  cohort.py             client phase 2: the whole cohort as one compiled program, and
                        the cohort processes (plain, stateful clients, personalised)
  cohort_program.py     that program: the clients in sequence, or vectorised (whole,
                        or step by step over lanes for recurrent models)
  cohort_next.py        the cohort process's `next`: client datasets or shards in,
                        the round in process or through TFF
  cohort_data.py        the cohort's client data as padded tensors, cached
  cohort_aggregation.py how the program runs an aggregator's program form (the
                        aggregators themselves: tff_adaptive/aggregators/)
  lanes.py              recurrent models (Embedding, GRU, LSTM, Dense) computed for
                        many lanes at once, the lane axis on their weights
  recurrent.py          which recurrent cohorts vectorise: with lanes.py, or their
                        layers unrolled under tf.vectorized_map
  population.py         a population of runs: P members of one cohort process as one
                        program, its lanes member × client (state with a member axis)
  pfor_trace.py         a cheaper trace of tf.vectorized_map for those programs (TF's
                        pfor broadcasts elementwise inputs with static ranks)

`tff_adaptive.algorithms.composer` is the entry point algorithms use.
"""
