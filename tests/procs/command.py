"""A child process: run one management command against the test database.

Usage: command.py NAME [ARGS...]; prints what the command printed.
"""

from __future__ import annotations

import sys

import django

django.setup()

from django.core.management import call_command  # noqa: E402

call_command(*sys.argv[1:])
