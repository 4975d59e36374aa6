"""Experiment tooling around the `tff_adaptive` library (not installed with it).

bin/ → workflow → tasks → tff_adaptive. Its parts, each importing only those
before it (tests/test_layering.py):

  errors         what stops a run of bin/train: the message and the exit status
                 (raised by the flag checks and by the run alike, so it sits here)
  flags/         bin/train's flags: the table, typed settings, checks, presets, the
                 algorithm registry, --help; loads without TensorFlow
  training/      a run of bin/train: the process built, the training loop, the run
                 directory (checkpoints, metrics), divergence, per-client state
  sweeps/        bin/sweep: grids of runs over seeds, run in parallel; scores, the best
                 configuration, confidence intervals
  reporting/     bin/report and bin/plot: a sweep's tables and curves, metric curves
  reproduction/  reports/reproduction.md: the papers' figures checkable without their data

It may import `tasks`; the library never imports it.
"""
