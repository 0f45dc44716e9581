"""A relay process for ``bench/run.py``: ``manage.py deliver_events`` on the bench database.

    python bench/relay_child.py [deliver_events arguments...]

Sets Django up (autodiscovery declares ``bench/events.py``'s receivers, as in the
benchmark's own process), then runs ``call_command("deliver_events", ...)``.

Environment, all optional:
    DDE_BENCH_READY_FILE     created once Django is set up, just before the relay starts
    DDE_BENCH_GO_FILE        the relay starts only once this file exists, so that several
                             children start together and their start-up is not timed
    DDE_BENCH_SETTINGS_JSON  read by bench/settings.py: merged over DJANGO_DOMAIN_EVENTS
"""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")


def main(argv: list[str]) -> None:
    import django

    django.setup()
    from django.core.management import call_command

    ready = os.environ.get("DDE_BENCH_READY_FILE")
    go = os.environ.get("DDE_BENCH_GO_FILE")
    if ready:
        Path(ready).touch()
    if go:
        while not Path(go).exists():
            time.sleep(0.002)
    # The CPU this process spends in the relay alone, without its start-up: run.py reads it.
    print(f"relay cpu-start {time.process_time():.6f}", flush=True)
    began = time.perf_counter()
    call_command("deliver_events", *argv)
    print(f"relay wall {time.perf_counter() - began:.6f}", flush=True)
    print(f"relay cpu-end {time.process_time():.6f}", flush=True)
    # Peak resident memory of this process, in KiB on Linux: run.py's section 8 reads it.
    print(f"relay maxrss-kib {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
