"""The examples in the docs run, in order, against the package.

On each page of ``PAGES``, every fenced ``python`` block preceded by
``<!-- example: NAME -->`` is executed in one shared namespace per page, as a reader
following the page would run them; their ``assert`` lines
are the page's claims. Receivers they declare are forgotten by the autouse fixture in
conftest.py; the events they declare are removed here, so other tests see the registry
as it was.
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from django_domain_events import registry

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGE = DOCS / "scheduled-reactions.md"
# Pages whose examples run, with how many python blocks each leaves unmarked (shown,
# not run). docs/tutorial.md is run as a whole by scripts/tutorial.py (make dist).
PAGES = {
    "scheduled-reactions.md": 2,
    "howto-migrate.md": 0,
    "recurring.md": 1,
    "howto-recurring.md": 1,
}

EXAMPLE = re.compile(
    r"<!-- example: (?P<name>[\w-]+) -->\n```python\n(?P<code>.*?)\n```",
    re.DOTALL,
)


def examples(page: Path = PAGE) -> list[tuple[str, int, str]]:
    """``(name, line, code)`` of each marked example, in page order."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in EXAMPLE.finditer(text):
        code_line = text.count("\n", 0, match.start("code")) + 1
        found.append((match.group("name"), code_line, match.group("code")))
    return found


@pytest.fixture
def isolated_events() -> Iterator[None]:
    """Forget the events the examples declare, as conftest forgets their receivers."""
    before = set(registry._events_by_name)
    yield
    for name in set(registry._events_by_name) - before:
        declared = registry._events_by_name.pop(name)
        registry._events_by_class.pop(declared.event_class, None)
    registry._for_class.clear()


def test_the_page_marks_its_examples() -> None:
    found = examples()
    names = [name for name, _, _ in found]
    assert len(found) >= 10, f"expected the page's examples, found {names}"
    assert len(set(names)) == len(names), f"example names repeat: {names}"
    unmarked = PAGE.read_text(encoding="utf-8").count("```python") - len(found)
    # Two illustrative snippets (the NotYet comparison and a pytest test) are not run.
    assert unmarked == 2, f"{unmarked} python blocks lack an <!-- example: --> marker"


@pytest.mark.django_db
@pytest.mark.usefixtures("isolated_events")
def test_the_scheduled_reactions_examples_run_in_order() -> None:
    run_page(PAGE)


@pytest.mark.parametrize("page", [p for p in PAGES if p != PAGE.name])
def test_every_python_block_of_the_page_is_marked(page: str) -> None:
    found = examples(DOCS / page)
    names = [name for name, _, _ in found]
    assert found, f"{page} marks no example"
    assert len(set(names)) == len(names), f"example names repeat: {names}"
    unmarked = (DOCS / page).read_text(encoding="utf-8").count("```python") - len(found)
    assert unmarked == PAGES[page], f"{unmarked} python blocks lack an <!-- example: --> marker"


@pytest.mark.django_db
@pytest.mark.usefixtures("isolated_events")
@pytest.mark.parametrize("page", [p for p in PAGES if p != PAGE.name])
def test_the_page_examples_run_in_order(page: str) -> None:
    run_page(DOCS / page)


def run_page(page: Path) -> None:
    # A real module, so the examples' dataclasses and type hints resolve as in a file.
    module = types.ModuleType("docs_examples")
    sys.modules[module.__name__] = module
    try:
        for name, line, code in examples(page):
            # Pad with blank lines so a traceback's line number is the page's; no
            # __future__ flags of this file leak into the examples (dont_inherit).
            source = "\n" * (line - 1) + code
            compiled = compile(source, f"{page} (example {name!r})", "exec", dont_inherit=True)
            exec(compiled, module.__dict__)  # noqa: S102 - the page's own examples
    finally:
        del sys.modules[module.__name__]
