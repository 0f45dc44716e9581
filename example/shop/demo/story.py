"""What the chapters share: where to write, and what earlier chapters created."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from django.core.management.base import CommandError, OutputWrapper
from django.core.management.color import Style

from shop.models import Customer, Offer, Order

from .clock import SimClock


@dataclass
class Story:
    out: OutputWrapper
    style: Style
    customers: dict[str, Customer] = field(default_factory=dict)  # by first name
    orders: dict[str, Order] = field(default_factory=dict)  # by the customer's first name
    offers: dict[str, Offer] = field(default_factory=dict)  # by the customer's first name
    clock: SimClock | None = None  # the simulated time of the chapter under way
    chapter_number: int = 0

    def tell(self, chapters: Iterable[Chapter]) -> None:
        for chapter in chapters:
            self.chapter_number += 1
            title = (chapter.__doc__ or chapter.__name__).strip().splitlines()[0]
            heading = f"{self.chapter_number}. {title}"
            self.out.write("")
            self.out.write(self.style.MIGRATE_HEADING(heading))
            chapter(self)

    def say(self, text: str = "") -> None:
        """One line of the story, indented under the chapter's heading."""
        self.out.write(f"  {text}" if text else "")

    def expect(self, condition: bool, failure: str) -> None:
        """Stop the demo (exit code 1) when the package did not do what the story says."""
        if not condition:
            raise CommandError(f"The demo expected otherwise: {failure}")


Chapter = Callable[[Story], None]
