"""bin/train's flags: declared, read into typed settings, checked, explained; no TensorFlow.

  train_flags       the flag table (`GROUPS`): one entry per flag, the only place a
                    flag is declared (name, kind, default, help, checks, readers)
  flag_checks       the checks an entry holds: one value's bounds, worded for the flag
  config            the flags read once into frozen typed settings (`Settings`: a class
                    per flag group, made from the table); and back, for flags.json
  validation        every check that needs neither the data nor the disk: the entries'
                    checks, then the rules between flags (`UsageError` naming the flag)
  schedule_flags    the schedule flags turned into schedules, refused in flag words
  library_flags     a library `ArgumentError` told in flag words (the entries' `feeds`)
  algorithms        the algorithm registry: what each `--algorithm` supports, its defaults
  algorithm_table   the README's table of the registry (bin/algorithm_table.py)
  presets           `--preset=<paper>:<task>`: a paper's published settings
  flagfiles         --flagfile chains checked for cycles before absl reads them
  train_help        bin/train's --help: the table grouped, with the registry's readers

sweeps/ and reporting/ read the table and the settings too; nothing here imports
the other parts of workflow/ (only `workflow.errors`), nor TensorFlow: bin/train
refuses a bad command before it loads TensorFlow (tests/test_layering.py).
"""
