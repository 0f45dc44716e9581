"""docs/api.md is plain Markdown generated from the docstrings, and matches the code."""

from __future__ import annotations

import importlib.util

from tests.conftest import ROOT


def test_the_api_reference_page_matches_the_code() -> None:
    spec = importlib.util.spec_from_file_location(
        "api_reference", ROOT / "scripts" / "api_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = (ROOT / "docs" / "api.md").read_text()
    assert ":::" not in page  # no directive a reader of the Markdown would have to render
    assert page == module.render(), "docs/api.md is stale: run `make api-docs`"
