"""Per-round schedules of local steps K, client and server learning rates.

  core           what a schedule is (a value per round, feedback, a plain-data
                 state that `schedule_from_state` rebuilds), the constant one;
  learning_rate  FedOpt's learning-rate decays and warm-up (docs/algorithms.md#fedopt, the FedOpt paper);
  local_steps    decaying local work and its step accounting (docs/algorithms.md#schedules:
                 the decaying-K paper, thesis ch. 5);

  driver         applies them to a learning process between rounds;
  quadratic_toy  the decaying-K paper's quadratic toy, in NumPy and as a TFF process.

The thesis's runtime model is `tff_adaptive.accounting.runtime_model`.
"""

# Every schedule registers itself for `core.schedule_from_state` where it is
# defined: importing the package registers them all.
from tff_adaptive.schedules import core
from tff_adaptive.schedules import learning_rate
from tff_adaptive.schedules import local_steps
