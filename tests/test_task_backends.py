"""The shipped task back ends, against real queues: Celery (a real worker process on a
real Redis broker) and django.tasks (the django-tasks backport on Django 5.2; Django 6's
own django.tasks, with django-tasks-db's db_worker as a real worker process)."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_domain_events import DeliveryStatus, deliver_pending, fire
from django_domain_events.delivery.tasks import get_backend
from django_domain_events.models import DeliveryRecord
from tests.app.events import OrderPlaced
from tests.app.models import Delivered
from tests.conftest import ROOT, start_child
from tests.procs.task_receivers import TASK_RECORDER_KEY, declare_task_recorder

BROKER_URL = os.environ.get("DDE_CELERY_BROKER", "redis://127.0.0.1:6379/15")
# One queue per test run, so that concurrent runs (SQLite, PostgreSQL) never take each
# other's messages, which name rows in another database.
CELERY_QUEUE = f"dde-test-{os.getpid()}"


def wait_for(condition: Callable[[], bool], seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def fire_order(order_id: int = 1) -> int:
    with transaction.atomic():
        event_id = fire(OrderPlaced(order_id=order_id))
    assert event_id is not None
    return event_id


def row_for(event_id: int) -> DeliveryRecord:
    return DeliveryRecord.objects.get(event_id=event_id, receiver_key=TASK_RECORDER_KEY)


def test_importing_the_library_imports_no_task_queue() -> None:
    code = (
        "import sys, django; django.setup(); "
        "import django_domain_events, django_domain_events.contrib; "
        "from django_domain_events import deliver_pending, fire, receiver; "
        "import django_domain_events.delivery.tasks; "
        "loaded = [m for m in ('celery', 'kombu', 'django_tasks') if m in sys.modules]; "
        "assert not loaded, loaded"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------- Celery


def redis_reachable() -> bool:
    try:
        import redis
    except ImportError:
        return False
    try:
        return bool(redis.Redis.from_url(BROKER_URL, socket_connect_timeout=2).ping())
    except redis.RedisError:
        return False


def forget_queue() -> None:
    """Drop this run's queue and the bindings kombu left for it in Redis."""
    import redis

    client = redis.Redis.from_url(BROKER_URL)
    try:
        for key in client.scan_iter(match=f"*{CELERY_QUEUE}*"):
            client.delete(key)
    finally:
        client.close()


class RecordingCeleryBackend:
    """The real CeleryBackend, remembering each message it published."""

    sent: list[tuple[int, str, str]] = []

    def __init__(self, **options: Any) -> None:
        from django_domain_events.contrib.celery import CeleryBackend

        self.backend = CeleryBackend(**options)

    def enqueue(self, delivery_id: int, *, claimed_by: str, claimed_at: str) -> None:
        RecordingCeleryBackend.sent.append((delivery_id, claimed_by, claimed_at))
        self.backend.enqueue(delivery_id, claimed_by=claimed_by, claimed_at=claimed_at)


@pytest.fixture
def celery_app() -> Iterator[Any]:
    if not redis_reachable():
        if os.environ.get("CI") == "true":
            pytest.fail(f"Redis is not reachable at {BROKER_URL}, and CI=true requires it")
        pytest.skip(f"Redis is not reachable at {BROKER_URL}")
    celery = pytest.importorskip("celery")

    previous = celery.current_app._get_current_object()
    app = celery.Celery("dde-tests", broker=BROKER_URL, set_as_current=True)
    app.conf.update(task_ignore_result=True, broker_connection_retry_on_startup=True)
    import django_domain_events.contrib.celery  # noqa: F401  (registers the task)

    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge(CELERY_QUEUE)
    try:
        yield app
    finally:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_purge(CELERY_QUEUE)
        forget_queue()
        previous.set_current()
        app.close()


@pytest.fixture
def celery_worker(celery_app: Any) -> Iterator[subprocess.Popen[str]]:
    worker = start_child(
        "celery_worker",
        env={"DDE_CELERY_BROKER": BROKER_URL, "DDE_CELERY_QUEUE": CELERY_QUEUE},
    )
    try:
        yield worker
    finally:
        worker.terminate()
        try:
            worker.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.communicate()


def worker_output(worker: subprocess.Popen[str]) -> str:
    if worker.poll() is None:
        return "(worker still running)"
    out, err = worker.communicate()
    return f"worker exited {worker.returncode}\n{out}\n{err}"


def succeeded(event_id: int) -> Callable[[], bool]:
    return lambda: row_for(event_id).status == DeliveryStatus.SUCCEEDED


@pytest.mark.django_db(transaction=True)
def test_celery_backend_is_built_from_the_setting_with_its_options() -> None:
    pytest.importorskip("celery")
    from django_domain_events.contrib.celery import CeleryBackend

    setting = {"BACKEND": "django_domain_events.contrib.celery.CeleryBackend", "QUEUE": "q"}
    with override_settings(DJANGO_DOMAIN_EVENTS={"TASK_BACKEND": setting}):
        backend = get_backend()
    assert isinstance(backend, CeleryBackend) and backend.queue == "q"
    from django_domain_events.contrib.celery import deliver_delivery

    assert deliver_delivery.name == "django_domain_events.deliver_delivery"


@pytest.mark.django_db(transaction=True)
def test_a_real_celery_worker_delivers_what_the_relay_claimed(
    celery_worker: subprocess.Popen[str],
) -> None:
    declare_task_recorder()
    event_id = fire_order()
    setting = {
        "BACKEND": "django_domain_events.contrib.celery.CeleryBackend",
        "QUEUE": CELERY_QUEUE,
    }
    with override_settings(DJANGO_DOMAIN_EVENTS={"TASK_BACKEND": setting}):
        counts = deliver_pending()
    assert sum(counts.values()) == 0  # a hand-off is not counted
    assert wait_for(succeeded(event_id)), worker_output(celery_worker)
    row = row_for(event_id)
    assert row.attempts == 1
    assert row.claimed_by != "deliver_pending"  # the worker took the row over
    assert list(Delivered.objects.values_list("delivery_id", flat=True)) == [row.id]


@pytest.mark.django_db(transaction=True)
def test_a_message_published_twice_runs_once_in_the_celery_worker(
    celery_worker: subprocess.Popen[str],
) -> None:
    from django_domain_events.contrib.celery import CeleryBackend

    declare_task_recorder()
    RecordingCeleryBackend.sent = []
    event_id = fire_order(1)
    setting = {"BACKEND": "tests.test_task_backends.RecordingCeleryBackend", "QUEUE": CELERY_QUEUE}
    with override_settings(DJANGO_DOMAIN_EVENTS={"TASK_BACKEND": setting}):
        deliver_pending()
        (message,) = RecordingCeleryBackend.sent
        # The broker delivers the same message again.
        delivery_id, claimed_by, claimed_at = message
        CeleryBackend(queue=CELERY_QUEUE).enqueue(
            delivery_id, claimed_by=claimed_by, claimed_at=claimed_at
        )
        # A later delivery behind the duplicate on the one-at-a-time worker: once it has
        # run, the duplicate has been consumed.
        later_id = fire_order(2)
        deliver_pending()
    assert wait_for(succeeded(event_id)), worker_output(celery_worker)
    assert wait_for(succeeded(later_id)), worker_output(celery_worker)
    assert row_for(event_id).attempts == 1
    assert Delivered.objects.filter(delivery_id=delivery_id).count() == 1
    assert Delivered.objects.count() == 2
    assert celery_worker.poll() is None, worker_output(celery_worker)


# ---------------------------------------------------------------- django.tasks


@pytest.fixture
def django_tasks_module() -> Any:
    try:
        return __import__("django.tasks", fromlist=["task"])
    except ImportError:
        module = pytest.importorskip("django_tasks")
        import django_tasks.signals  # noqa: F401  (resets TASKS on override_settings)

        return module


def immediate_tasks(module: Any) -> dict[str, Any]:
    path = f"{module.__name__}.backends.immediate.ImmediateBackend"
    return {
        "default": {"BACKEND": path},
        "events": {"BACKEND": path, "QUEUES": ["events"]},
    }


class RecordingDjangoTasksBackend:
    """The real DjangoTasksBackend, remembering each message it enqueued."""

    sent: list[tuple[int, str, str]] = []

    def __init__(self, **options: Any) -> None:
        from django_domain_events.contrib.django_tasks import DjangoTasksBackend

        self.backend = DjangoTasksBackend(**options)

    def enqueue(self, delivery_id: int, *, claimed_by: str, claimed_at: str) -> None:
        RecordingDjangoTasksBackend.sent.append((delivery_id, claimed_by, claimed_at))
        self.backend.enqueue(delivery_id, claimed_by=claimed_by, claimed_at=claimed_at)


@pytest.mark.django_db(transaction=True)
def test_django_tasks_immediate_backend_delivers_what_the_relay_claimed(
    django_tasks_module: Any,
) -> None:
    declare_task_recorder()
    event_id = fire_order()
    setting = {
        "BACKEND": "django_domain_events.contrib.django_tasks.DjangoTasksBackend",
        "BACKEND_ALIAS": "events",
        "QUEUE_NAME": "events",
    }
    with override_settings(
        TASKS=immediate_tasks(django_tasks_module),
        DJANGO_DOMAIN_EVENTS={"TASK_BACKEND": setting},
    ):
        counts = deliver_pending()
    assert sum(counts.values()) == 0  # a hand-off is not counted
    row = row_for(event_id)
    assert (row.status, row.attempts) == (DeliveryStatus.SUCCEEDED, 1)
    assert list(Delivered.objects.values_list("delivery_id", flat=True)) == [row.id]


@pytest.mark.django_db(transaction=True)
def test_a_duplicate_django_tasks_message_runs_nothing(
    django_tasks_module: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from django_domain_events.contrib.django_tasks import deliver_delivery

    declare_task_recorder()
    RecordingDjangoTasksBackend.sent = []
    event_id = fire_order()
    setting = {"BACKEND": "tests.test_task_backends.RecordingDjangoTasksBackend"}
    with override_settings(
        TASKS=immediate_tasks(django_tasks_module),
        DJANGO_DOMAIN_EVENTS={"TASK_BACKEND": setting},
    ):
        deliver_pending()
        (message,) = RecordingDjangoTasksBackend.sent
        with caplog.at_level(logging.INFO, logger="django_domain_events"):
            result = deliver_delivery.enqueue(*message)
    assert result.status == django_tasks_module.TaskResultStatus.SUCCESSFUL
    assert result.return_value is None  # the claim no longer holds: nothing ran
    assert row_for(event_id).attempts == 1
    assert Delivered.objects.count() == 1
    assert any("duplicate, late or stale" in r.getMessage() for r in caplog.records)


def test_a_task_queue_the_backend_does_not_accept_is_refused_at_enqueue(
    django_tasks_module: Any,
) -> None:
    from django_domain_events.contrib.django_tasks import DjangoTasksBackend

    tasks = immediate_tasks(django_tasks_module)
    with override_settings(TASKS=tasks), pytest.raises(Exception, match="nope"):
        DjangoTasksBackend(queue_name="nope").enqueue(1, claimed_by="x", claimed_at="y")


# ------------------------------------- django.tasks with a database backend


def db_tasks() -> dict[str, Any]:
    return {
        "default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"},
        "events": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["events"]},
    }


@pytest.fixture
def django_tasks_db() -> Any:
    if importlib.util.find_spec("django.tasks") is None:
        pytest.skip("Django 6's django.tasks: the Django 6 leg of make test")
    return pytest.importorskip("django_tasks_db")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("django_tasks_db")
def test_a_real_db_worker_delivers_what_the_relay_claimed() -> None:
    """Django 6's django.tasks end to end: the relay enqueues on django-tasks-db's
    backend, and its ``db_worker``, a separate process, runs the delivery."""
    from django_tasks_db.models import DBTaskResult

    declare_task_recorder()
    event_id = fire_order()
    setting = {
        "BACKEND": "django_domain_events.contrib.django_tasks.DjangoTasksBackend",
        "BACKEND_ALIAS": "events",
        "QUEUE_NAME": "events",
    }
    tasks = db_tasks()
    with override_settings(TASKS=tasks, DJANGO_DOMAIN_EVENTS={"TASK_BACKEND": setting}):
        counts = deliver_pending()
    assert sum(counts.values()) == 0  # a hand-off is not counted
    assert DBTaskResult.objects.count() == 1
    assert row_for(event_id).status == DeliveryStatus.CLAIMED  # queued, not yet run

    worker = start_child(
        "db_task_worker",
        "--batch",
        "--backend",
        "events",
        "--queue-name",
        "events",
        "--no-startup-delay",
        env={"DDE_TASKS_JSON": json.dumps(tasks)},
    )
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, f"{out}\n{err}"
    row = row_for(event_id)
    assert (row.status, row.attempts) == (DeliveryStatus.SUCCEEDED, 1), f"{out}\n{err}"
    assert row.claimed_by != "deliver_pending"  # the worker took the row over
    assert list(Delivered.objects.values_list("delivery_id", flat=True)) == [row.id]
    (result,) = DBTaskResult.objects.all()
    assert result.status == "SUCCESSFUL", f"{out}\n{err}"


@pytest.mark.django_db(transaction=True)
def test_task_rows_no_celery_worker_takes_are_charged_at_each_lapse_and_end_dead(
    celery_app: Any,
) -> None:
    """No worker on the queue: each lapse of a hand-off is an attempt, the rows end dead
    after their attempts, and the queue holds one message per attempt, no more."""
    import redis

    from django_domain_events import receiver

    receiver(OrderPlaced, key="t.unworked", site="task", max_attempts=3, lease_seconds=10)(
        lambda evt: None
    )
    for n in range(30):
        fire_order(n)
    setting = {
        "BACKEND": "tests.test_task_backends.RecordingCeleryBackend",
        "QUEUE": CELERY_QUEUE,
    }
    RecordingCeleryBackend.sent = []
    start = timezone.now()
    with override_settings(DJANGO_DOMAIN_EVENTS={"TASK_BACKEND": setting}):
        for lapse in range(10):  # each pass after the last one's leases lapsed
            deliver_pending(now=start + timedelta(seconds=lapse * 12))
    rows = DeliveryRecord.objects.filter(receiver_key="t.unworked")
    assert set(rows.values_list("status", "attempts")) == {(DeliveryStatus.DEAD, 3)}
    assert len(RecordingCeleryBackend.sent) == 30 * 3
    client = redis.Redis.from_url(BROKER_URL)
    try:
        assert client.llen(CELERY_QUEUE) == 30 * 3
    finally:
        client.close()
