"""``python manage.py demo``: the shop's story, told in chapters.

A chapter is a function ``chapter(story: Story) -> None`` whose docstring's first line is
its title. ``CHAPTERS`` is the running order; to add one, write the function in a module
of this package (one module per topic) and insert it in ``CHAPTERS`` where it belongs.
Chapters share what they created through the ``Story`` (its customers and orders), and a
chapter that finds the package misbehaving calls ``story.expect(...)``, which stops the
demo with a non-zero exit.
"""

from __future__ import annotations

from . import basics, lifecycle, recurring, scheduling
from .story import Chapter, Story

CHAPTERS: tuple[Chapter, ...] = (
    basics.fresh_database,
    basics.customers_sign_up,
    basics.orders_are_placed,
    basics.a_negative_order_is_refused,
    basics.orders_are_paid_and_cancelled,
    basics.the_relay_delivers,
    basics.what_happened,
    scheduling.offers_are_made,
    scheduling.an_offer_is_extended_another_accepted,
    scheduling.forty_eight_hours_later,
    scheduling.seventy_two_hours_later,
    scheduling.an_invoice_reminder,
    scheduling.a_newsletter_at_a_chosen_time,
    lifecycle.a_dead_letter_is_dumped,
    lifecycle.the_dead_letter_is_retried,
    lifecycle.a_constant_retry_policy,
    lifecycle.a_message_lifetime,
    lifecycle.dead_letters_are_purged,
    recurring.a_nightly_sales_report,
)

__all__ = ["CHAPTERS", "Chapter", "Story"]
