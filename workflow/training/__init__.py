"""A run of bin/train: the settings' process built and trained, its run directory kept.

  cli                   what bin/train does with its flags: resolve, validate, prepare
                        the output, run (`run_training`); the flags parsers of bin/
  experiment            a run's name and directory: the default name, the output
                        checks, the lock, resume
  run_dir               the run directory on disk: writes that stay inside it
  run_files             checkpoints, metrics.csv, TensorBoard events, and their recovery
  algorithm_builders    the typed settings → each algorithm's builder arguments, and
                        `build`, the learning process of the settings
  program               the training loop: sample, train a round, evaluate, release,
                        checkpoint
  divergence            when the loop stops a diverging run, and what it says
  data_checks           which client's data holds NaN or inf, asked when a round turns
                        non-finite
  cohort_feed           the cohort execution's client data, built in the background
  personalization       the loop's side of per-client state (personalised FL, SCAFFOLD),
                        user accuracy, noise
  tensorboard_hparams   a run's hyperparameters for TensorBoard's HParams dashboard

Imports workflow.flags (and `workflow.errors`), never sweeps/ or reporting/.
"""
