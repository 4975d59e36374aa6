#!/usr/bin/env bash
# Regenerates reports/reproduction.md and its figure (the one documented command).
#   1. the qualitative sweep of reports/reproduction_grid.txt: every configuration x 5 seeds of
#      short `digits` runs, 2 at a time (resumable: rerun after Ctrl-C; the report states the CPU
#      time per trial and the wall time this sweep measured);
#   2. the report: every paper figure recomputed by the package, next to the paper's value,
#      and the papers' claims checked on the sweep.
# Usage: bin/reproduce_report.sh [sweep_dir]   (default runs/reproduction)
set -euo pipefail
cd "$(dirname "$0")/.."
sweep_dir=${1:-runs/reproduction}
start=$(date +%s)
status=0
.venv/bin/python bin/sweep.py --spec=reports/reproduction_grid.txt --num_seeds=5 \
    --max_parallel=2 --notogether --sweep_dir="$sweep_dir" --select_rule=last_mean:3 || status=$?
if [ "$status" -ne 0 ] && [ "$status" -ne 1 ]; then exit "$status"; fi  # 1: some trial failed
minutes=$(( ($(date +%s) - start) / 60 ))
.venv/bin/python bin/report.py --reproduction --sweep_dir="$sweep_dir" \
    --out=reports/reproduction.md --select_rule=last_mean:3 --target=0.85 \
    --sweep_minutes="$minutes"
