"""The round engine: one federated round in small parts every execution shares.

  recipe.py      an algorithm's math (`Recipe`): the only place it is written
  client.py      one client's round: init / step / final (+ the sums sent up)
  server.py      the server step, costs and metrics of a round
  layout.py      the state layout (TFF's `LearningAlgorithmState`) and hparams
  per_client.py  execution 1: each client its own TFF computation call
  cohort.py      execution 2: the whole cohort as one compiled program
  cohort_data.py the cohort's client data as padded tensors, cached
  functional.py  a Keras-backed model as pure functions of its weights

`tff_adaptive.algorithms.composer` is the entry point algorithms use.
"""
