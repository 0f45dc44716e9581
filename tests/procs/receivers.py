"""Receivers declared the same way in the test process and in its children."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from django_domain_events import DeliveryContext, RetryAfter, receiver
from tests.app.events import OrderPlaced, Pinged
from tests.app.models import Delivered

RECORDER_KEY = "tests.record_order"
MAIL_KEY = "tests.mail_ping"
DEFAULT_PING_KEY = "tests.default_ping"
SCHEDULED_KEY = "tests.follow_up"
FAILING_KEY = "tests.fail_order"


def record(evt: object, ctx: DeliveryContext) -> None:
    """Write one row per delivery; the unique delivery id makes a second run fail."""
    slow = float(os.environ.get("DDE_SLOW_SECONDS", "0"))
    if slow:
        time.sleep(slow)
    Delivered.objects.create(
        delivery_id=ctx.delivery_id,
        receiver_key=ctx.receiver_key,
        event_id=ctx.event_id,
        target=ctx.target,
    )


RUN_LOG_KEY = "tests.log_run"


def log_run(evt: object, ctx: DeliveryContext) -> None:
    """Append the delivery id to DDE_RUN_LOG, outside any transaction: every run counts,
    a run whose outcome was then lost too. Sleeps DDE_SLOW_SECONDS after writing."""
    with open(os.environ["DDE_RUN_LOG"], "a") as log:
        log.write(f"{ctx.delivery_id}\n")
    slow = float(os.environ.get("DDE_SLOW_SECONDS", "0"))
    if slow:
        time.sleep(slow)


def declare_run_logger() -> None:
    receiver(Pinged, key=RUN_LOG_KEY, takes_context=True)(log_run)


def run_log_relay_env(slow: float, **settings: object) -> tuple[Path, dict[str, str]]:
    """A fresh run log, and the environment of a relay child running only the run logger
    (each run ``slow`` seconds) with these package settings."""
    log = Path(tempfile.mkdtemp()) / "runs"
    return log, {
        "DDE_RECEIVERS": "run_log",
        "DDE_RUN_LOG": str(log),
        "DDE_SLOW_SECONDS": str(slow),
        "DDE_SETTINGS_JSON": json.dumps(settings),
    }


def declare_recorder() -> None:
    receiver(OrderPlaced, key=RECORDER_KEY, takes_context=True)(record)


def declare_all() -> None:
    """The recorder on the default lane, and a Pinged receiver on each of two lanes."""
    declare_recorder()
    receiver(Pinged, key=MAIL_KEY, takes_context=True, lane="mail")(record)
    receiver(Pinged, key=DEFAULT_PING_KEY, takes_context=True)(record)


def declare_scheduled() -> None:
    """A receiver whose rows come due two days after their order."""
    receiver(OrderPlaced, key=SCHEDULED_KEY, due=timedelta(days=2))(lambda evt: None)


def fail(evt: object) -> None:
    raise ConnectionError("unreachable")


def declare_failing() -> None:
    """An OrderPlaced receiver on the mail lane that always fails: one failed attempt,
    retried after at most 50 ms, then a dead letter."""
    receiver(
        OrderPlaced,
        key=FAILING_KEY,
        lane="mail",
        max_attempts=2,
        backoff_base_seconds=0.05,
        backoff_cap_seconds=0.05,
    )(fail)


class AsyncClient:
    """A stand-in for a module-level async client (``httpx.AsyncClient``, a connection
    pool): made on first use, it serves requests from a background task, behind an
    ``asyncio.Lock``, both bound to the event loop it was made on. On a loop of its own per
    call, the second call finds the background task gone with the first loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.lock = asyncio.Lock()
        self.requests: asyncio.Queue[tuple[asyncio.Future[int], int]] = asyncio.Queue()
        self.server = self.loop.create_task(self._serve())

    async def _serve(self) -> None:
        while True:
            reply, value = await self.requests.get()
            reply.set_result(value)

    async def call(self, value: int) -> int:
        async with self.lock:
            reply = asyncio.get_running_loop().create_future()
            await self.requests.put((reply, value))
            return await asyncio.wait_for(reply, 1)


_client: AsyncClient | None = None


def shared_client() -> AsyncClient:
    """The module-level client, made lazily on the first call, as applications do."""
    global _client
    if _client is None:
        _client = AsyncClient()
    return _client


def forget_client() -> None:
    global _client
    _client = None


ASYNC_RUN_LOG_KEY = "tests.log_run_async"


async def log_run_async(evt: object, ctx: DeliveryContext) -> None:
    """``log_run`` as an ``async def``: appends ``delivery_id loop_id`` to DDE_RUN_LOG, goes
    through the shared client, then awaits DDE_SLOW_SECONDS."""
    with open(os.environ["DDE_RUN_LOG"], "a") as log:
        log.write(f"{ctx.delivery_id} {id(asyncio.get_running_loop())}\n")
    assert await shared_client().call(ctx.delivery_id) == ctx.delivery_id
    await asyncio.sleep(float(os.environ.get("DDE_SLOW_SECONDS", "0")))


def declare_async_run_logger() -> None:
    receiver(Pinged, key=ASYNC_RUN_LOG_KEY, takes_context=True)(log_run_async)


# Receivers that fail in ways outside a plain exception (issue 19, items 3, 6 and 6b).
CANCELLED_KEY = "tests.cancelled"
KILLS_CONNECTION_KEY = "tests.kills_connection"
DOWN_DATABASE_KEY = "tests.down_database"
DOWN_ALIAS = "down"  # tests.settings adds it when DDE_DOWN_ALIAS is set
FAULTY = {"max_attempts": 2, "backoff_base_seconds": 0.05, "backoff_cap_seconds": 0.05}


async def cancelled(evt: object) -> None:
    """Await a task cancelled elsewhere: ``asyncio.CancelledError``, a ``BaseException``."""
    task = asyncio.get_running_loop().create_task(asyncio.sleep(10))
    task.cancel()
    await task


def kill_own_connection(evt: object) -> None:
    """End this receiver's own connection to the outbox's database, from inside."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        elif connection.vendor == "mysql":
            cursor.execute("KILL CONNECTION_ID()")
        else:  # SQLite has no server: close the file under the open transaction
            connection.connection.close()
            cursor.execute("SELECT 1")


def query_down_database(evt: object) -> None:
    """Query a second database whose server is down."""
    from django.db import connections

    with connections[DOWN_ALIAS].cursor() as cursor:
        cursor.execute("SELECT 1")


def declare_faulty() -> None:
    """On OrderPlaced: an async receiver raising CancelledError, one killing its own
    connection, one querying a database that is down; each dead after 2 attempts."""
    receiver(OrderPlaced, key=CANCELLED_KEY, **FAULTY)(cancelled)
    receiver(OrderPlaced, key=KILLS_CONNECTION_KEY, **FAULTY)(kill_own_connection)
    receiver(OrderPlaced, key=DOWN_DATABASE_KEY, **FAULTY)(query_down_database)


CRASH_KEY = "tests.crash_or_log"


def crash_or_log(evt: object, ctx: DeliveryContext) -> None:
    """Append ``start <id> <pid> <time>`` to DDE_RUN_LOG, run DDE_SLOW_SECONDS, then
    ``end <id> <pid> <time>``; the row of Pinged(n=DDE_POISON_N) instead writes ``exit``
    and ends its process at once, as a segfault or an OOM kill would."""
    with open(os.environ["DDE_RUN_LOG"], "a") as log:
        log.write(f"start {ctx.delivery_id} {os.getpid()} {time.time()}\n")
    if getattr(evt, "n", None) == int(os.environ.get("DDE_POISON_N", "-1")):
        with open(os.environ["DDE_RUN_LOG"], "a") as log:
            log.write(f"exit {ctx.delivery_id} {os.getpid()} {time.time()}\n")
        os._exit(3)
    time.sleep(float(os.environ.get("DDE_SLOW_SECONDS", "0")))
    with open(os.environ["DDE_RUN_LOG"], "a") as log:
        log.write(f"end {ctx.delivery_id} {os.getpid()} {time.time()}\n")


def declare_crash_or_log() -> None:
    receiver(Pinged, key=CRASH_KEY, takes_context=True, max_attempts=3)(crash_or_log)


BATCH_RUN_LOG_KEY = "tests.log_run_batch"


def declare_batch_run_logger() -> None:
    """The run logger with group acknowledgement: a claim's rows run in one commit."""
    receiver(Pinged, key=BATCH_RUN_LOG_KEY, takes_context=True, ack="batch")(log_run)


LIMITED_KEY = "tests.limited"
FREE_KEY = "tests.free"


def log_interval(evt: object, ctx: DeliveryContext) -> None:
    """Append ``key start end`` (time.time()) to DDE_RUN_LOG, sleeping DDE_SLOW_SECONDS in
    between: each run's interval, from which overlap and rates are read."""
    start = time.time()
    if ctx.receiver_key == LIMITED_KEY:
        time.sleep(float(os.environ.get("DDE_SLOW_SECONDS", "0")))
    with open(os.environ["DDE_RUN_LOG"], "a") as log:
        log.write(f"{ctx.receiver_key} {start:.6f} {time.time():.6f}\n")


def declare_limited() -> None:
    """An OrderPlaced receiver limited by DDE_RATE_LIMIT and/or DDE_CONCURRENCY_LIMIT, and
    an unlimited Pinged receiver in the same lane; both log their runs' intervals."""
    rate = os.environ.get("DDE_RATE_LIMIT") or None
    concurrency = os.environ.get("DDE_CONCURRENCY_LIMIT")
    receiver(
        OrderPlaced,
        key=LIMITED_KEY,
        takes_context=True,
        rate_limit=rate,
        concurrency_limit=int(concurrency) if concurrency else None,
    )(log_interval)
    receiver(Pinged, key=FREE_KEY, takes_context=True)(log_interval)


GROUP_KEYS = ("tests.grouped_orders", "tests.grouped_pings")


def log_grouped(evt: object, ctx: DeliveryContext) -> None:
    """``log_interval`` for the grouped receivers; the order numbered DDE_RETRY_AFTER_ID
    raises ``RetryAfter(DDE_RETRY_AFTER_SECONDS)`` the first time, whichever relay runs it,
    logging ``retry_after <time>``."""
    start = time.time()
    marker = os.environ["DDE_RUN_LOG"] + ".retried"
    if getattr(evt, "order_id", None) == int(os.environ.get("DDE_RETRY_AFTER_ID", "-1")):
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            pass
        else:
            with open(os.environ["DDE_RUN_LOG"], "a") as log:
                log.write(f"retry_after {start:.6f} {time.time():.6f}\n")
            raise RetryAfter(float(os.environ["DDE_RETRY_AFTER_SECONDS"]), "slow down")
    time.sleep(float(os.environ.get("DDE_SLOW_SECONDS", "0")))
    with open(os.environ["DDE_RUN_LOG"], "a") as log:
        log.write(f"{ctx.receiver_key} {start:.6f} {time.time():.6f}\n")


def declare_grouped() -> None:
    """Two receivers (OrderPlaced, Pinged) sharing the limit group ``sms``, whose limits
    the relay's DDE_SETTINGS_JSON gives (LIMIT_GROUPS)."""
    receiver(OrderPlaced, key=GROUP_KEYS[0], takes_context=True, limit_group="sms")(log_grouped)
    receiver(Pinged, key=GROUP_KEYS[1], takes_context=True, limit_group="sms")(log_grouped)
