"""Per-round schedules of local steps K, client and server learning rates.

  core           the schedules themselves (decaying K: seed 001, thesis ch. 5;
                 learning-rate decay and warmup: seed 003), step accounting and
                 the thesis's runtime model, the quadratic toy in NumPy;
  driver         applies them to a learning process between rounds;
  quadratic_toy  seed 001's quadratic toy as a TFF process.
"""
