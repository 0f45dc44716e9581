"""Section 16: a rate limit held across four relays, and the unlimited receiver beside it.

Four ``deliver_events --lane metered --concurrency 8`` processes run until every row has
run, in rounds that alternate three cases: the unlimited receiver's rows alone; the same
rows behind a backlog of the 50/s receiver's rows (fired first, so ahead in claim order);
and, as the control, the same rows while this process fires rows of a third, unlimited,
receiver at 50/s: the same work per second as the limited receiver's, without a limit
(fired with ``priority=99``, so that they run as they come, ahead of the unlimited rows in
claim order as the limited rows are; fired plainly they would wait behind all of them).
Each receiver logs when it ran; the figures come from those intervals: the unlimited
receiver's rows per second in each case (first start to last end), and the limited
receiver's rate over every 10 s window of its run. On a host the relays keep busy, the
50 rows/s themselves take a share of it: the control shows how much, and the limited case
over the control is what the limit itself costs the other receiver.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from django.db import transaction

from django_domain_events import fire
from django_domain_events.models import LimitRecord

from .events import METERED_KEY, PACED_KEY, UNMETERED_KEY, Metered, Paced, Unmetered
from .measure import reset_tables, settle_database

RELAYS, CONCURRENCY = 4, 8
# The control's rows go this far ahead of the unlimited rows fired before the round (99:
# 0.99 of PRIORITY_AGING_SECONDS, a minute by default), so they run as they come.
PACED_PRIORITY = 99
CHILD = Path(__file__).resolve().parent / "relay_child.py"


@dataclass(frozen=True)
class Round:
    """One run of the four relays: the intervals each receiver logged."""

    unmetered: list[tuple[float, float]]
    metered: list[tuple[float, float]]
    relay_cpu: float = 0.0  # seconds of CPU (user + system) the four relays used in all

    @property
    def cpu_per_row(self) -> float:
        """The relays' CPU per row run, of either receiver, in milliseconds: what the
        limit costs them, whatever else loads the host."""
        rows = len(self.unmetered) + len(self.metered)
        return 1000 * self.relay_cpu / rows if rows else 0.0

    @property
    def unmetered_rate(self) -> float:
        return _rate(self.unmetered)

    def windows(self, seconds: float = 10.0) -> list[float]:
        """The metered receiver's starts per second over each ``seconds`` window of its run
        (sliding by a second, past its first second)."""
        starts = sorted(start for start, _ in self.metered)
        if not starts:
            return []
        t, rates = starts[0] + 1, []
        while t + seconds <= starts[-1]:
            rates.append(sum(1 for s in starts if t <= s < t + seconds) / seconds)
            t += 1
        return rates


def _rate(intervals: list[tuple[float, float]]) -> float:
    if len(intervals) < 2:
        return 0.0
    return len(intervals) / (max(e for _, e in intervals) - min(s for s, _ in intervals))


def run_round(
    unmetered: int, metered: int, paced: float = 0.0, *, metered_first: bool = True
) -> Round:
    """Fire ``metered`` rows of the limited receiver, then ``unmetered`` of the other, and
    run the four relays until they have all run; ``paced``: meanwhile fire that many rows
    a second of the unlimited control receiver, until the unmetered rows have run."""
    reset_tables()
    LimitRecord.objects.all().delete()
    with transaction.atomic():
        for n in range(metered if metered_first else 0):
            fire(Metered(n=n))
        for n in range(unmetered):
            fire(Unmetered(n=n))
        for n in range(0 if metered_first else metered):
            fire(Metered(n=n))
    # Every case starts from the same state: statistics of its own rows, and the firing's
    # dirty pages (and the last round's) written out, not flushed by a checkpoint mid-run.
    settle_database()
    with tempfile.TemporaryDirectory(prefix="dde-bench-limits-") as tmp:
        log = Path(tmp) / "runs"
        go = Path(tmp) / "go"
        env = {**os.environ, "DDE_BENCH_LIMITS_LOG": str(log), "DDE_BENCH_GO_FILE": str(go)}
        children = []
        used = _children_cpu()
        for index in range(RELAYS):
            ready = Path(tmp) / f"ready-{index}"
            children.append(
                subprocess.Popen(
                    [sys.executable, str(CHILD), "--lane", "metered"]
                    + ["--concurrency", str(CONCURRENCY)],
                    env={**env, "DDE_BENCH_READY_FILE": str(ready)},
                    text=True,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
            )
            while not ready.exists():
                time.sleep(0.01)
        go.touch()
        try:
            _wait_for(log, {UNMETERED_KEY: unmetered, METERED_KEY: metered}, children, paced)
        finally:
            for child in children:
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)
            errors = [child.communicate(timeout=120)[1] for child in children]
        used = _children_cpu() - used
        if any(child.returncode not in (0, -signal.SIGTERM) for child in children):
            raise RuntimeError(f"a relay failed: {errors}")
        found = _intervals(log)
    reset_tables()
    return Round(
        found.get(UNMETERED_KEY, []), found.get(METERED_KEY, []) or found.get(PACED_KEY, []), used
    )


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _intervals(log: Path) -> dict[str, list[tuple[float, float]]]:
    """Each receiver's run intervals logged so far; a line a receiver is still writing
    (no newline yet) is read at the next look."""
    found: dict[str, list[tuple[float, float]]] = {}
    if log.exists():
        for line in log.read_text().splitlines(keepends=True):
            if not line.endswith("\n"):
                continue
            key, start, end = line.split()
            found.setdefault(key, []).append((float(start), float(end)))
    return found


def _wait_for(
    log: Path, counts: dict[str, int], children: list[subprocess.Popen[str]], paced: float
) -> None:
    began = time.monotonic()
    deadline, fired, checked = began + 600, 0, 0.0
    while time.monotonic() < deadline:
        if paced:  # the control's rows, at the rate: those owed by now, in one commit
            owed = int((time.monotonic() - began) * paced) - fired
            if owed > 0:  # one at a time, a loaded host could not fire 50/s and look up
                with transaction.atomic():
                    for _ in range(owed):
                        # Ahead of the unlimited rows in claim order, as the limited rows
                        # are: fired as they are, they would wait behind all of them.
                        fire(Paced(n=fired), priority=PACED_PRIORITY)
                        fired += 1
        if time.monotonic() - checked >= 0.2:
            checked = time.monotonic()
            found = _intervals(log)
            if all(len(found.get(key, [])) >= n for key, n in counts.items()):
                return
            for child in children:
                if child.poll() is not None:
                    error = child.communicate(timeout=10)[1] or ""
                    raise RuntimeError(
                        f"a relay ended early (exit {child.returncode}): {error[-2000:]}"
                    )
        time.sleep(0.2 if not paced else 0.005)
    raise RuntimeError(f"the rows did not run within 600 s: {counts}")
