"""The pipe between a process and a broker client's child process, both ends.

A NATS or Redis client spends as much Python per message (writing and parsing its
protocol) as the process that uses it; in one process both hold the same GIL and take
turns. A child process runs the client instead (``publisher_child.py`` for a relay,
``consumer_child.py`` for a consumer) and the two speak over the child's stdin and
stdout.

A frame is a 4-byte big-endian length and a ``marshal`` dump (plain values only: the
dump of 500 messages is a few hundred microseconds). A request is ``(request id, op,
argument)``; an answer is ``(request id, "ok", value)`` or ``(request id, "down",
"why")``, the broker having failed (the parent treats it as an outage). Frame 0 answers
the connection. Several requests may be under way at once.

The child reads its stdin from its start to its end: at the end (the parent is gone,
even killed) it exits at once, and the broker delivers again whatever it held. It
ignores SIGINT and SIGTERM: its parent decides when it stops (``stop``).

This module imports nothing of Django: the child programs import it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import marshal
import os
import signal
import struct
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, BinaryIO

from .options import BrokerConfig
from .transport import BrokerDown

#: The length that starts every frame, both ways.
HEADER = struct.Struct("!I")
#: How long a stopping child may take to close its connection before it is killed.
STOP_SECONDS = 10.0
#: The most a frame's reader buffers before it pauses the pipe.
_READ_LIMIT = 2**20


def frame(value: Any) -> bytes:
    """``value`` as one frame: its length, then its ``marshal`` dump."""
    data = marshal.dumps(value)
    return HEADER.pack(len(data)) + data


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next frame's value; ``EOFError`` at the end of the stream."""
    try:
        (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
        return marshal.loads(await reader.readexactly(size))
    except asyncio.IncompleteReadError as error:
        raise EOFError from error


# ---------------------------------------------------------------- the parent's side


class Child:
    """One child program, seen from its parent: started, asked, stopped.

    ``what`` names it in errors ("publisher child"); ``label`` (the broker's URL without
    its password) starts the reason of a ``down`` answer. Every failure reaches the
    caller as ``BrokerDown``: a child that cannot connect, answers ``down``, or is gone.
    """

    def __init__(self, program: str, argument: dict[str, Any], what: str, label: str) -> None:
        self.program = program
        self.argument = json.dumps(argument)
        self.what = what
        self.label = label
        self.process: asyncio.subprocess.Process | None = None
        self.reading: asyncio.Task[None] | None = None
        self.replies: dict[int, asyncio.Future[Any]] = {}
        self.next_request = 1
        self.gone = ""  # why the child can no longer answer; "" while it can

    @property
    def pid(self) -> int | None:
        """The child's process id, while it runs."""
        return self.process.pid if self.process is not None else None

    async def start(self, timeout: float) -> None:
        """Start the child and wait at most ``timeout`` seconds for it to connect
        (``BrokerDown`` with its reason if it cannot)."""
        loop = asyncio.get_running_loop()
        root = str(Path(__file__).resolve().parents[3])  # the child imports this package
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
        self.gone = ""
        # asyncio's pipes, not blocking ones: a child that stops reading (hung, stopped)
        # must hold up only the requests sent to it, never the loop they share.
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            self.program,
            self.argument,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path},
            limit=_READ_LIMIT,
        )
        assert self.process.stdout is not None
        reader = self.process.stdout
        connected = self.replies[0] = loop.create_future()
        self.reading = asyncio.create_task(self._read(reader))
        try:
            await asyncio.wait_for(connected, timeout)
        except BaseException:
            await self.close()
            raise

    async def _read(self, reader: asyncio.StreamReader) -> None:
        """Hand each answer to its request; at the end, fail every request still waiting."""
        try:
            while True:
                request, status, value = await read_frame(reader)
                waiting = self.replies.pop(request, None)
                if waiting is None or waiting.done():
                    continue
                if status == "ok":
                    waiting.set_result(value)
                else:
                    waiting.set_exception(BrokerDown(f"{self.label}: {value}"))
        except (EOFError, OSError, ValueError) as error:
            self._lost(f"the {self.what} (pid {self.pid}) is gone ({error or 'exited'})")

    def _lost(self, why: str) -> None:
        self.gone = self.gone or why
        replies, self.replies = self.replies, {}
        for waiting in replies.values():
            if not waiting.done():
                waiting.set_exception(BrokerDown(self.gone))

    async def request(self, op: str, argument: Any = None) -> Any:
        """Send one request and wait for its answer's value."""
        if self.gone or self.process is None or self.process.stdin is None:
            raise BrokerDown(self.gone or f"the {self.what} is not running")
        request, self.next_request = self.next_request, self.next_request + 1
        answer = self.replies[request] = asyncio.get_running_loop().create_future()
        try:
            self.process.stdin.write(frame((request, op, argument)))
            await self.process.stdin.drain()
        except OSError as error:
            self._lost(f"the {self.what} (pid {self.pid}) is gone ({error})")
        return await answer

    async def close(self, patience: float = STOP_SECONDS) -> None:
        """Stop the child and wait for it; killed if it has not stopped within
        ``patience`` seconds, or at once if the caller stops waiting (a cancellation,
        the only thing this raises): no child outlives its parent's close."""
        process = self.process
        if process is None:
            return
        try:
            if not self.gone:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.request("stop"), patience)
            self._lost(f"the {self.what} was closed")
            with contextlib.suppress(Exception):
                assert process.stdin is not None
                process.stdin.close()  # a child that did not stop exits at the end of stdin
            await asyncio.wait_for(process.wait(), patience)
        except Exception:
            _kill(process)
            await process.wait()
        except BaseException:
            _kill(process)
            raise
        finally:
            self.process = None
            self._lost(f"the {self.what} was closed")
            if self.reading is not None:
                self.reading.cancel()
                self.reading = None


def _kill(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
        process.kill()


# ---------------------------------------------------------------- the child's side


class Server:
    """A child program's side of the pipe: each request runs as a task of its own and is
    answered when it ends, until ``stop``. A subclass says what a request does (``run``)
    and what stopping takes (``stop``)."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.tasks: set[asyncio.Task[None]] = set()

    async def connect_and_serve(
        self, connect: Callable[[], Awaitable[None]], broker: BrokerConfig
    ) -> None:
        """Connect within the broker's bounds, answer frame 0, then serve the parent;
        return at once when the connection failed (its reason answered)."""
        reader = await stdin_frames()
        limit = broker.connect_timeout + broker.confirm_timeout
        first = await connect_or_answer(connect, limit, reader, self.out)
        if first is not None:
            await self.serve(reader, first)

    async def serve(self, reader: asyncio.StreamReader, first: asyncio.Task[Any]) -> None:
        """Answer requests (``first`` reads the first) until ``stop``; exit at once at
        the end of stdin: the parent is gone, and nothing here is anyone's any more."""
        reading = first
        while True:
            try:
                request, op, argument = await reading
            except EOFError:
                os._exit(0)
            reading = asyncio.create_task(read_frame(reader))
            if op == "stop":
                await self.stop()
                answer(self.out, request, "ok", None)
                return
            task = asyncio.create_task(self.handle(request, op, argument))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def handle(self, request: int, op: str, argument: Any) -> None:
        """Run one request and answer it; a failure is the broker's (an outage)."""
        try:
            value = await self.run(op, argument)
        except Exception as error:
            answer(self.out, request, "down", f"{type(error).__name__}: {error}")
        else:
            answer(self.out, request, "ok", value)

    async def run(self, op: str, argument: Any) -> Any:
        """What one request answers."""
        raise NotImplementedError

    async def stop(self) -> None:
        """Close the connection before the stop is answered."""
        raise NotImplementedError


def answer(out: BinaryIO, request: int, status: str, value: Any) -> None:
    """Write one answer (whole: a frame is never interleaved with another)."""
    out.write(frame((request, status, value)))
    out.flush()


async def stdin_frames() -> asyncio.StreamReader:
    """The child's stdin, to read frames from."""
    reader = asyncio.StreamReader(limit=_READ_LIMIT)
    await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(0, "rb", buffering=0)
    )
    return reader


async def connect_or_answer(
    connect: Callable[[], Awaitable[None]],
    limit: float,
    reader: asyncio.StreamReader,
    out: BinaryIO,
) -> asyncio.Task[Any] | None:
    """Connect within ``limit`` seconds and answer frame 0: the read of the first request
    once connected, None once the failure is answered. stdin is read from the start: a
    parent gone (or stopping the child) while the connection is being made ends the
    child at once."""
    first = asyncio.create_task(read_frame(reader))
    # Bounded here too: a server that takes the connection and never answers would
    # otherwise hold it for as long as the client library allows.
    connecting = asyncio.create_task(asyncio.wait_for(connect(), limit))
    await asyncio.wait({first, connecting}, return_when=asyncio.FIRST_COMPLETED)
    if not connecting.done():
        os._exit(0)
    try:
        connecting.result()
    except TimeoutError:
        why = "CONNECT_TIMEOUT_SECONDS + CONFIRM_TIMEOUT_SECONDS"
        answer(out, 0, "down", f"TimeoutError: not connected within {limit:g}s ({why})")
        return None
    except Exception as error:
        answer(out, 0, "down", f"{type(error).__name__}: {error}")
        return None
    answer(out, 0, "ok", os.getpid())
    return first


def run_program(main: Callable[[dict[str, Any], BinaryIO], Coroutine[Any, Any, None]]) -> None:
    """Run a child program: ``main(its JSON argument, where answers go)``, answers on a
    private copy of stdout (anything a library prints goes to stderr instead), signals
    left to the parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    asyncio.run(main(json.loads(sys.argv[1]), out))
