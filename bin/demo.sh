#!/usr/bin/env bash
# README command 1: FedAvg vs FedAdam on the offline `digits` task, then a plot.
set -euo pipefail
cd "$(dirname "$0")/.."
# TensorFlow's C++ log only when asked (docs/training.md), here too for the inline Python.
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-3}
out=${1:-demo_output}
common=(--task=digits --partition=dirichlet --num_clients=20 --clients_per_round=10
        --client_batch_size=10 --client_learning_rate=0.05 --total_rounds=60
        --rounds_per_eval=5 --rounds_per_checkpoint=20 --root_output_dir="$out" --seed=0)
.venv/bin/python bin/train.py "${common[@]}" --algorithm=fedavg --experiment_name=digits_fedavg
.venv/bin/python bin/train.py "${common[@]}" --algorithm=fedadam --server_learning_rate=0.01 \
    --experiment_name=digits_fedadam
# Title (task, shared settings), axis words and legend (algorithm, differing settings)
# come from the runs' flags.json.
.venv/bin/python bin/plot.py --runs="$out/digits_fedavg,$out/digits_fedadam" \
    --out="$out/digits_fedavg_vs_fedadam.png" >/dev/null
.venv/bin/python - "$out" <<'PY'
import sys
from tff_adaptive.execution import runtime
from workflow.reporting import plotting
runtime.shut_down_tff_at_exit()  # quiet exit, should plotting ever import TFF
for name in ('fedavg', 'fedadam'):
  acc = [a for a in plotting.read_metrics(f'{sys.argv[1]}/digits_{name}')['eval/accuracy'] if a == a]
  print(f'{name:8s} final test accuracy {acc[-1]:.3f} (chance 0.100)')
PY
echo "Plot: $out/digits_fedavg_vs_fedadam.png"
