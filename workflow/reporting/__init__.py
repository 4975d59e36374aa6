"""bin/report and bin/plot: a sweep's tables and curves, a run's metrics labelled in words.

  report     a sweep's trials aggregated: tables with confidence intervals, costs to a
             target, mean curves (reports/*.md of bin/report.py)
  plotting   metric curves from metrics.csv files, axes and legends in words (bin/plot.py,
             the reports/ scripts)
"""
