"""reports/reproduction.md: the five source papers' figures that can be checked without their data.

  provenance    where each expected value comes from, the kinds of rows, the rounding rule;
  paper_checks  decaying K (the decaying-K paper, thesis Table 5.4), model size, compression, the
                quadratic toy: published numbers recomputed with the package;
  flops_tables  FLOPs per client per round (FedGBO paper Tables 4/10 = thesis B.2/B.3);
  communication download, upload and client memory read from real processes;
  claims        the papers' qualitative claims on the sweep, stored as data
                (reports/reproduction_sweep.json), verdicts computed from it;
  render        the report's markdown (bin/report.py --reproduction).
"""
