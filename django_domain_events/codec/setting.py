"""The codec the ``CODEC`` setting names, and what such a class must provide."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from .. import conf


@runtime_checkable
class PayloadCodec(Protocol):
    """What ``DJANGO_DOMAIN_EVENTS['CODEC']`` must name: a class built with no arguments."""

    def encode(self, evt: object) -> dict[str, Any]:
        """The event as a JSON-safe dict; raise ``UnsupportedPayloadType`` if it cannot be."""
        ...

    def decode(self, event_class: type, payload: dict[str, Any]) -> Any:
        """An instance of ``event_class`` rebuilt from a stored payload."""
        ...

    def problems(self, event_class: type) -> list[str]:
        """Why ``event_class`` cannot round-trip (empty if it can), without running user code
        beyond resolving type hints: the system check calls this for every event."""
        ...


_codec: PayloadCodec | None = None


def get_codec() -> PayloadCodec:
    """The codec named by the CODEC setting, instantiated once (cache reset when settings
    change)."""
    global _codec
    if _codec is None:
        path = conf.get().CODEC
        setting = f"{conf.SETTINGS_NAME}['CODEC'] = {path!r}"
        try:
            codec_class = import_string(path)
        except Exception as exc:
            raise ImproperlyConfigured(
                f"{setting} cannot be imported ({type(exc).__name__}: {exc}). Point it at a "
                "codec class, e.g. 'django_domain_events.codec.DataclassCodec'."
            ) from exc
        try:
            instance = codec_class()
        except Exception as exc:
            raise ImproperlyConfigured(
                f"{setting} could not be instantiated with no arguments "
                f"({type(exc).__name__}: {exc}); CODEC must name a class, not an instance."
            ) from exc
        missing = [m for m in ("encode", "decode") if not callable(getattr(instance, m, None))]
        if missing:
            raise ImproperlyConfigured(
                f"{setting} has no {' or '.join(m + '()' for m in missing)} method; a codec "
                "needs encode(evt) -> dict and decode(event_class, payload) -> event."
            )
        _codec = instance
    return _codec


def _reset_codec(*, setting: str, **kwargs: object) -> None:
    global _codec
    if setting == conf.SETTINGS_NAME:
        _codec = None


setting_changed.connect(_reset_codec)
