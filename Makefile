# The interface to pkgq: `make demo` and `make test` work from a clean clone on Debian.
SHELL := /bin/bash
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.pkgq-installed
PYTEST_ARGS ?=

.PHONY: demo test check docs reference unit integration e2e chaos bench bench-web services migrate venv clean ha-lab ha-lab-down schema

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

## schema: write infra/postgres/schema.sql from the migrations (after adding one; review the diff).
schema: venv services
	BIN=$(BIN) deploy/local/dump-schema.sh

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
	$(MAKE) --no-print-directory docs

## docs: the documentation site (mkdocs.yml, docs/) into build/site, strict: a broken link, a
## missing page or a stale anchor fails. The browser tests' screenshots (build/screenshots/) are
## copied in when present. docs/reference/ is generated: python -m devtools.docs_reference.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

## reference: rewrite docs/reference/*.md from the code (settings, commands, metrics, routes,
## dead-letter reasons) after changing one; tests/unit/test_docs_reference.py fails until then.
reference: venv
	$(BIN)/python -m devtools.docs_reference

## test: the whole suite against the real services, the checks beside it: isolated tests in
## parallel (PKGQ_TEST_WORKERS, default 4) with the chaos tests beside them, then the serial
## tests with `make check` beside them; the HA lab boots in the background, goes at the end
## (run-suite.sh).
test: venv
	BIN=$(BIN) MAKE="$(MAKE)" deploy/local/run-suite.sh $(PYTEST_ARGS)

unit: venv
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

integration: migrate
	$(BIN)/pytest tests/integration $(PYTEST_ARGS)

e2e: migrate
	$(BIN)/pytest tests/e2e $(PYTEST_ARGS)

## ha-lab: a 3-node RabbitMQ cluster behind haproxy and a PostgreSQL primary with a synchronous
## standby, beside the dev services (deploy/local/ha/README.md); prints the lines to eval.
ha-lab:
	deploy/local/ha/lab.sh up

## ha-lab-down: stop and remove the whole HA lab (the dev services are not touched).
ha-lab-down:
	deploy/local/ha/lab.sh down

## chaos: the chaos group alone on the HA lab; scale it up with PKGQ_CHAOS_USERS,
## PKGQ_CHAOS_NODE_KILLS, PKGQ_CHAOS_EXPIRING (README "Replicated profile").
chaos: migrate
	$(BIN)/pytest -m chaos -s $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
