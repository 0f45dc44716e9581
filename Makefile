# Build and test entry points. Nothing here needs root.
#   make demo    build .venv, run the example project end to end on SQLite
#   make demo-brokers  two services (two settings, two SQLite files) through the first
#                broker reachable here (Redis, NATS, RabbitMQ): example/twoservices/run.py
#   make test    build .venv, lint, run the suite on SQLite (USE_TZ on and off),
#                PostgreSQL and MariaDB where reachable (both required under CI=true,
#                and then mysqlclient must install)
#   make lint    ruff check, ruff format --check, mypy
#   make format  ruff format, ruff check --fix
#   make bench   run the benchmarks
#   (and, below: the Django 6 leg of make test, make dist, make docs)

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXTRAS := dev,celery,prometheus,opentelemetry,rabbitmq,nats,redis

# Extra arguments for every pytest run, e.g. make test PYTEST_ARGS="-k relay -x"
PYTEST_ARGS ?=

.PHONY: .venv demo demo-brokers test lint format bench clean

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

demo-brokers: $(STAMP)
	cd example && ../$(BIN)/python twoservices/run.py

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

# ------------------------------------------------- the Django 6 leg, dist, docs
#   make .venv-dj6  Python 3.13 with the newest Django 6.x and django-tasks-db: the
#                   second leg of `make test` (SQLite and PostgreSQL; no lint there)
#   make dist       build sdist and wheel, twine check them, install the wheel with no
#                   extras in a fresh virtualenv (then the cron extra: cronsim only) and
#                   run the example's demo against it, then follow docs/tutorial.md in a
#                   fresh directory (scripts/dist.sh)
#   make docs       the documentation site, MkDocs with --strict, into build/site

# pyenv's 3.13 where this machine has it, else python3.13 on PATH.
PYTHON_DJ6 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.13.0/bin/python) python3.13)
VENV_DJ6   := .venv-dj6
STAMP_DJ6  := $(VENV_DJ6)/.installed
DJANGO_DJ6 ?= Django>=6,<7

.PHONY: .venv-dj6 dist docs api-docs

.venv-dj6: $(STAMP_DJ6)

$(STAMP_DJ6): pyproject.toml
	test -x $(VENV_DJ6)/bin/python || $(PYTHON_DJ6) -m venv $(VENV_DJ6)
	$(VENV_DJ6)/bin/python -m pip install --upgrade pip
	$(VENV_DJ6)/bin/python -m pip install -e '.[test,postgres-binary,celery,prometheus,rabbitmq,nats,redis]' \
		'$(DJANGO_DJ6)' django-tasks-db
	touch $@

# `make test` runs the Django 6 leg after the main one (scripts/test.sh, DDE_DJ6_VENV).
test: $(STAMP_DJ6)

dist: $(STAMP)
	bash scripts/dist.sh $(BIN)/python

# docs/api.md from the docstrings (tests/test_api_reference.py says when it is stale).
api-docs: $(STAMP)
	$(BIN)/python scripts/api_reference.py

docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir build/site
