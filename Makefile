# README command 1: `make demo`; README command 2: `make test`.
PY := .venv/bin/python
DEMO_DIR ?= demo_output

.PHONY: setup demo test test-fast bench bench-peers clean
setup:
	@bash bin/setup_env.sh

demo: setup
	@bash bin/demo.sh $(DEMO_DIR)

# Three pytest workers on the two cores: a worker waiting for a bin/train child, a
# TFF worker or a sleep leaves its core to the others. --dist loadfile keeps each
# test file on one worker, so a module's fixtures and caches (built and traced
# processes, reference runs) are built once, not once per worker. The 15 slowest
# tests are printed at the end: docs/development.md keeps the suite's cost.
test: setup
	$(PY) -m pytest -q -n 3 --dist loadfile --durations=15 tests

# The edit loop's tier (docs/development.md): every test not marked `slow`.
# CI runs `make test`, the whole suite.
test-fast: setup
	$(PY) -m pytest -q -n 3 --dist loadfile -m "not slow" --durations=10 tests

# The same FedAvg rounds in pfl-research, TFF and the package, alternated process by
# process; creates each peer's own virtual environment under bench/peer_envs/ on first
# use. Rewrites bench/results/peers.json and the table in docs/performance.md (27 min on
# the idle 2-core machine, environments already created).
bench-peers: setup
	nice -n 10 $(PY) bench/peers.py

clean:
	rm -rf $(DEMO_DIR) runs
