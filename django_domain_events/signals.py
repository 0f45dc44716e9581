"""Signals for integrations: an event recorded, a delivery succeeded, failed or died.

Each is sent with ``sender`` set to the event's class (None for a row whose event is no
longer declared), once what it reports is written. None is sent when nobody is
connected, so they cost nothing otherwise. A receiver connected to them runs in the
process and thread that wrote the row; what it raises propagates, as with any Django
signal sent with ``send()``, so keep them quick and safe (``send_robust`` is not used:
a broken integration should be seen).

- ``event_recorded``: after the transaction that fired the event commits. Arguments:
  ``event_id``, ``event_name``, ``event`` (the instance given to ``fire()``),
  ``deliveries`` (how many delivery rows it wrote).
- ``delivery_succeeded``: after a delivery's success is committed. Arguments:
  ``delivery_id``, ``event_id``, ``event_name``, ``receiver_key``, ``attempt``,
  ``duration`` (seconds the receiver ran) and ``lag`` (seconds from the row's due time
  to the attempt's start).
- ``delivery_failed``: after a failed attempt is recorded, with attempts left (status
  ``failed``). The same arguments, plus ``error`` (the exception) and ``last_error``.
- ``delivery_dead``: after a row is dead-lettered, whether its last attempt failed or it
  was settled without running (expired, undecodable, its lapses spent). The same
  arguments as ``delivery_failed``; ``error`` is a ``RuntimeError`` carrying the reason,
  and ``duration`` and ``lag`` are None, when nothing ran.
"""

from __future__ import annotations

from django.dispatch import Signal

event_recorded = Signal()
delivery_succeeded = Signal()
delivery_failed = Signal()
delivery_dead = Signal()
