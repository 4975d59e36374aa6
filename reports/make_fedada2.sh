#!/bin/bash
# Regenerates reports/fedada2.md and reports/figures/fedada2_*.png.
# Runs go to /tmp/fedada2_report (rerunning resumes finished runs instead of repeating them;
# delete it for a fresh run). About 15 minutes on an idle 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python reports/fedada2_report.py --runs_dir=/tmp/fedada2_report "$@"
