"""Fixtures shared by the suite: isolated receivers, and child processes on the test DB."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from django_domain_events import registry
from django_domain_events.delivery import limits
from django_domain_events.recurrence import schedules

ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``DDE_PROCESS_TESTS=0`` (the Django 6 leg of scripts/test.sh) skips the
    ``*_processes.py`` files but ``test_processes.py``: they start relays, consumers and
    brokers as processes to test this package's concurrency and faults, which the main
    leg runs on every database; ``test_processes.py`` stays, the Django 6 leg's check
    that the relay runs as a process at all."""
    if os.environ.get("DDE_PROCESS_TESTS") != "0":
        return
    skip = pytest.mark.skip(reason="process tests run on the main leg (DDE_PROCESS_TESTS=0)")
    for item in items:
        name = item.path.name
        if name.endswith("_processes.py") and name != "test_processes.py":
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def isolated_receivers() -> Iterator[None]:
    """Receivers a test declares are forgotten after it, so counts stay local, and so is
    what this process learnt of their limits (a rate it saw empty)."""
    before = {r.key for r in registry.receivers}
    yield
    limits._empty_until.clear()
    limits._idle_until.clear()
    limits._seen_at.clear()
    for declared in registry.receivers:
        if declared.key not in before:
            registry.forget(declared.key)


@pytest.fixture(autouse=True)
def isolated_schedules() -> Iterator[None]:
    """Schedules a test declares are forgotten after it."""
    before = set(schedules.keys())
    yield
    for key in set(schedules.keys()) - before:
        schedules.remove(key)


def child_env() -> dict[str, str]:
    """Environment for a child process that must use this test run's database."""
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["DDE_DB_NAME"] = str(connection.settings_dict["NAME"])
    env["PYTHONPATH"] = str(ROOT)
    return env


def start_child(
    script: str, *args: str, env: dict[str, str] | None = None, output: Path | None = None
) -> subprocess.Popen[str]:
    """Start ``tests/procs/<script>.py`` against the test database (``env`` added).

    Its output goes to pipes for ``communicate()``, or to the file ``output`` for a child
    that runs long and may log much: nobody reads a pipe meanwhile, and a full one blocks."""
    sink: Any = subprocess.PIPE if output is None else output.open("a")
    try:
        return subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "procs" / f"{script}.py"), *args],
            env={**child_env(), **(env or {})},
            cwd=ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT if output is not None else subprocess.PIPE,
            text=True,
        )
    finally:
        if output is not None:
            sink.close()


def start_together(
    script: str, args: list[tuple[str, ...]], env: dict[str, str] | None = None
) -> list[subprocess.Popen[str]]:
    """Start one ``tests/procs/<script>.py`` child per argument tuple and let them begin their
    work at the same moment, once every one has booted: a slow start on a loaded host cannot
    leave one child with all the work (the script calls ``tests.procs.ready_then_go``)."""
    signals = Path(tempfile.mkdtemp(prefix="dde-go-"))
    go = signals / "go"
    children = [
        start_child(
            script,
            *child_args,
            env={
                **(env or {}),
                "DDE_READY_FILE": str(signals / f"ready-{i}"),
                "DDE_GO_FILE": str(go),
            },
        )
        for i, child_args in enumerate(args)
    ]
    for i in range(len(children)):
        wait_for((signals / f"ready-{i}").exists, 120, f"child {i} of {script} to boot")
    go.touch()
    return children


def stop_child(child: subprocess.Popen[str], timeout: float = 30) -> None:
    """SIGTERM ``child`` and wait for it to stop; killed if it takes over ``timeout``."""
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(10)


def children_of(pid: int, program: str) -> list[int]:
    """The processes running ``program`` (a module's name in their command line) with
    ``pid`` as their parent, read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # ended meanwhile
            continue
        state, parent = stat.rsplit(")", 1)[1].split()[:2]
        if int(parent) == pid and program in command and state != "Z":
            found.append(int(entry.name))
    return found


def running(pid: int) -> bool:
    """Whether the process ``pid`` runs (not ended, not a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll until ``predicate`` holds, as a child process works; returns the seconds it took."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)
    return time.monotonic() - start


def relay_listening() -> bool:
    """A relay process has LISTENed on this test database (PostgreSQL), so the NOTIFY of a
    commit from now on wakes it: poll this rather than sleep until it has started."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND query LIKE 'LISTEN %%'"
        )
        return bool(cursor.fetchone()[0])


TEST_DB = os.environ.get("DDE_TEST_DB", "sqlite").strip().lower() or "sqlite"

needs_postgresql = pytest.mark.skipif(
    TEST_DB not in ("postgres", "postgresql"),
    reason="needs PostgreSQL itself (LISTEN/NOTIFY, pg_stat_activity, its server)",
)

# Say what a process test really needs, so it runs on every database that has it.
needs_several_relays = pytest.mark.skipif(
    TEST_DB == "sqlite",
    reason="needs several relays, or several rows at once, on one database: not SQLite",
)


def wait_until_blocked(child: subprocess.Popen[str], timeout: float = 60) -> None:
    """Wait until another session of this PostgreSQL database waits on a lock: a child
    held at the critical moment of a race, by a lock this test holds."""

    def blocked() -> bool:
        if child.poll() is not None:
            out, err = child.communicate()
            raise AssertionError(f"the child ended before it blocked: {out} {err}")
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            )
            row = cursor.fetchone()
        return bool(row and row[0])

    wait_for(blocked, timeout, "the child to wait on this test's lock")


# Browser tests (test_admin_browser.py, test_dashboard_browser.py) ---------------------

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
BROWSER_PASSWORD = "correct horse battery staple"
# Generous waits: CI machines are small and may be busy (the defaults are 5 and 30 s).
BROWSER_TIMEOUT_MS = 30_000


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Headless Chromium (Debian's), through Playwright."""
    from django.db import connections
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop running in this thread. The ORM calls the
    # test makes between browser steps are plain synchronous code, but Django then keeps
    # their connection apart from the thread's own (as it does for async code): close it
    # before the loop stops, or it would outlive the test and hold the test database.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()
            connections.close_all()


@pytest.fixture
def page(browser: Any, live_server: Any) -> Iterator[Any]:
    """A page of a superuser logged in to the admin."""
    from django.contrib.auth import get_user_model
    from playwright.sync_api import expect

    get_user_model().objects.create_superuser(username="operator", password=BROWSER_PASSWORD)
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(BROWSER_TIMEOUT_MS)
    opened = context.new_page()
    opened.goto(f"{live_server.url}/admin/login/?next=/admin/")
    opened.fill("input[name=username]", "operator")
    opened.fill("input[name=password]", BROWSER_PASSWORD)
    opened.click("input[type=submit]")
    expect(opened.locator("#site-name")).to_contain_text("Django administration")
    expect(opened.locator("body")).to_contain_text("Domain events")
    try:
        yield opened
    finally:
        context.close()
