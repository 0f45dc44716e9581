"""New ids in ``uuid.uuid4().hex``'s format, drawn many at a time.

A consumed batch gives every message without a correlation id of its own a new one;
one ``uuid4()`` each is a system call and a ``UUID`` object per message. Here one
``os.urandom`` call gives 256 ids, with the version and variant bits ``uuid4`` sets, so
an id reads exactly as before.
"""

from __future__ import annotations

import os

#: How many ids one draw of random bytes makes.
BATCH = 256
# The bits uuid4 sets: version 4 in bits 76-79, the RFC 4122 variant in bits 62-63.
_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_SET = (4 << 76) | (0x8000 << 48)
_ids: list[str] = []
# A forked child (a prefork server's worker, a Celery worker) starts with its own draw:
# it would otherwise hand out the very ids its parent still holds.
os.register_at_fork(after_in_child=_ids.clear)


def new_id() -> str:
    """A random id, 32 lowercase hex digits, as ``uuid.uuid4().hex`` writes one."""
    try:
        return _ids.pop()  # atomic: threads drawing at once never share an id
    except IndexError:
        pass
    raw = os.urandom(16 * BATCH)
    from_bytes = int.from_bytes
    fresh = [
        f"{(from_bytes(raw[start : start + 16]) & _CLEAR) | _SET:032x}"
        for start in range(0, len(raw), 16)
    ]
    drawn = fresh.pop()
    _ids.extend(fresh)
    return drawn
