# Build and test entry points. Nothing here needs root.
#   make demo    build .venv, run the example project end to end on SQLite
#   make test    build .venv, lint, run the suite on SQLite (USE_TZ on and off),
#                PostgreSQL and MariaDB where reachable (both required under CI=true,
#                and then mysqlclient must install)
#   make lint    ruff check, ruff format --check, mypy
#   make format  ruff format, ruff check --fix
#   make bench   run the benchmarks

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXTRAS := dev,celery,prometheus

# Extra arguments for every pytest run, e.g. make test PYTEST_ARGS="-k relay -x"
PYTEST_ARGS ?=

.PHONY: .venv demo test lint format bench clean

.venv: $(STAMP)

# Rebuilt whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[$(EXTRAS)]'
	$(BIN)/python -m pip install mysqlclient || { \
		if [ "$${CI:-}" = true ]; then \
			echo "error: mysqlclient is required under CI=true (needs libmariadb-dev and pkg-config)" >&2; \
			exit 1; \
		fi; \
		echo "mysqlclient unavailable: MariaDB suite skipped"; \
	}
	touch $@

demo: $(STAMP)
	cd example && ../$(BIN)/python manage.py demo

test: $(STAMP)
	bash scripts/test.sh $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy django_domain_events

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP)
	$(BIN)/python bench/run.py

# Build artefacts and caches only; the virtualenv is left alone.
clean:
	rm -rf build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache
