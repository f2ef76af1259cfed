# The interface to pkgq: `make demo` and `make test` work from a clean clone on Debian.
SHELL := /bin/bash
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.pkgq-installed
PYTEST_ARGS ?=

.PHONY: demo test check unit integration e2e bench bench-web services migrate venv clean

$(STAMP): pyproject.toml constraints.txt deploy/local/ensure-venv.sh
	deploy/local/ensure-venv.sh $(VENV)
	touch $(STAMP)

venv: $(STAMP)

services:
	deploy/local/ensure-services.sh
	deploy/local/ensure-tools.sh

migrate: venv services
	$(BIN)/pkgq migrate

## demo: start the relay and every consumer, drive sample users through all routes, show it.
demo: migrate
	$(BIN)/pkgq demo

## bench: the throughput benchmark (pkgq bench --help to scale it); key=value lines at the end.
bench: migrate
	$(BIN)/pkgq bench $(BENCH_ARGS)

## bench-web: the read API under wrk, /current against a one-row SELECT on the same stack.
bench-web: migrate
	$(BIN)/pkgq web bench $(BENCH_WEB_ARGS)

## check: formatting, lint, strict typing, the import layers and SQL only in infra/postgres;
## the deploy files (systemd, k8s, alert rules) and the AsyncAPI document (official parser).
check: venv
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python tools/check_sql_location.py
	deploy/systemd/verify.sh
	deploy/k8s/verify.sh
	deploy/observability/check.sh
	deploy/asyncapi/check.sh

## test: check, then the whole suite against the real services: isolated tests in parallel
## (PKGQ_TEST_WORKERS, default 3), then the service-restart tests alone.
test: check migrate
	BIN=$(BIN) deploy/local/run-suite.sh $(PYTEST_ARGS)

unit: venv
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

integration: migrate
	$(BIN)/pytest tests/integration $(PYTEST_ARGS)

e2e: migrate
	$(BIN)/pytest tests/e2e $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
