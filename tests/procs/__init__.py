"""Child processes the tests start against the test database."""

from __future__ import annotations

import os
import time
from pathlib import Path


def ready_then_go() -> None:
    """Say the child is ready (``DDE_READY_FILE``), then wait for ``DDE_GO_FILE`` when set, so
    the parent can start several children's work at one moment, however slowly each booted."""
    if os.environ.get("DDE_READY_FILE"):
        Path(os.environ["DDE_READY_FILE"]).touch()
    go = os.environ.get("DDE_GO_FILE")
    if not go:
        return
    deadline = time.monotonic() + 120
    while not Path(go).exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{go} never appeared")
        time.sleep(0.01)
