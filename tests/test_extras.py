"""What the package needs from each optional extra, and what it says when one is missing.

The distribution (django-domain-outbox) depends on Django and asgiref only; a feature
that needs more names the extra that brings it.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest
from django.db import connections

from django_domain_events.checks import check_wake


def block(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Make ``import NAME`` fail as if the distribution were not installed."""
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("module", "missing", "extra"),
    [
        ("django_domain_events.contrib.prometheus", ["prometheus_client"], "prometheus"),
        ("django_domain_events.contrib.celery", ["celery"], "celery"),
        ("django_domain_events.contrib.django_tasks", ["django.tasks", "django_tasks"], "tasks"),
        ("django_domain_events.contrib.opentelemetry", ["opentelemetry"], "opentelemetry"),
    ],
)
def test_a_contrib_module_without_its_extra_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, module: str, missing: list[str], extra: str
) -> None:
    block(monkeypatch, *missing)
    # Forget the module if an earlier test imported it; monkeypatch puts it back.
    if module in sys.modules:
        monkeypatch.delitem(sys.modules, module)
    with pytest.raises(ImportError, match=rf"pip install '?django-domain-outbox\[{extra}\]"):
        importlib.import_module(module)


def test_no_page_or_message_installs_the_other_project() -> None:
    """``django-domain-events`` on PyPI is another project that overwrites this one: no
    docs page, message or README may tell anyone to install it."""
    root = Path(__file__).resolve().parent.parent
    sources = [
        root / "README.md",
        *root.glob("docs/**/*.md"),
        *root.glob("django_domain_events/**/*.py"),
    ]
    wrong = re.compile(r"django-domain-events\[|(?<!un)install\s+['\"]?django-domain-events\b")
    found = [
        f"{path.relative_to(root)}:{n}"
        for path in sources
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if wrong.search(line)
    ]
    assert not found, found


def test_the_wake_check_needs_no_psycopg_without_a_postgresql_database(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if any(connections[alias].vendor == "postgresql" for alias in connections):
        pytest.skip("runs where no database is PostgreSQL, as a SQLite or MySQL user's site")
    block(monkeypatch, "psycopg", "psycopg2", "django.db.backends.postgresql.psycopg_any")
    assert check_wake() == []


def test_the_version_is_kept_in_one_place() -> None:
    import tomllib
    from pathlib import Path

    import django_domain_events

    pyproject = tomllib.loads(
        (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text(encoding="utf-8")
    )
    assert "version" not in pyproject["project"]
    assert pyproject["project"]["dynamic"] == ["version"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "django_domain_events.__version__"
    }
    assert django_domain_events.__version__.count(".") >= 2
