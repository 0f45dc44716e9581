"""``manage.py dead_letters dump|retry|purge``: the dead-letter queue from the shell."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...inbox import dead_messages, inbox_entry, purge_dead_messages, retry_dead_messages
from ...operations import dead_letters, purge_dead, requeue_dead
from ..arguments import days, known_event_name, known_receiver, non_negative
from ..base import OutboxCommand


class Command(OutboxCommand):
    help = "Dump dead letters as JSON lines, retry them, or purge them."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="dump|retry|purge")
        dump = actions.add_parser("dump", help="One JSON object per dead letter, one per line.")
        dump.add_argument("--receiver", metavar="KEY")
        dump.add_argument("--event-name", metavar="NAME")
        retry = actions.add_parser("retry", help="Requeue dead letters (requeue_dead).")
        retry.add_argument("--receiver", metavar="KEY")
        retry.add_argument("--limit", type=int)
        purge = actions.add_parser("purge", help="Delete dead letters; needs a scope or --all.")
        purge.add_argument("--receiver", metavar="KEY")
        purge.add_argument("--event-name", metavar="NAME")
        purge.add_argument("--older-than", type=float, metavar="DAYS")
        purge.add_argument("--all", action="store_true", dest="everything")
        for action in (dump, retry, purge):
            action.add_argument(
                "--inbox",
                action="store_true",
                help="Dead inbox entries (consumed messages that could not be recorded) "
                "instead of dead deliveries.",
            )
            action.add_argument("--subscription", metavar="NAME", help="With --inbox.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options.get("inbox"):
            self._inbox(options)
            return
        if options.get("subscription") is not None:
            raise CommandError(
                "--subscription names a subscription's dead inbox entries; add --inbox."
            )
        limit = non_negative(options.get("limit"), "--limit")
        older_than = days(options.get("older_than"), "--older-than")
        key = options.get("receiver")
        if key is not None:
            known_receiver(key)
        if options.get("event_name") is not None:
            known_event_name(options["event_name"])
        if options["action"] == "dump":
            self._dump(key, options.get("event_name"))
        elif options["action"] == "retry":
            total = dead_letters(receiver_key=key).count()
            count = requeue_dead(receiver_key=key, limit=limit)
            self.stdout.write(f"Total dead letters: {total}")
            self.stdout.write(f"Retrying: {count}/{total}")
        else:
            self._purge(key, options["event_name"], older_than, options["everything"])

    def _inbox(self, options: dict[str, Any]) -> None:
        """``--inbox``: the same three verbs over dead inbox entries (``inbox.py``)."""
        for flag in ("receiver", "event_name", "older_than"):
            if options.get(flag) is not None:
                shown = "--" + flag.replace("_", "-")
                raise CommandError(
                    f"{shown} scopes dead deliveries; with --inbox use --subscription."
                )
        name = options.get("subscription")
        if options["action"] == "dump":
            for entry in dead_messages(subscription=name).iterator():
                self.stdout.write(json.dumps(inbox_entry(entry), sort_keys=True))
        elif options["action"] == "retry":
            limit = non_negative(options.get("limit"), "--limit")
            total = dead_messages(subscription=name).count()
            counts = retry_dead_messages(subscription=name, limit=limit)
            self.stdout.write(f"Total dead inbox entries: {total}")
            self.stdout.write(f"Retrying: {counts['recorded']}/{total}")
        else:
            if name is None and not options["everything"]:
                raise CommandError(
                    "dead_letters purge --inbox deletes dead inbox entries for good: say "
                    "which with --subscription, or pass --all to delete every one."
                )
            count = purge_dead_messages(subscription=name, all=options["everything"])
            self.stdout.write(f"Purged: {count}")

    def _dump(self, key: str | None, event_name: str | None) -> None:
        for row in dead_letters(receiver_key=key, event_name=event_name).iterator():
            record = {
                "delivery_id": row.pk,
                "event_id": row.event_id,
                "event_name": row.event.name,
                "receiver": row.receiver_key,
                "target": row.target,
                "attempts": row.attempts,
                "last_error": row.last_error,
                "payload": row.event.payload,
                "occurred_at": row.event.occurred_at.isoformat(),
                "died_at": row.completed_at.isoformat() if row.completed_at else None,
            }
            self.stdout.write(json.dumps(record, sort_keys=True))

    def _purge(
        self,
        key: str | None,
        event_name: str | None,
        older_than: timedelta | None,
        everything: bool,
    ) -> None:
        scoped = key is not None or event_name is not None or older_than is not None
        if not scoped and not everything:
            raise CommandError(
                "dead_letters purge deletes dead letters for good: say which with --receiver, "
                "--event-name or --older-than, or pass --all to delete every one."
            )
        count = purge_dead(
            receiver_key=key, event_name=event_name, older_than=older_than, all=everything
        )
        self.stdout.write(f"Purged: {count}")
