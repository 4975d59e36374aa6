"""bin/sweep: grids of bin/train runs over seeds, run in parallel, and their best configurations.

  sweep          grids, seeds, trials and the sweep's manifest (sweep.json); the spec syntax
  sweep_runner   each trial a bin/train process, in parallel, resumably
  selection      each trial's metrics and score, the best configuration per group
  stats          confidence intervals over seeds, the way the papers report them

Runs bin/train as processes: imports workflow.flags (the flag table), not training/.
"""
