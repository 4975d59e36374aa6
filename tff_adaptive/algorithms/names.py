"""The algorithms' and optimisers' names, importable without TensorFlow.

A binary checks its flags against these tables before it imports TensorFlow
(a typo is answered in a fraction of a second); the builders that use them
(`fedopt`, `fedada2`) import them from here, so each name has one home.
"""

from tff_adaptive.algorithms.server_optimizers import SERVER_OPTIMIZERS

# The FedOpt family (Reddi et al. 2021, Algorithm 2): each algorithm is
# FedAvg's round with its server optimiser, an entry of server_optimizers.py.
FEDOPT_SERVER_OPTIMIZERS = tuple(SERVER_OPTIMIZERS)
FEDOPT_ALGORITHM_SERVER_OPTIMIZER = {
    entry.algorithm: name for name, entry in SERVER_OPTIMIZERS.items()}
FEDOPT_ADAPTIVE_SERVER_OPTIMIZERS = tuple(
    name for name, entry in SERVER_OPTIMIZERS.items() if entry.adaptive)
# The server optimisers' update rules: TFF's as shipped, or the paper's.
FEDOPT_SEMANTICS = ('tff', 'paper')

# FedAda2's client optimisers (SM3 or dense) and server optimisers.
FEDADA2_CLIENT_OPTIMIZERS = ('sm3_adam', 'sm3_adagrad', 'adam', 'adagrad')
FEDADA2_SERVER_OPTIMIZERS = ('adam', 'adagrad')
FEDADA2_PRECONDITIONERS = ('dja', 'none')
