"""Several deliveries at once inside one relay: a lane's worker threads.

Each worker thread runs one claimed row at a time in its own transaction on its own
database connection, so a slow receiver holds back only its own slot. The relay claims
no more rows for a lane than it has free slots, so no claimed row waits behind a slow
one while its lease runs; each row's lease is renewed when it starts and kept alive
while it runs, as in a relay that runs one row at a time.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.db import connections

from ..models import DeliveryStatus
from .claim import Claim
from .outcomes import Outcome

# What running one claim answers: its status and outcome, or None when it was handed to
# the task queue.
Result = tuple[DeliveryStatus | None, Outcome | None] | None


@dataclass(frozen=True)
class Done:
    """One claim a worker finished with: what it answered, or what escaped it."""

    lane: str
    claim: Claim
    result: Result = None
    error: BaseException | None = None


class LaneWorkers:
    """``size`` threads running the claims of one lane, one claim each at a time."""

    def __init__(
        self,
        lane: str,
        size: int,
        run: Callable[[Claim], Result],
        done: queue.Queue[Done],
        wake: threading.Event,
    ) -> None:
        self.lane = lane
        self.size = size
        self._run = run
        self._done = done
        self._wake = wake
        self._todo: queue.Queue[Claim | None] = queue.Queue()
        self._lock = threading.Lock()
        self._busy = 0  # claims submitted and not yet done
        self._threads = [
            threading.Thread(target=self._work, name=f"relay {lane} #{n}", daemon=True)
            for n in range(size)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def busy(self) -> int:
        with self._lock:
            return self._busy

    def free(self) -> int:
        return self.size - self.busy

    def submit(self, claims: Sequence[Claim]) -> None:
        with self._lock:
            self._busy += len(claims)
        for claim in claims:
            self._todo.put(claim)

    def take_back(self) -> list[Claim]:
        """The claims no worker has started: for the relay to hand back."""
        taken: list[Claim] = []
        while True:
            try:
                claim = self._todo.get_nowait()
            except queue.Empty:
                break
            if claim is not None:
                taken.append(claim)
        with self._lock:
            self._busy -= len(taken)
        return taken

    def close(self) -> None:
        """Stop the threads once they finish what they run; each closes its connections."""
        for _ in self._threads:
            self._todo.put(None)
        for thread in self._threads:
            thread.join()

    def _work(self) -> None:
        try:
            while (claim := self._todo.get()) is not None:
                try:
                    done = Done(self.lane, claim, result=self._run(claim))
                except BaseException as error:  # for the relay to judge: outage or halt
                    done = Done(self.lane, claim, error=error)
                self._done.put(done)
                with self._lock:
                    self._busy -= 1
                self._wake.set()
        finally:
            connections.close_all()
