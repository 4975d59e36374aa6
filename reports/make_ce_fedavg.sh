#!/bin/bash
# Regenerates reports/ce_fedavg.md and reports/figures/ce_fedavg_*.png.
# Runs go to /tmp/ce_fedavg_report (rerunning resumes finished runs instead of repeating them;
# delete it for a fresh run). About 15 minutes on an idle 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python reports/ce_fedavg_report.py --runs_dir=/tmp/ce_fedavg_report "$@"
