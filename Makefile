# README command 1: `make demo`; README command 2: `make test`.
PY := .venv/bin/python
DEMO_DIR ?= demo_output

.PHONY: setup demo test bench bench-peers clean
setup:
	@bash bin/setup_env.sh

demo: setup
	@bash bin/demo.sh $(DEMO_DIR)

# Three pytest workers on the two cores: a worker waiting for a bin/train child, a
# TFF worker or a sleep leaves its core to the others. Fresh clones, 2 cores, all
# passing: -n 2 took 39 min (69 CPU-min); -n 3 took 32 and 38 min (59 and 71 CPU-min,
# the cores' speed varied between runs). Per CPU-minute -n 3 kept 1.85 cores busy
# against 1.77: a small gain, within the run-to-run spread of the total time.
test: setup
	$(PY) -m pytest -q -n 3 tests

# The same FedAvg rounds in pfl-research, TFF and the package, alternated process by
# process; creates each peer's own virtual environment under bench/peer_envs/ on first
# use. Rewrites bench/results/peers.json and the table in docs/performance.md (~20 min).
bench-peers: setup
	nice -n 10 $(PY) bench/peers.py

clean:
	rm -rf $(DEMO_DIR) runs
