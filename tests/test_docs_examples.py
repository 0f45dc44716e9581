"""The examples in docs/scheduled-reactions.md run, in order, against the package.

Every fenced ``python`` block preceded by ``<!-- example: NAME -->`` is executed in one
shared namespace, as a reader following the page would run them; their ``assert`` lines
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

PAGE = Path(__file__).resolve().parent.parent / "docs" / "scheduled-reactions.md"

EXAMPLE = re.compile(
    r"<!-- example: (?P<name>[\w-]+) -->\n```python\n(?P<code>.*?)\n```",
    re.DOTALL,
)


def examples() -> list[tuple[str, int, str]]:
    """``(name, line, code)`` of each marked example, in page order."""
    text = PAGE.read_text(encoding="utf-8")
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
    # A real module, so the examples' dataclasses and type hints resolve as in a file.
    module = types.ModuleType("docs_examples")
    sys.modules[module.__name__] = module
    try:
        for name, line, code in examples():
            # Pad with blank lines so a traceback's line number is the page's; no
            # __future__ flags of this file leak into the examples (dont_inherit).
            source = "\n" * (line - 1) + code
            compiled = compile(source, f"{PAGE} (example {name!r})", "exec", dont_inherit=True)
            exec(compiled, module.__dict__)  # noqa: S102 - the page's own examples
    finally:
        del sys.modules[module.__name__]
