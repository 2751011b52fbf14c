# Tasks for working on agentbox. `make test` is the README's test command; CI (.ci/run) runs it after `make lint`.
.PHONY: install test test-fast lint bench

PYTHON ?= python3

install:  ## the package with the test and checker extras, editable
	$(PYTHON) -m pip install -e '.[dev]'

test:  ## the whole suite on every core, as CI runs it (pyproject.toml: -n auto --dist loadgroup, timeouts)
	$(PYTHON) -m pytest

test-fast:  ## everything but the real-distribution tier
	$(PYTHON) -m pytest -m 'not realdistro and not reallima'

lint:  ## ruff, mypy, the layer rules (tests/test_layers.py) and shellcheck with the project's configuration
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy
	$(PYTHON) -m pytest -q -n 0 -p no:cacheprovider tests/test_layers.py
	shellcheck -x --severity=style provision/*.sh provision/launch/*.sh wrappers/*

bench:  ## start-up and launch timings against the limactl double, as a table
	$(PYTHON) benchmarks/run.py
