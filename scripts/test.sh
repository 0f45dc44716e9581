#!/usr/bin/env bash
# Lint, then the test suite against every database this machine offers.
#
#   bash scripts/test.sh [extra pytest arguments]     (normally via `make test`)
#
# Runs, in order: ruff check, ruff format --check, mypy; pytest on SQLite;
# pytest on SQLite with USE_TZ=False; pytest on PostgreSQL when reachable;
# pytest on MariaDB when mysqlclient is installed and the server is reachable;
# then the Django 6 leg (see below). Under CI=true PostgreSQL and MariaDB are
# both required: an unreachable server, or mysqlclient missing, is a failure, not
# a skip. Every step runs even if an earlier one failed; the script exits
# non-zero if any step failed. pytest's exit code 5 (no tests collected) counts
# as a failure.
#
# Connection settings (see tests/settings.py): DDE_PG_HOST/PORT/USER/PASSWORD,
# DDE_MYSQL_HOST/PORT/USER/PASSWORD.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2

BIN=.venv/bin
PY=$BIN/python
CI=${CI:-false}
EXTRA=("$@")

if [ ! -x "$PY" ]; then
    echo "error: $PY not found; run 'make .venv' first" >&2
    exit 2
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/dde-test.XXXXXX")
trap 'rm -rf "$work"' EXIT

failed=()
skipped=()

banner() { printf '\n==> %s\n' "$*"; }

# step NAME COMMAND...: run a command, record a failure, never abort.
step() {
    local name=$1
    shift
    banner "$name: $*"
    "$@"
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        failed+=("$name (exit $rc)")
        echo "<== $name FAILED (exit $rc)"
    fi
}

# record NAME RC: note a pytest run's exit status (5, no tests collected, is a failure).
record() {
    if [ "$2" -eq 5 ]; then
        echo "<== pytest [$1] collected no tests: counted as a failure"
        failed+=("pytest [$1] (no tests collected)")
    elif [ "$2" -ne 0 ]; then
        echo "<== pytest [$1] FAILED (exit $2)"
        failed+=("pytest [$1] (exit $2)")
    fi
}

# main_pytest NAME VAR=VALUE...: one pytest run with the given environment, its status.
main_pytest() {
    local name=$1
    shift
    env "$@" DDE_SQLITE_PATH="$work/$name.sqlite3" \
        "$PY" -m pytest --junitxml="$work/$name.xml" \
        ${EXTRA[@]+"${EXTRA[@]}"}
}

# alone RUNNER NAME VAR=VALUE...: one pytest run (RUNNER: main_pytest or dj6_pytest).
alone() {
    local runner=$1
    shift
    banner "pytest [$1]: ${*:2}"
    "$runner" "$@"
    record "$1" $?
}

# Broker servers of a second suite's own (ports, RabbitMQ node, data directory), for
# one that runs beside another: the two never restart each other's servers.
PRIVATE_SERVERS=(DDE_TEST_NATS_PORT=4225 DDE_TEST_REDIS_PORT=6382 DDE_TEST_RABBIT_PORT=5675
    DDE_TEST_RABBIT_NODE=rabbit-side@localhost DDE_TEST_RABBIT_DIST_PORT=25675
    DDE_BROKER_SERVERS_DIR="$work/side-servers")

# side_by_side RUNNER NAME VAR=VALUE... -- NAME VAR=VALUE...: two pytest runs at once
# (RUNNER: main_pytest or dj6_pytest), each one's output printed whole when it ends.
# Used where the two together take the time of the longer one and stay within what two
# cores carry (on a host three times slower than usual the whole run, one suite after
# another, would pass CI's 90 minutes); the second gets PRIVATE_SERVERS.
side_by_side() {
    local runner=$1 first=() second=() seen=0 arg rc
    shift
    for arg in "$@"; do
        if [ "$arg" = "--" ]; then
            seen=1
        elif [ "$seen" -eq 0 ]; then
            first+=("$arg")
        else
            second+=("$arg")
        fi
    done
    banner "pytest [${first[0]}] and [${second[0]}], side by side: ${first[*]:1} | ${second[*]:1}"
    "$runner" "${first[@]}" >"$work/${first[0]}.log" 2>&1 &
    local first_pid=$!
    "$runner" "${second[@]}" "${PRIVATE_SERVERS[@]}" >"$work/${second[0]}.log" 2>&1 &
    local second_pid=$!
    wait "$first_pid"
    rc=$?
    banner "pytest [${first[0]}]: its output"
    cat "$work/${first[0]}.log"
    record "${first[0]}" "$rc"
    wait "$second_pid"
    rc=$?
    banner "pytest [${second[0]}]: its output"
    cat "$work/${second[0]}.log"
    record "${second[0]}" "$rc"
}

skip() {
    echo
    echo "SKIP: $*"
    skipped+=("$*")
}

# ------------------------------------------------------------------ lint
step "ruff check" "$BIN/ruff" check .
step "ruff format" "$BIN/ruff" format --check .
step "mypy" "$BIN/mypy" django_domain_events

# pg_reachable PYTHON: can PYTHON's psycopg connect to the PostgreSQL server?
pg_reachable() {
    "$1" - <<'PY' 2>/dev/null
import os

import psycopg

psycopg.connect(
    host=os.environ.get("DDE_PG_HOST", "127.0.0.1"),
    port=int(os.environ.get("DDE_PG_PORT", "5432")),
    user=os.environ.get("DDE_PG_USER", "postgres"),
    password=os.environ.get("DDE_PG_PASSWORD", ""),
    dbname="postgres",
    connect_timeout=3,
).close()
PY
}

# --------------------------------------------------------------- brokers
# The broker tests (tests/test_brokers*.py) publish to the machine's RabbitMQ (5672),
# NATS JetStream (4222) and Redis (6379): skipped where one is down, but under CI=true
# a broker that cannot be reached fails them (tests/brokers.py), and is reported here.
if [ "$CI" = "true" ]; then
    for broker in RabbitMQ:5672 NATS:4222 Redis:6379; do
        if ! timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/${broker#*:}" 2>/dev/null; then
            echo "ERROR: ${broker%%:*} is required under CI but is not reachable at 127.0.0.1:${broker#*:}"
            failed+=("${broker%%:*} is required under CI (not reachable)")
        fi
    done
fi

# ---------------------------------------------------------------- SQLite
# Side by side: one SQLite file each, and SQLite's process tests run one relay at a time.
# The lifecycle machine (tests/test_lifecycle_machine.py, 200 examples, two minutes on
# a slow host) runs in full where the backend differs; the suites that differ by the
# time-zone convention or Django's version run 50 (DDE_LIFECYCLE_EXAMPLES).
side_by_side main_pytest sqlite DDE_TEST_DB=sqlite -- sqlite-no-tz DDE_TEST_DB=sqlite \
    DDE_TEST_USE_TZ=false DDE_LIFECYCLE_EXAMPLES=50

# ------------------------------------------------------------ PostgreSQL
pg_host=${DDE_PG_HOST:-127.0.0.1}
pg_port=${DDE_PG_PORT:-5432}
if pg_reachable "$PY"; then
    alone main_pytest postgres DDE_TEST_DB=postgres
elif [ "$CI" = "true" ]; then
    echo
    echo "ERROR: PostgreSQL is required under CI but is not reachable at $pg_host:$pg_port"
    failed+=("PostgreSQL is required under CI (not reachable at $pg_host:$pg_port)")
else
    skip "PostgreSQL suite skipped: not reachable at $pg_host:$pg_port"
fi

# --------------------------------------------------------------- MariaDB
my_host=${DDE_MYSQL_HOST:-127.0.0.1}
my_port=${DDE_MYSQL_PORT:-3306}
if ! "$PY" -c 'import MySQLdb' 2>/dev/null && command -v pkg-config >/dev/null 2>&1 \
    && { pkg-config --exists libmariadb || pkg-config --exists mysqlclient; }; then
    # The headers appeared after .venv was built: try once more.
    banner "installing mysqlclient (client headers found)"
    "$PY" -m pip install --quiet mysqlclient || echo "mysqlclient could not be installed"
fi
if ! "$PY" -c 'import MySQLdb' 2>/dev/null; then
    if [ "$CI" = "true" ]; then
        echo
        echo "ERROR: MariaDB is required under CI but mysqlclient is not installed" \
            "(it builds against libmariadb-dev, found with pkg-config)"
        failed+=("MariaDB is required under CI (mysqlclient is not installed)")
    else
        skip "MariaDB suite skipped: mysqlclient is not installed (needs libmariadb-dev and pkg-config to build)"
    fi
elif "$PY" - <<'PY' 2>/dev/null; then
import os

import MySQLdb

MySQLdb.connect(
    host=os.environ.get("DDE_MYSQL_HOST", "127.0.0.1"),
    port=int(os.environ.get("DDE_MYSQL_PORT", "3306")),
    user=os.environ.get("DDE_MYSQL_USER", "root"),
    password=os.environ.get("DDE_MYSQL_PASSWORD", ""),
    connect_timeout=3,
).close()
PY
    alone main_pytest mariadb DDE_TEST_DB=mariadb
elif [ "$CI" = "true" ]; then
    echo
    echo "ERROR: MariaDB is required under CI but is not reachable at $my_host:$my_port"
    failed+=("MariaDB is required under CI (not reachable at $my_host:$my_port)")
else
    skip "MariaDB suite skipped: not reachable at $my_host:$my_port"
fi

# ---------------------------------------------------------- Django 6 leg
# The second leg: Python 3.13 with the newest Django 6.x (.venv-dj6, built by
# `make .venv-dj6`), on SQLite and PostgreSQL. No lint: django-stubs and mypy
# follow Django 5.2 on the main leg. Its PostgreSQL test databases carry their own
# suffix, so the two legs never share one. Its PostgreSQL run lets psycopg prepare
# statements (DDE_PG_PREPARE: OPTIONS prepare_threshold), so the claims bound on the
# server for it run through the whole suite; the main leg keeps Django's default. The
# process tests (relays, consumers and
# brokers as processes of their own: tests/*_processes.py) test this package's
# concurrency and faults, not Django's: they run on the main leg only
# (DDE_PROCESS_TESTS=0 here, tests/conftest.py), but test_processes.py, which checks
# the relay runs as a process on Django 6 at all.
DJ6_PY=${DDE_DJ6_VENV:-.venv-dj6}/bin/python

# dj6_pytest NAME VAR=VALUE...: one pytest run on the Django 6 leg, its exit status.
dj6_pytest() {
    local name=$1
    shift
    env "$@" DDE_SQLITE_PATH="$work/$name.sqlite3" \
        DDE_TEST_DB_SUFFIX="${DDE_TEST_DB_SUFFIX:-}_dj6" DDE_PROCESS_TESTS=0 \
        "$DJ6_PY" -m pytest --junitxml="$work/$name.xml" \
        ${EXTRA[@]+"${EXTRA[@]}"}
}

if [ ! -x "$DJ6_PY" ]; then
    if [ "$CI" = "true" ]; then
        echo
        echo "ERROR: the Django 6 leg is required under CI: $DJ6_PY not found (make .venv-dj6)"
        failed+=("Django 6 leg ($DJ6_PY not found)")
    else
        skip "Django 6 leg skipped: $DJ6_PY not found (make .venv-dj6)"
    fi
else
    banner "Django 6 leg: $("$DJ6_PY" -c 'import sys, django; print("Python", sys.version.split()[0], "Django", django.__version__)')"
    if pg_reachable "$DJ6_PY"; then
        # Neither runs the process tests: each is mostly one busy core.
        side_by_side dj6_pytest dj6-sqlite DDE_TEST_DB=sqlite DDE_LIFECYCLE_EXAMPLES=50 -- \
            dj6-postgres DDE_TEST_DB=postgres DDE_PG_PREPARE=true DDE_LIFECYCLE_EXAMPLES=50
    else
        alone dj6_pytest dj6-sqlite DDE_TEST_DB=sqlite DDE_LIFECYCLE_EXAMPLES=50
        if [ "$CI" = "true" ]; then
            echo
            echo "ERROR: PostgreSQL is required under CI but is not reachable (Django 6 leg)"
            failed+=("PostgreSQL is required under CI (Django 6 leg)")
        else
            skip "Django 6 leg: PostgreSQL suite skipped: not reachable"
        fi
    fi
fi

# --------------------------------------------------------------- summary
echo
echo "==> summary"
for s in ${skipped[@]+"${skipped[@]}"}; do
    echo "skipped: $s"
done
for f in ${failed[@]+"${failed[@]}"}; do
    echo "FAILED: $f"
done
# One closing line over every pytest run, from their JUnit reports.
"$PY" - "$work" <<'PY'
import pathlib
import sys
import xml.etree.ElementTree as ET

passed = failed = skipped = 0
for report in sorted(pathlib.Path(sys.argv[1]).glob("*.xml")):
    t = f = s = 0
    for ts in ET.parse(report).getroot().iter("testsuite"):
        t += int(ts.get("tests", 0))
        f += int(ts.get("failures", 0)) + int(ts.get("errors", 0))
        s += int(ts.get("skipped", 0))
    print(f"{report.stem}: {t - f - s} passed, {f} failed, {s} skipped")
    passed, failed, skipped = passed + t - f - s, failed + f, skipped + s
print(f"total: {passed} passed, {failed} failed, {skipped} skipped")
PY

if [ "${#failed[@]}" -ne 0 ]; then
    exit 1
fi
