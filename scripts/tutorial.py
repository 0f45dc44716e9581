"""Follow docs/tutorial.md as written, in a fresh directory, and check what it promises.

    python scripts/tutorial.py --wheel dist/django_domain_outbox-X-py3-none-any.whl

(normally from scripts/dist.sh, that is `make dist`). The page's marked blocks, in page
order, become one bash script run in a new temporary directory:

- ``<!-- tutorial: run -->`` before a ``sh`` block: its lines, verbatim;
- ``<!-- tutorial: file PATH -->`` / ``<!-- tutorial: append PATH -->`` before a block:
  the block written to (appended to) PATH, as the reader is told to;
- ``<!-- tutorial: expect -->`` before a ``text`` block: every line of it must appear in
  what the run block before it printed.

``pip install django-domain-outbox`` finds the given wheel: its directory is added to
pip's find-links, so the command runs as written and installs what `make dist` built.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

PAGE = Path(__file__).resolve().parent.parent / "docs" / "tutorial.md"
BLOCK = re.compile(
    r"<!-- tutorial: (?P<what>run|file|append|expect)(?: (?P<path>\S+))? -->\n"
    r"```(?P<lang>\w*)\n(?P<body>.*?)\n```",
    re.DOTALL,
)


def blocks(text: str) -> list[tuple[str, str | None, str]]:
    return [(m["what"], m["path"], m["body"]) for m in BLOCK.finditer(text)]


def script(found: list[tuple[str, str | None, str]], outputs: Path) -> tuple[str, dict[int, str]]:
    """The bash script, and the expected text for each run block's output file."""
    lines = ["set -euo pipefail"]
    expected: dict[int, str] = {}
    run = 0
    for what, path, body in found:
        if what == "run":
            run += 1
            out = outputs / f"{run}.txt"
            lines.append(f"echo '$ (block {run})'")
            # A group, not a subshell: cd and source carry over to the next block.
            lines.append("{")
            lines.append(body)
            lines.append(f"}} > {shlex.quote(str(out))} 2>&1 || {{ cat {out}; exit 1; }}")
            lines.append(f"cat {shlex.quote(str(out))}")
        elif what in ("file", "append"):
            assert path, f"a {what} block needs a path"
            op = ">" if what == "file" else ">>"
            lines.append(f'mkdir -p "$(dirname {shlex.quote(path)})"')
            lines.append(f"cat {op} {shlex.quote(path)} <<'TUTORIAL_EOF'\n{body}\nTUTORIAL_EOF")
        else:
            assert run, "an expect block must follow a run block"
            expected[run] = expected.get(run, "") + body + "\n"
    return "\n".join(lines) + "\n", expected


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", required=True, type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the directory")
    args = parser.parse_args()

    found = blocks(PAGE.read_text(encoding="utf-8"))
    kinds = {what for what, _, _ in found}
    assert {"run", "file", "append", "expect"} <= kinds, f"the page marks only {kinds}"

    where = Path(tempfile.mkdtemp(prefix="dde-tutorial."))
    outputs = where / ".outputs"
    outputs.mkdir()
    text, expected = script(found, outputs)
    (where / "tutorial.sh").write_text(text, encoding="utf-8")
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"VIRTUAL_ENV", "PYTHONPATH", "DJANGO_SETTINGS_MODULE"}
    }
    wheels = str(args.wheel.resolve().parent)
    env["PIP_FIND_LINKS"] = " ".join(filter(None, [wheels, env.get("PIP_FIND_LINKS")]))
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    print(f"tutorial: {len(found)} blocks, run in {where}", flush=True)
    done = subprocess.run(["bash", str(where / "tutorial.sh")], cwd=where, env=env)
    problems = []
    if done.returncode != 0:
        problems.append(f"the tutorial's commands failed (exit {done.returncode})")
    else:
        for run, text in expected.items():
            printed = (outputs / f"{run}.txt").read_text(encoding="utf-8")
            for line in filter(None, text.splitlines()):
                if line not in printed.splitlines():
                    problems.append(f"block {run} did not print {line!r}; it printed:\n{printed}")
    if not args.keep and not problems:
        subprocess.run(["rm", "-rf", str(where)], check=False)
    for problem in problems:
        print(f"tutorial: FAILED: {problem}", file=sys.stderr)
    if not problems:
        print("tutorial: every command ran and printed what the page says")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
