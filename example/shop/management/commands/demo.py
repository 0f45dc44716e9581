"""``python manage.py demo``: rebuild the example database and tell the shop's story."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from shop.demo import CHAPTERS, Story


class Command(BaseCommand):
    help = (
        "Delete and recreate demo.sqlite3, place, veto, pay and cancel orders, deliver "
        "their events with drain_outbox() and report what every receiver did; then move "
        "the clock forward through scheduled reactions and a message's lifecycle."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        story = Story(out=self.stdout, style=self.style)
        story.tell(CHAPTERS)
        self.stdout.write("")
        self.stdout.write(self.style.SUCCESS("Done. Browse the rows: python manage.py runserver"))
        self.stdout.write("and /admin/ (create a user with python manage.py createsuperuser).")
