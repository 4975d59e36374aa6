# README command 1: `make demo`; README command 2: `make test`.
PY := .venv/bin/python
DEMO_DIR ?= demo_output

.PHONY: setup demo test bench clean
setup:
	@bash bin/setup_env.sh

demo: setup
	@bash bin/demo.sh $(DEMO_DIR)

# Three pytest workers on the two cores: a worker waiting for a bin/train child, a
# TFF worker or a sleep leaves its core to the others. Fresh clone, 2 cores: -n 2
# took 39 min; -n 3 took 32 min, all passing, after test_install stopped reinstalling
# the stack (about 2 of those 7 minutes' worth of one worker).
test: setup
	$(PY) -m pytest -q -n 3 tests

clean:
	rm -rf $(DEMO_DIR) runs
