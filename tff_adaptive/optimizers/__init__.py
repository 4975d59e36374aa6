"""Optimisers: FedOpt paper semantics (Algorithm 2) and SM3 for FedAda2."""

from tff_adaptive.optimizers.paper_fedopt import build_paper_adagrad
from tff_adaptive.optimizers.paper_fedopt import build_paper_adam
from tff_adaptive.optimizers.paper_fedopt import build_paper_client_adagrad
from tff_adaptive.optimizers.paper_fedopt import build_paper_client_adam
from tff_adaptive.optimizers.paper_fedopt import build_paper_yogi
from tff_adaptive.optimizers.sm3 import build_sm3_adagrad
from tff_adaptive.optimizers.sm3 import build_sm3_adam
from tff_adaptive.optimizers.sm3 import client_state_floats
from tff_adaptive.optimizers.sm3 import cover_shapes
from tff_adaptive.optimizers.sm3 import sm3_statistics_floats
