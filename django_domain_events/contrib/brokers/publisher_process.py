"""A NATS or Redis publisher whose client runs in a child process (``PUBLISHER_PROCESS``).

A relay publishing to NATS or Redis spends about as much Python per message in the
client library (writing the protocol, reading the confirms) as in its own work
(claiming the rows, building the CloudEvents, acknowledging); in one process both hold
the same GIL and take turns, so the relay is bound by one core while the machine has
more. ``ProcessPublisher`` moves the client into a child (``publisher_child.py``): this
process sends each batch as plain values over a pipe and reads back one confirmation a
message.

It is a ``transport.Transport`` like the others, so the link (``links.py``) cannot tell
them apart: a child that cannot connect, or dies, is a broker outage (the batch answered
``BrokerDown``, its rows handed back uncharged, a new child at the link's next
connection attempt). What a dead child sent before its confirms came back is sent
again with the same id: JetStream drops the copy within its duplicate window, Redis
keeps it (consumers deduplicate on the id). A child reads its stdin to the end, so it
exits with this process however this process ends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .options import BrokerConfig
from .pipe import Child
from .transport import BrokerDown, Confirmations, Outgoing, Refused

#: The child program, run with this process's interpreter.
CHILD = "django_domain_events.contrib.brokers.publisher_child"
#: How long the child may take to start (Python, the client library) beyond connecting;
#: under the link's own bound for a connection, so a slow start is an outage it reports.
_START_SECONDS = 4.0
#: How long a stopping child may take to answer, then to exit, before it is killed: the
#: link waits five seconds for a close (a child that stopped answering is killed then).
_STOP_SECONDS = 2.0


class ProcessPublisher:
    """A broker's publisher in a child process, spoken to over its stdin and stdout."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.child = Child(CHILD, config.plain(), "publisher child", config.safe_url)

    @property
    def pid(self) -> int | None:
        """The child's process id, while it runs."""
        return self.child.pid

    async def connect(self) -> None:
        """Start the child and wait for it to connect (``BrokerDown`` if it cannot)."""
        await self.child.start(self.config.connect_timeout + _START_SECONDS)

    async def publish(self, messages: Sequence[Outgoing]) -> Confirmations:
        """Send the batch to the child; per message None (confirmed) or why not."""
        batch = [(m.to, _plain(m.envelope.attributes), m.envelope.data) for m in messages]
        try:
            answers = await self.child.request("publish", batch)
        except BrokerDown as down:
            return [down] * len(messages)
        return [_confirmation(each) for each in answers]

    async def close(self) -> None:
        """Stop the child (killed if it does not stop in time); never raises."""
        await self.child.close(_STOP_SECONDS)


def _plain(attributes: Mapping[str, str]) -> dict[str, str]:
    """``attributes`` as a dict, which is what a pipe's frame carries."""
    if type(attributes) is dict:  # what envelope.build makes: sent as it is
        return attributes
    return dict(attributes)


def _confirmation(answer: tuple[str, str] | None) -> BaseException | None:
    """The child's answer for one message as the transport's: None, an outage or a
    refusal (``publisher_child.plain``)."""
    if answer is None:
        return None
    kind, why = answer
    return BrokerDown(why) if kind == "down" else Refused(why)
