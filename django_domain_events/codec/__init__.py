"""Turning an event into a JSON payload and back, across versions of its class.

An event row outlives the code that wrote it: the class may gain, lose or retype fields
before the row is delivered. The codec therefore checks values on the way in (so a bad
payload fails the ``fire``, not the receiver weeks later) and says on the way out which
field of which stored payload no longer fits, and how to bridge it.

One module per concept: ``nodes`` (each annotation's check and conversion),
``dataclass`` (the default codec), ``storable`` (what every database stores alike),
``setting`` (the codec ``CODEC`` names), ``payloads`` (what ``fire()`` writes and a
relay reads, with versions), ``errors``.
"""

from __future__ import annotations

from .dataclass import DataclassCodec
from .errors import PayloadDecodeError, PayloadUpgradeFailed, UnsupportedPayloadType
from .nodes import SUPPORTED_TYPES as SUPPORTED_TYPES
from .payloads import decode_event
from .payloads import encode_event as encode_event
from .setting import PayloadCodec, get_codec
from .storable import MAX_DEPTH as MAX_DEPTH
from .storable import check_storable as check_storable
from .storable import text_problem as text_problem

__all__ = [
    "DataclassCodec",
    "PayloadCodec",
    "PayloadDecodeError",
    "PayloadUpgradeFailed",
    "UnsupportedPayloadType",
    "decode_event",
    "get_codec",
]
