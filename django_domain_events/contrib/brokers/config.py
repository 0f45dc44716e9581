"""The ``BROKERS`` setting: one frozen ``BrokerConfig`` per named broker.

``DJANGO_DOMAIN_EVENTS["BROKERS"] = {"default": {"URL": "amqp://..."}}``: the URL's scheme
picks the transport, the other keys are its options. Everything here is checked without
connecting and without importing a client library, so ``manage.py check`` can report a
broker that cannot work (unknown scheme, bad URL, extra not installed) before a relay
tries it. Destination names (``publish(to=...)``) are checked here too.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
from collections.abc import Mapping
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured

from ... import conf
from .options import (
    BOOLEAN_OPTIONS,
    COMMON_OPTIONS,
    TRANSPORT_OPTIONS,
    BrokerConfig,
)
from .options import nats_stream_name as nats_stream_name  # re-exported: its importers

SETTING = f"{conf.SETTINGS_NAME}['BROKERS']"

#: URL scheme -> transport.
SCHEMES = {
    "amqp": "rabbitmq",
    "amqps": "rabbitmq",
    "nats": "nats",
    "tls": "nats",
    "redis": "redis",
    "rediss": "redis",
}

#: transport -> (the client module to import, the extra that installs it).
CLIENTS = {
    "rabbitmq": ("aio_pika", "rabbitmq"),
    "nats": ("nats", "nats"),
    "redis": ("redis", "redis"),
}

_AMQP_EXCHANGE = re.compile(r"^[A-Za-z0-9_.:\-]{1,255}$")
_NATS_TOKEN = re.compile(r"^[^\s.*>]+$")


def raw_setting() -> Any:
    """The ``BROKERS`` value as written ({} when absent)."""
    value = conf.get().BROKERS
    return {} if value is None else value


def problems(raw: Any = None, *, installed: bool = True) -> list[str]:
    """Every problem of the ``BROKERS`` setting, found without connecting.

    ``installed``: also report a transport whose extra is not installed.
    """
    raw = raw_setting() if raw is None else raw
    if not isinstance(raw, Mapping):
        return [f"{SETTING} must be a dict of broker name -> {{'URL': ...}}, not {raw!r}."]
    found: list[str] = []
    for name, entry in raw.items():
        found.extend(_entry_problems(name, entry, installed=installed))
    return found


def _entry_problems(name: Any, entry: Any, *, installed: bool) -> list[str]:
    where = f"{SETTING}[{name!r}]"
    if not isinstance(name, str) or not name.strip():
        return [f"{SETTING} has the broker name {name!r}; name brokers with non-empty strings."]
    if not isinstance(entry, Mapping) or not isinstance(entry.get("URL"), str):
        return [f"{where} must be a dict with a 'URL' string, e.g. {{'URL': 'amqp://host/'}}."]
    transport, problem = _transport_of(where, entry["URL"])
    if problem:
        return [problem]
    found = _option_problems(where, transport, entry)
    if installed and not client_installed(transport):
        found.append(missing_client_message(name, transport))
    return found


def _transport_of(where: str, url: str) -> tuple[str, str]:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError as error:
        return "", f"{where}['URL'] = {url!r} is not a valid URL ({error})."
    transport = SCHEMES.get(parts.scheme)
    if transport is None:
        known = ", ".join(f"{scheme}://" for scheme in SCHEMES)
        return "", (
            f"{where}['URL'] = {url!r}: the scheme {parts.scheme + '://'!r} names no transport; "
            f"use one of {known}."
        )
    if not parts.hostname and not (transport == "redis" and parts.path):
        return "", f"{where}['URL'] = {url!r} has no host; write e.g. {parts.scheme}://127.0.0.1/."
    return transport, ""


#: Whose client each yes-or-no option moves into a child process.
_CLIENT_OF = {"CONSUMER_PROCESS": "consumer", "PUBLISHER_PROCESS": "publisher"}


def _option_problems(where: str, transport: str, entry: Mapping[str, Any]) -> list[str]:
    found = []
    known = {**COMMON_OPTIONS, **TRANSPORT_OPTIONS[transport]}
    for key, value in entry.items():
        if key == "URL":
            continue
        if key not in known and key in BOOLEAN_OPTIONS:
            found.append(
                f"{where}[{key!r}] = {value!r}: {key} is an option of nats and redis brokers "
                f"only ({transport} {_CLIENT_OF[key]}s keep up in the process); remove it."
            )
        elif key not in known:
            names = ", ".join(sorted(known))
            found.append(f"{where}[{key!r}] is not an option of {transport} brokers; use {names}.")
        elif key in BOOLEAN_OPTIONS:
            if not isinstance(value, bool):
                found.append(
                    f"{where}[{key!r}] must be True or False, not {value!r}; "
                    f"e.g. {{{key!r}: False}} to run the {_CLIENT_OF[key]}'s client on the "
                    "process's broker thread."
                )
        elif key == "MAXLEN":
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                found.append(
                    f"{where}['MAXLEN'] must be None or a whole number >= 1, not {value!r}."
                )
        elif isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            found.append(f"{where}[{key!r}] must be a positive number of seconds, not {value!r}.")
    return found


def client_installed(transport: str) -> bool:
    """Whether the transport's client library can be imported (without importing it)."""
    module, _ = CLIENTS[transport]
    return importlib.util.find_spec(module) is not None


def missing_client_message(name: str, transport: str) -> str:
    module, extra = CLIENTS[transport]
    return (
        f"{SETTING}[{name!r}] is a {transport} broker, and its client library ({module}) is "
        f"not installed: pip install 'django-domain-outbox[{extra}]'."
    )


def import_client(config: BrokerConfig) -> ModuleType:
    """The transport's client library; ``ImproperlyConfigured`` naming the extra if absent."""
    module, _ = CLIENTS[config.transport]
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImproperlyConfigured(missing_client_message(config.name, config.transport)) from error


def brokers() -> dict[str, BrokerConfig]:
    """Every configured broker; ``ImproperlyConfigured`` naming each problem of the setting."""
    raw = raw_setting()
    found = problems(raw, installed=False)
    if found:
        raise ImproperlyConfigured(" ".join(found))
    configs = {}
    for name, entry in raw.items():
        transport = SCHEMES[urlsplit(entry["URL"]).scheme]
        options = {**COMMON_OPTIONS, **TRANSPORT_OPTIONS[transport]}
        options.update({k: v for k, v in entry.items() if k != "URL"})
        configs[name] = BrokerConfig(name, entry["URL"], transport, options)
    return configs


def broker(name: str) -> BrokerConfig:
    """The broker called ``name``; ``ImproperlyConfigured`` naming the configured ones."""
    configs = brokers()
    if name not in configs:
        known = ", ".join(repr(n) for n in sorted(configs)) or "none"
        raise ImproperlyConfigured(
            f"no broker named {name!r} in {SETTING} (configured: {known}); add "
            f"{{{name!r}: {{'URL': ...}}}} to it, or pass broker= one of those."
        )
    return configs[name]


def destination_problem(transport: str, to: object) -> str:
    """Why ``to`` cannot name a destination of ``transport`` ("" when it can)."""
    if not isinstance(to, str) or not to.strip():
        return f"to= must be a non-empty string, not {to!r}."
    if transport == "rabbitmq":
        if not _AMQP_EXCHANGE.match(to) or to.startswith("amq."):
            return (
                f"to={to!r} is not a RabbitMQ exchange name we can declare: use up to 255 "
                "letters, digits, '-', '_', '.' or ':', not starting with 'amq.'."
            )
    elif transport == "nats":
        if not all(_NATS_TOKEN.match(token) for token in to.split(".")):
            return (
                f"to={to!r} is not a NATS subject prefix: use dot-separated tokens without "
                "spaces, '*' or '>', and no empty token (no leading, trailing or double dot)."
            )
    elif len(to.encode()) > 512:
        return f"to={to[:40]!r}... is longer than 512 bytes; choose a shorter stream key."
    return ""


def event_source() -> str:
    """The CloudEvents ``source``: ``EVENT_SOURCE``, else the top package of the settings
    module (``shop.settings`` -> ``shop``)."""
    configured = conf.get().EVENT_SOURCE
    if configured:
        return str(configured)
    module = getattr(django_settings, "SETTINGS_MODULE", None) or os.environ.get(
        "DJANGO_SETTINGS_MODULE", ""
    )
    return module.split(".")[0] or "django"
