"""What a configured broker is, importable without Django.

``BrokerConfig`` and the options' defaults live here rather than in ``config.py`` (which
reads Django's settings) so that the client's child processes (``consumer_child.py``,
``publisher_child.py``), programs that never import Django, can rebuild a broker's
configuration from plain values and run the same client as the process would.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

#: Options every transport takes, with their defaults (seconds).
COMMON_OPTIONS: dict[str, float] = {
    # How long a batch waits for the broker's confirms before failing the rows unconfirmed.
    "CONFIRM_TIMEOUT_SECONDS": 10.0,
    # How long connecting may take before the broker counts as down.
    "CONNECT_TIMEOUT_SECONDS": 2.0,
    # While a broker is down, how long its rows wait before the next try (the probe).
    "RETRY_CONNECT_SECONDS": 0.5,
}

#: Options of one transport only, with their defaults.
TRANSPORT_OPTIONS: dict[str, dict[str, Any]] = {
    "rabbitmq": {},
    # The stream's de-duplication window for Nats-Msg-Id (created streams only); whether
    # a consumer's client, and a publishing process's, runs in a child process of its
    # own (consumer_process.py, publisher_process.py).
    "nats": {
        "DUPLICATE_WINDOW_SECONDS": 120.0,
        "CONSUMER_PROCESS": True,
        "PUBLISHER_PROCESS": True,
    },
    # XADD ... MAXLEN ~ n: trim the stream to about n entries; None keeps everything.
    "redis": {"MAXLEN": None, "CONSUMER_PROCESS": True, "PUBLISHER_PROCESS": True},
}

#: Options that are a yes or no, not a number.
BOOLEAN_OPTIONS = frozenset({"CONSUMER_PROCESS", "PUBLISHER_PROCESS"})

# NATS forbids these in stream names; each is replaced by "_" (see nats_stream_name).
_NATS_STREAM_FORBIDDEN = re.compile(r"[\s.*>/\\\x00-\x1f\x7f]")


@dataclass(frozen=True)
class BrokerConfig:
    """One configured broker: its name, URL, transport and options."""

    name: str
    url: str
    transport: str
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def confirm_timeout(self) -> float:
        """``CONFIRM_TIMEOUT_SECONDS``, in seconds."""
        return float(self.options["CONFIRM_TIMEOUT_SECONDS"])

    @property
    def connect_timeout(self) -> float:
        """``CONNECT_TIMEOUT_SECONDS``, in seconds."""
        return float(self.options["CONNECT_TIMEOUT_SECONDS"])

    @property
    def retry_connect(self) -> float:
        """``RETRY_CONNECT_SECONDS``, in seconds."""
        return float(self.options["RETRY_CONNECT_SECONDS"])

    @property
    def consumer_process(self) -> bool:
        """Whether consumers of this broker run its client in a child process."""
        return bool(self.options.get("CONSUMER_PROCESS", False))

    @property
    def publisher_process(self) -> bool:
        """Whether a process publishing to this broker runs its client in a child process."""
        return bool(self.options.get("PUBLISHER_PROCESS", False))

    def plain(self) -> dict[str, Any]:
        """This configuration in plain values, for a child process to rebuild it."""
        return {
            "name": self.name,
            "url": self.url,
            "transport": self.transport,
            "options": dict(self.options),
        }

    @property
    def safe_url(self) -> str:
        """The URL without its password, for logs and messages."""
        parts = urlsplit(self.url)
        if parts.password is None:
            return self.url
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
        return parts._replace(netloc=netloc).geturl()


def nats_stream_name(to: str) -> str:
    """The JetStream stream capturing ``<to>.>``: ``to`` with every character NATS forbids
    in stream names (whitespace, ``.``, ``*``, ``>``, ``/``, ``\\``, control characters)
    replaced by ``_``; ``orders.eu`` -> ``orders_eu``."""
    return _NATS_STREAM_FORBIDDEN.sub("_", to)
