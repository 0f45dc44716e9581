"""``manage.py export_catalogue``: the event catalogue, for a committed copy or a reader."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...cataloguing import FORMATS, catalogue, render_catalogue
from ..base import OutboxCommand


class Command(OutboxCommand):
    help = (
        "Print every declared event, its fields and its receivers, as Markdown or JSON. "
        "Commit the output to review declaration changes as a diff."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--format",
            choices=FORMATS,
            default="markdown",
            help="markdown (default) for people, json for tools.",
        )
        parser.add_argument(
            "--output",
            metavar="PATH",
            help="Write the catalogue to PATH instead of printing it.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        fmt = options["format"]
        if fmt not in FORMATS:  # call_command(format=...) bypasses argparse's choices
            raise CommandError(
                f"--format {fmt!r} is not a catalogue format; use one of {', '.join(FORMATS)}."
            )
        text = render_catalogue(catalogue(), format=fmt)
        output: str | None = options["output"]
        if output is None:
            self.stdout.write(text, ending="")
            return
        try:
            # newline="\n": the same bytes on every platform, so a committed copy diffs cleanly.
            with open(output, "w", encoding="utf-8", newline="\n") as handle:
                handle.write(text)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise CommandError(
                f"Cannot write the catalogue to {output!r} ({reason}). Give --output a path "
                "in an existing, writable directory, or leave --output out to print it."
            ) from exc
        self.stdout.write(f"Wrote {output}")
