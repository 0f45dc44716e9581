"""New correlation ids: uuid4's format, never one handed out twice, even across a fork."""

from __future__ import annotations

import os
import re
import uuid

from django_domain_events.ids import BATCH, new_id


def test_an_id_reads_as_uuid4_hex() -> None:
    for _ in range(BATCH + 1):  # across two draws
        drawn = new_id()
        assert re.fullmatch(r"[0-9a-f]{32}", drawn)
        assert uuid.UUID(hex=drawn).version == 4


def test_a_forked_child_draws_ids_its_parent_does_not_hold() -> None:
    new_id()  # the pool holds ids now, as in a server that fired before forking
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its first id, leave at once
        os.write(write, new_id().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    parent = {new_id() for _ in range(BATCH)}
    assert len(child) == 32 and child not in parent
