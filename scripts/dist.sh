#!/usr/bin/env bash
# Build the distributions and check what a user would install.
#
#   bash scripts/dist.sh PYTHON     (normally via `make dist`; PYTHON has build and twine)
#
# 1. python -m build: sdist and wheel into dist/; twine check --strict.
# 2. The wheel holds the migrations, py.typed and every other file of the package
#    (templates, static files); wheel and sdist carry the BSD-3-Clause licence.
# 3. A fresh virtualenv installs the wheel with no extras: it pulls in neither psycopg
#    nor celery (nor any other extra). Then the `cron` extra, which the example's
#    nightly report needs: it adds cronsim and nothing else. The example project's
#    `demo` runs against it from a copy of example/, with the repository nowhere on
#    sys.path.
# 4. docs/tutorial.md is followed as written in a fresh directory (scripts/tutorial.py).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY=${1:-.venv/bin/python}
ROOT=$(pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/dde-dist.XXXXXX")
trap 'rm -rf "$work"' EXIT

say() { printf '\n==> %s\n' "$*"; }
fail() {
    echo "dist: FAILED: $*" >&2
    exit 1
}

say "build"
rm -rf dist build ./*.egg-info
"$PY" -m build --outdir dist .
rm -rf build ./*.egg-info
wheel=$(ls dist/*.whl)
sdist=$(ls dist/*.tar.gz)
[ -f "$wheel" ] && [ -f "$sdist" ] || fail "expected one wheel and one sdist in dist/"

say "twine check"
"$PY" -m twine check --strict dist/*

say "contents"
"$PY" - "$wheel" "$sdist" <<'PY'
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser

wheel, sdist = sys.argv[1:]
names = set(zipfile.ZipFile(wheel).namelist())
problems = []

# Every file git tracks in the package, Python or not, ships in the wheel.
tracked = subprocess.run(
    ["git", "ls-files", "django_domain_events"], capture_output=True, text=True, check=True
).stdout.split()
missing = [name for name in tracked if name not in names]
if missing:
    problems.append(f"wheel lacks {missing}")
migrations = sorted(n for n in names if n.startswith("django_domain_events/migrations/"))
if not any(n.endswith("/0001_initial.py") for n in migrations):
    problems.append("wheel has no migrations")
if "django_domain_events/py.typed" not in names:
    problems.append("wheel has no py.typed")

metadata_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
with zipfile.ZipFile(wheel) as zf:
    metadata = Parser().parsestr(zf.read(metadata_name).decode())
if metadata["License-Expression"] != "BSD-3-Clause":
    problems.append(f"wheel METADATA License-Expression: {metadata['License-Expression']!r}")
if not any(n.endswith(".dist-info/licenses/LICENSE") for n in names):
    problems.append("wheel has no dist-info/licenses/LICENSE")
requires = [r for r in metadata.get_all("Requires-Dist") or [] if "extra ==" not in r]
if sorted(r.split(">")[0].split("<")[0].split("=")[0].strip() for r in requires) != [
    "Django",
    "asgiref",
]:
    problems.append(f"default dependencies are {requires}, not Django and asgiref only")

with tarfile.open(sdist) as tf:
    members = {m.name.split("/", 1)[1] for m in tf.getmembers() if "/" in m.name}
    pkg_info = Parser().parsestr(tf.extractfile(tf.getmember(f"{tf.getnames()[0].split('/')[0]}/PKG-INFO")).read().decode())
for needed in ["LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "mkdocs.yml", "docs/index.md"]:
    if needed not in members:
        problems.append(f"sdist lacks {needed}")
if pkg_info["License-Expression"] != "BSD-3-Clause":
    problems.append(f"sdist PKG-INFO License-Expression: {pkg_info['License-Expression']!r}")

print(f"wheel: {len(names)} files, {len(migrations)} in migrations/, py.typed, LICENSE")
print(f"sdist: {len(members)} files")
print(f"Requires-Dist (no extra): {requires}")
if problems:
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1)
PY

say "install the wheel with no extras in a fresh virtualenv"
"$PY" -m venv "$work/venv"
VPY=$work/venv/bin/python
"$VPY" -m pip install --quiet "$wheel"
"$VPY" -m pip list --format=freeze | tee "$work/installed.txt"
if grep -iE '^(psycopg|psycopg-binary|psycopg2|celery|kombu|prometheus.client|mysqlclient|django-tasks|aio-pika|aiormq|nats-py|redis)==' \
    "$work/installed.txt"; then
    fail "installing the wheel with no extras pulled in an optional dependency (above)"
fi
# contrib.brokers imports no client library until a broker of its kind is used.
"$VPY" -c '
import sys
import django_domain_events.contrib.brokers
import django_domain_events.contrib.brokers.config
import django_domain_events.contrib.brokers.envelope
loaded = {"aio_pika", "nats", "redis"} & set(sys.modules)
assert not loaded, f"contrib.brokers imported {loaded} unconfigured"
' || fail "contrib.brokers needs a broker client library to be imported"

say "add the cron extra (cronsim, for the example's @recurring schedule)"
"$VPY" -m pip install --quiet "$wheel[cron]"
"$VPY" -m pip list --format=freeze >"$work/with-cron.txt"
added=$(comm -13 <(sort "$work/installed.txt") <(sort "$work/with-cron.txt"))
echo "$added"
if [ "$(echo "$added" | sed 's/==.*//')" != "cronsim" ]; then
    fail "the cron extra should add cronsim and nothing else; it added: $added"
fi

say "the example's demo against the installed wheel"
cp -r example "$work/example"
rm -f "$work/example"/*.sqlite3
cd "$work/example"
# The repository is not on sys.path: the package must come from the virtualenv.
env -u PYTHONPATH "$VPY" -c '
import sys, django_domain_events as p
root = sys.argv[1]
assert not any(e and (e == root or e.startswith(root + "/")) for e in sys.path), sys.path
assert p.__file__.startswith(sys.prefix), p.__file__
print("django_domain_events", p.__version__, "from", p.__file__)
' "$ROOT"
env -u PYTHONPATH "$VPY" manage.py demo >"$work/demo.txt" 2>&1 || {
    cat "$work/demo.txt"
    fail "the example's demo failed against the installed wheel"
}
tail -n 3 "$work/demo.txt"
cd "$ROOT"

say "the tutorial, as written, in a fresh directory"
"$PY" scripts/tutorial.py --wheel "$wheel"

say "dist: OK ($(basename "$wheel"), $(basename "$sdist"))"
