#!/bin/bash
# Regenerates reports/schedules.md and reports/figures/schedules_*.png.
# Runs go to /tmp/schedules_report (rerunning reuses finished runs instead of repeating them;
# delete it for a fresh run). reports/schedules.md states how long the invocation that wrote it
# took and how many of its runs it reused.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python reports/schedules_report.py --runs_dir=/tmp/schedules_report "$@"
