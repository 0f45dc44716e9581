"""A process's connection to each broker: connect, publish, ride out outages.

One ``Link`` per broker per process, kept open across passes and reconnected after a
failure. While the broker is down, rows are handed back without trying it again until
``RETRY_CONNECT_SECONDS`` have passed (the probe is the next connection attempt), and
the outage is logged once when it starts and once when it ends.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from django.core.signals import setting_changed

from ... import conf
from .config import BrokerConfig, broker
from .transport import (
    BrokerDown,
    Confirmations,
    Outgoing,
    Transport,
    make_transport,
    run,
    submit,
)

logger = logging.getLogger("django_domain_events.brokers")


class Link:
    """The connection to one broker and whether it is down."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.transport: Transport | None = None
        self.down_since: float | None = None  # monotonic
        self.next_try = 0.0
        self._lock = threading.Lock()  # a relay's concurrent workers share the link

    def send(self, messages: Sequence[Outgoing]) -> Confirmations:
        """Publish ``messages``; per message None (confirmed) or why not."""
        return self.submit(messages).wait()

    def submit(self, messages: Sequence[Outgoing]) -> Sending:
        """Start publishing ``messages`` on the broker loop and return at once, so the
        relay can claim its next batch while the confirms are outstanding."""
        if not messages:
            return Sending(self, None, None, [])
        with self._lock:
            transport = self.transport or self._connect()
        if transport is None:
            down = BrokerDown(f"broker {self.config.name!r} is down")
            return Sending(self, None, None, [down] * len(messages))
        future = submit(transport.publish(messages))
        return Sending(self, transport, future, [None] * len(messages))

    def _settled(
        self, transport: Transport, future: Future[Confirmations], count: int
    ) -> Confirmations:
        try:
            results = future.result(self.config.confirm_timeout + 5)
        except TimeoutError:
            future.cancel()
            results = [BrokerDown("no answer from the broker")] * count
        down = next((r for r in results if isinstance(r, BrokerDown)), None)
        if down is not None:
            with self._lock:
                if self.transport is transport:  # not already replaced by another worker
                    self._went_down(down)
        return results

    def _connect(self) -> Transport | None:
        if self.down_since is not None and time.monotonic() < self.next_try:
            return None
        transport = make_transport(self.config)
        try:
            run(transport.connect(), self.config.connect_timeout + 5)
        except (BrokerDown, TimeoutError) as error:
            self._went_down(error)
            return None
        self.transport = transport
        if self.down_since is not None:
            logger.warning(
                "Broker %r (%s) is reachable again after %.1fs; publishing resumes.",
                self.config.name,
                self.config.safe_url,
                time.monotonic() - self.down_since,
            )
            self.down_since = None
        return transport

    def _went_down(self, error: BaseException) -> None:
        transport, self.transport = self.transport, None
        if transport is not None:
            with contextlib.suppress(Exception):  # a broken connection may not close cleanly
                run(transport.close(), 5)
        self.next_try = time.monotonic() + self.config.retry_connect
        if self.down_since is None:
            self.down_since = time.monotonic()
            logger.error(
                "Broker %r (%s) is unreachable (%s): its rows are handed back uncharged and "
                "tried again every %ss until it answers.",
                self.config.name,
                self.config.safe_url,
                error,
                self.config.retry_connect,
            )

    def close(self) -> None:
        transport, self.transport = self.transport, None
        if transport is not None:
            run(transport.close(), 5)


@dataclass(frozen=True)
class Sending:
    """A batch on its way: ``wait()`` gives each message's confirmation."""

    link: Link
    transport: Transport | None
    future: Future[Confirmations] | None
    answered: Confirmations  # the answers when nothing was sent (broker down, no message)

    def wait(self) -> Confirmations:
        """Wait for the broker's confirms (at most ``CONFIRM_TIMEOUT_SECONDS`` + 5 s)."""
        if self.future is None or self.transport is None:
            return list(self.answered)
        return self.link._settled(self.transport, self.future, len(self.answered))


_links: dict[str, Link] = {}
_lock = threading.Lock()


def link(name: str) -> Link:
    """This process's link to the broker ``name``, made on first use."""
    with _lock:
        found = _links.get(name)
        if found is None:
            found = _links[name] = Link(broker(name))
        return found


def close_all() -> None:
    """Close every link (tests, and settings that changed)."""
    with _lock:
        links = list(_links.values())
        _links.clear()
    for each in links:
        with contextlib.suppress(Exception):
            each.close()


def _reset(*, setting: str, **kwargs: object) -> None:
    if setting == conf.SETTINGS_NAME:
        close_all()


setting_changed.connect(_reset)
