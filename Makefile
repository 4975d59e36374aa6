# README command 1: `make demo`; README command 2: `make test`.
PY := .venv/bin/python
DEMO_DIR ?= demo_output

.PHONY: setup demo test bench clean
setup:
	@bash bin/setup_env.sh

demo: setup
	@bash bin/demo.sh $(DEMO_DIR)

test: setup
	$(PY) -m pytest -q -n 2 tests

clean:
	rm -rf $(DEMO_DIR) runs
