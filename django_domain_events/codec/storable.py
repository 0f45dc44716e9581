"""What every supported database stores and gives back alike: no NUL or lone surrogate
in a string, no NaN or infinity, no nesting deeper than :data:`MAX_DEPTH`."""

from __future__ import annotations

import math
from typing import Any

from .errors import UnsupportedPayloadType, short_repr

#: Deepest nesting of lists and dicts stored in a payload or a scope. Deeper structures
#: are refused: decoding them would exhaust the consumer's recursion limit.
MAX_DEPTH = 64

_Found = tuple[list[str | int], str]  # the path to the bad value (innermost first), why


def text_problem(text: str) -> str:
    """Why no supported database stores ``text`` as given ("" when one would): PostgreSQL
    refuses NUL in text and JSON, and a lone surrogate is no UTF-8 at all."""
    if "\x00" in text:
        return (
            "contains a NUL character (\\x00), which PostgreSQL cannot store; remove it, "
            "or store binary data base64-encoded"
        )
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = text[exc.start]
            return (
                f"contains a lone surrogate ({bad!r}), which is not Unicode text and no "
                "database stores; decode the source with errors='replace', or fix its encoding"
            )
    return ""


def _unstorable(value: Any, depth: int) -> _Found | None:
    """The first value (a walk in order) that the databases would not store alike."""
    if isinstance(value, str):
        problem = text_problem(value)
        return ([], problem) if problem else None
    if isinstance(value, float):
        if math.isfinite(value):
            return None
        return [], f"is {value!r}, which JSON cannot store; store None or a string instead"
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return None
    if depth >= MAX_DEPTH:
        return [], f"nests lists and dicts deeper than {MAX_DEPTH} levels; flatten it"
    for key, item in items:
        if isinstance(key, str):
            problem = text_problem(key)
            if problem:
                return [], f"has a key {short_repr(key)} that {problem}"
        if item is None or isinstance(item, int):
            continue
        if isinstance(item, str) and item.isascii() and "\x00" not in item:
            continue  # the usual value, checked without a call
        found = _unstorable(item, depth + 1)
        if found is not None:
            found[0].append(key)
            return found
    return None


def check_storable(value: Any, root: str, *, fields: bool = False) -> None:
    """Refuse what PostgreSQL, MariaDB/MySQL and SQLite would not all store and give back
    as it is: NUL or a lone surrogate in any string (keys too), NaN or infinity, nesting
    deeper than ``MAX_DEPTH``. One walk over the JSON-ready value, before any write.

    ``root`` names the value in the error (``OrderPlaced``, ``scope``); with ``fields``
    its own keys are written as attributes (``OrderPlaced.note``).
    """
    found = _unstorable(value, 1)
    if found is None:
        return
    steps, problem = found
    path = root
    for depth, step in enumerate(reversed(steps)):
        path += f".{step}" if fields and depth == 0 else f"[{step!r}]"
    raise UnsupportedPayloadType(f"Cannot store {path}: it {problem}.")
