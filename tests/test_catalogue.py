"""The catalogue: what it lists, how it renders, and that it never runs user code."""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from io import StringIO
from pathlib import Path
from typing import Any, Literal, NewType, Optional

import pytest
from django.core.management import CommandError, call_command

import django_domain_events
from django_domain_events import (
    INLINE,
    ON_COMMIT,
    AnyEvent,
    Catalogue,
    CatalogueEvent,
    CatalogueField,
    CatalogueReceiver,
    CatalogueSchedule,
    Constant,
    Exponential,
    Linear,
    Retention,
    catalogue,
    receiver,
    recurring,
    registry,
    render_catalogue,
)
from django_domain_events.declare import RegisteredEvent, Registry, dotted_name
from django_domain_events.recurrence import Schedules
from tests.app.events import OrderPlaced, OrderShipped, ReportDue

HERE = __name__


def noop(evt: object) -> None:
    pass


def due_in_a_week(evt: object) -> datetime:
    raise AssertionError("the catalogue called a due= callable")


def every_customer(evt: object, ctx: object) -> list[str]:
    raise AssertionError("the catalogue called a targets= callable")


ALWAYS_ONE = lambda evt, ctx: ["one"]  # noqa: E731 - the test is about how a lambda is named


class Stubborn:
    """A custom retry policy."""

    def delay(self, attempt: int, error: BaseException) -> float | None:
        raise AssertionError("the catalogue called a retry policy")


def by_key(cat: Catalogue, key: str) -> CatalogueReceiver:
    found = [r for evt in cat.events for r in evt.receivers if r.key == key] + [
        r for r in cat.wildcard_receivers if r.key == key
    ]
    assert len(found) == 1, f"{key} is listed {len(found)} times"
    return found[0]


def by_name(cat: Catalogue, name: str) -> CatalogueEvent:
    (found,) = [evt for evt in cat.events if evt.name == name]
    return found


def private_registry(*events: type | RegisteredEvent, receivers: tuple[str, ...] = ()) -> Registry:
    """A registry holding only ``events`` and the named receivers, so sections are exact."""
    private = Registry()
    for evt in events:
        registered = evt if isinstance(evt, RegisteredEvent) else registry.event_for_class(evt)
        assert registered is not None
        private.add_event(registered)
    for key in receivers:
        declared = registry.receiver(key)
        assert declared is not None
        private.add_receiver(declared)
    return private


def section(markdown: str, heading: str) -> str:
    """The text of the ``## heading`` section, up to the next one."""
    start = markdown.index(f"\n## {heading}\n")
    end = markdown.find("\n## ", start + 1)
    return markdown[start : end if end != -1 else len(markdown)]


# ---------------------------------------------------------------- events and fields


def test_every_event_is_listed_by_name_with_its_fields_in_declaration_order() -> None:
    cat = catalogue()

    assert [e.name for e in cat.events] == sorted(e.name for e in registry.events)
    placed = by_name(cat, "testapp.OrderPlaced")
    assert (placed.version, placed.class_path, placed.retention) == (
        1,
        "tests.app.events.OrderPlaced",
        None,
    )
    assert placed.fields == (
        CatalogueField("order_id", "int", None),
        CatalogueField("total", "Decimal", "Decimal('0')"),
        CatalogueField("tags", "tuple[str, ...]", "()"),
    )
    shipped = by_name(cat, "testapp.OrderShipped")
    assert shipped.version == 2
    assert shipped.fields == (
        CatalogueField("order_id", "int", None),
        CatalogueField("carrier", "str", None),
    )
    assert by_name(cat, "testapp.Pinged").fields == (
        CatalogueField("n", "int", "0"),
        CatalogueField("when", "datetime | None", "None"),
        CatalogueField("colour", "Colour", "Colour.RED"),
        CatalogueField("labels", "list[str]", "list()"),
    )


class Size(enum.Enum):
    SMALL = "s"
    LARGE = "l"


UserId = NewType("UserId", int)


def make_default_tags() -> tuple[str, ...]:
    raise AssertionError("the catalogue called a default_factory")


@dataclass(frozen=True)
class Typed:
    kind: Literal["a", "b"]
    size: Literal[Size.SMALL]
    user: UserId
    maybe: Optional[Decimal]  # noqa: UP045 - the old spelling reads the same
    pair: tuple[str, int]
    nothing: tuple[()]
    mapping: dict[str, list[int]]
    anything: Any = None
    tags: tuple[str, ...] = field(default_factory=make_default_tags)
    derived: int = field(default=0, init=False)


class Marker:
    pass


MARKER = Marker()


@dataclass(frozen=True)
class Sentinel:
    marker: Marker = MARKER


@dataclass(frozen=True)
class Unresolvable:
    ghost: NotImportedAnywhere  # type: ignore[name-defined]  # noqa: F821


def test_field_types_read_as_written_and_default_factories_are_named_not_called() -> None:
    cat = catalogue(
        private_registry(
            RegisteredEvent(Typed, "t.Typed", 1, None),
            RegisteredEvent(Unresolvable, "t.Unresolvable", 1, None),
            RegisteredEvent(Sentinel, "t.Sentinel", 1, None),
        )
    )

    assert by_name(cat, "t.Typed").fields == (
        CatalogueField("kind", "Literal['a', 'b']", None),
        CatalogueField("size", "Literal[Size.SMALL]", None),
        CatalogueField("user", "UserId", None),
        CatalogueField("maybe", "Decimal | None", None),
        CatalogueField("pair", "tuple[str, int]", None),
        CatalogueField("nothing", "tuple[()]", None),
        CatalogueField("mapping", "dict[str, list[int]]", None),
        CatalogueField("anything", "Any", "None"),
        CatalogueField("tags", "tuple[str, ...]", f"{HERE}.make_default_tags()"),
    )  # ``derived`` is not an init field: it is not in the payload
    # A repr that holds a memory address would change on every run: the type stands in.
    assert by_name(cat, "t.Sentinel").fields == (
        CatalogueField("marker", "Marker", "<Marker instance>"),
    )
    # A hint that cannot be resolved is shown as written rather than failing the catalogue.
    assert by_name(cat, "t.Unresolvable").fields == (
        CatalogueField("ghost", "NotImportedAnywhere", None),
    )


@dataclass(frozen=True)
class Kept:
    n: int = 0


def test_retention_is_none_a_policy_name_or_whole_seconds() -> None:
    cat = catalogue(
        private_registry(
            RegisteredEvent(Kept, "t.a_window", 1, None),
            RegisteredEvent(Kept, "t.b_succeeded", 1, Retention.SUCCEEDED),
            RegisteredEvent(Kept, "t.c_settled", 1, Retention.SETTLED),
            RegisteredEvent(Kept, "t.d_week", 1, timedelta(days=7)),
        )
    )

    assert [(e.name, e.retention) for e in cat.events] == [
        ("t.a_window", None),
        ("t.b_succeeded", "succeeded"),
        ("t.c_settled", "settled"),
        ("t.d_week", 604800),
    ]
    text = render_catalogue(cat)
    assert "- Retention: the `RETENTION_DAYS` window" in section(text, "t.a_window")
    assert "`Retention.SUCCEEDED`" in section(text, "t.b_succeeded")
    assert "`Retention.SETTLED`" in section(text, "t.c_settled")
    assert "- Retention: kept 7d after it is recorded (604800s)" in section(text, "t.d_week")


# ---------------------------------------------------------------- receivers


def test_receivers_are_listed_under_their_event_with_their_delivery_settings(
    settings: Any,
) -> None:
    settings.DJANGO_DOMAIN_EVENTS = {"BACKOFF_BASE_SECONDS": 3, "BACKOFF_CAP_SECONDS": 90}

    def on_failure(failure: object) -> None:
        pass

    receiver(OrderPlaced, key="t.default")(noop)
    receiver(OrderPlaced, key="t.constant", retry=Constant(2), lane="mail", site="task")(noop)
    receiver(OrderPlaced, key="t.linear", retry=Linear(5, cap=60), lease_seconds=30)(noop)
    receiver(OrderPlaced, key="t.custom", retry=Stubborn(), max_attempts=9)(noop)
    receiver(OrderPlaced, key="t.knobs", backoff_base_seconds=1, backoff_cap_seconds=10)(noop)
    receiver(OrderPlaced, key="t.exp", retry=Exponential(4, 40), eager=True)(noop)
    receiver(OrderPlaced, key="t.inline", mode=INLINE, on_failure=on_failure)(noop)
    receiver(OrderShipped, key="t.after", mode=ON_COMMIT, takes_context=True)(lambda evt, ctx: None)

    cat = catalogue()

    placed = by_name(cat, "testapp.OrderPlaced")
    mine = [r for r in placed.receivers if r.key.startswith("t.")]
    assert [r.key for r in mine] == sorted(r.key for r in mine)
    assert {r.event_name for r in mine} == {"testapp.OrderPlaced"}
    default = by_key(cat, "t.default")
    assert default == CatalogueReceiver(
        key="t.default",
        event_name="testapp.OrderPlaced",
        mode="durable",
        site="relay",
        lane="default",
        max_attempts=5,
        eager=False,
        takes_context=False,
        lease_seconds=300,
        retry={"kind": "exponential", "base": 3.0, "cap": 90.0},
        give_up_after_seconds=None,
        due_seconds=None,
        due_callable=None,
        ttl_seconds=None,
        targets=None,
        on_failure=None,
        function=f"{HERE}.noop",
    )
    constant = by_key(cat, "t.constant")
    assert (constant.site, constant.lane) == ("task", "mail")
    assert constant.retry == {"kind": "constant", "seconds": 2.0}
    linear = by_key(cat, "t.linear")
    assert linear.retry == {"kind": "linear", "step": 5.0, "cap": 60.0}
    assert linear.lease_seconds == 30
    custom = by_key(cat, "t.custom")
    assert custom.retry == {"kind": "custom", "path": f"{HERE}.Stubborn"}
    assert custom.max_attempts == 9
    assert by_key(cat, "t.knobs").retry == {"kind": "exponential", "base": 1.0, "cap": 10.0}
    exp = by_key(cat, "t.exp")
    assert (exp.retry, exp.eager) == ({"kind": "exponential", "base": 4.0, "cap": 40.0}, True)

    # INLINE and ON_COMMIT write no row: every row-only value is None.
    inline = by_key(cat, "t.inline")
    assert inline.mode == "inline"
    assert inline.on_failure == f"{HERE}.{on_failure.__qualname__}"
    for r in (inline, by_key(cat, "t.after")):
        row_only = (r.site, r.lane, r.max_attempts, r.eager, r.lease_seconds, r.retry)
        assert row_only == (None,) * 6
        assert (r.due_seconds, r.due_callable, r.ttl_seconds, r.targets) == (None,) * 4
    after = by_key(cat, "t.after")
    assert (after.mode, after.event_name, after.takes_context) == (
        "on_commit",
        "testapp.OrderShipped",
        True,
    )
    assert after.function.endswith(".<locals>.<lambda>")
    assert "t.after" not in [r.key for r in placed.receivers]

    text = render_catalogue(cat)
    placed_md = section(text, "testapp.OrderPlaced")
    assert (
        "| `t.default` | durable | relay | default | 5 | exponential, base 3s, cap 90s | - |"
        in (placed_md)
    )
    assert "| `t.constant` | durable | task | mail | 5 | constant 2s | - |" in placed_md
    assert "| `t.linear` | durable | relay | default | 5 | linear, step 5s, cap 60s | - |" in (
        placed_md
    )
    assert f"| custom `{HERE}.Stubborn` |" in placed_md
    assert "| `t.inline` | inline | - | - | - | - | - |" in placed_md
    assert "| `t.after` | on_commit |" in section(text, "testapp.OrderShipped")


def test_callables_are_named_by_dotted_path() -> None:
    receiver(OrderPlaced, key="t.fan", targets=ALWAYS_ONE, takes_context=False)(noop)
    receiver(OrderPlaced, key="t.fan_fn", targets=every_customer)(noop)

    cat = catalogue()

    assert by_key(cat, "t.fan").targets == f"{HERE}.<lambda>"
    assert by_key(cat, "t.fan_fn").targets == f"{HERE}.every_customer"
    assert f"| `{HERE}.every_customer` |" in render_catalogue(cat)


def test_wildcard_receivers_are_listed_once_in_their_own_section() -> None:
    receiver(AnyEvent, key="t.audit")(noop)
    receiver(OrderPlaced, key="t.own")(noop)

    cat = catalogue()

    assert [r.key for r in cat.wildcard_receivers if r.key.startswith("t.")] == ["t.audit"]
    assert by_key(cat, "t.audit").event_name == "*"  # by_key also checks it is listed once
    for evt in cat.events:
        assert "t.audit" not in [r.key for r in evt.receivers]
    text = render_catalogue(cat)
    assert text.count("`t.audit`") == 1
    assert "`t.audit`" in section(text, "Every event (AnyEvent)")
    assert "also react" in section(text, "testapp.OrderPlaced")


def test_an_event_nothing_listens_to_says_so() -> None:
    receiver(OrderPlaced, key="t.own")(noop)
    receiver(AnyEvent, key="t.audit")(noop)

    alone = render_catalogue(
        catalogue(private_registry(OrderPlaced, OrderShipped, receivers=("t.own",)))
    )
    assert "Nothing listens to this event." in section(alone, "testapp.OrderShipped")
    assert "Nothing listens" not in section(alone, "testapp.OrderPlaced")
    assert "## Every event (AnyEvent)" not in alone

    # With a wildcard receiver something does listen, and the document says which.
    shared = render_catalogue(
        catalogue(private_registry(OrderPlaced, OrderShipped, receivers=("t.own", "t.audit")))
    )
    shipped = section(shared, "testapp.OrderShipped")
    assert "Nothing listens to this event." not in shipped
    assert "only the receiver of every event (AnyEvent)" in shipped
    assert "## Every event (AnyEvent)" in shared


# ---------------------------------------------------------------- schedules and lifetimes


def test_a_due_time_is_published_with_a_line_under_the_table() -> None:
    receiver(OrderPlaced, key="t.later", due=timedelta(hours=48))(noop)
    receiver(OrderPlaced, key="t.soon", due=timedelta(seconds=1.5))(noop)
    receiver(OrderPlaced, key="t.weekly", due=due_in_a_week)(noop)
    receiver(OrderPlaced, key="t.now")(noop)

    cat = catalogue()

    later = by_key(cat, "t.later")
    assert (later.due_seconds, later.due_callable) == (172800, None)
    assert by_key(cat, "t.soon").due_seconds == 1.5
    weekly = by_key(cat, "t.weekly")
    assert (weekly.due_seconds, weekly.due_callable) == (None, f"{HERE}.due_in_a_week")
    assert (by_key(cat, "t.now").due_seconds, by_key(cat, "t.now").due_callable) == (None, None)

    placed = section(render_catalogue(cat), "testapp.OrderPlaced")
    table_end = placed.rindex("|")
    notes = placed[table_end:]
    assert "- `t.later` runs 2d after the event (due=172800s)" in notes
    assert "- `t.soon` runs 1.5s after the event (due=1.5s)" in notes
    assert f"- `t.weekly` runs at the time `{HERE}.due_in_a_week` returns (due callable)" in notes
    assert "`t.now` runs" not in notes


def test_lifetime_and_give_up_bound_are_published(settings: Any) -> None:
    receiver(OrderPlaced, key="t.ttl", ttl=timedelta(days=1))(noop)
    receiver(OrderPlaced, key="t.patient", give_up_after=timedelta(hours=1))(noop)
    receiver(OrderPlaced, key="t.plain")(noop)
    receiver(OrderPlaced, key="t.inline", mode=INLINE)(noop)

    cat = catalogue()
    assert by_key(cat, "t.ttl").ttl_seconds == 86400
    assert by_key(cat, "t.patient").give_up_after_seconds == 3600
    assert by_key(cat, "t.plain").ttl_seconds is None
    placed = section(render_catalogue(cat), "testapp.OrderPlaced")
    assert "- `t.ttl` expires 1d after it is due (ttl=86400s)" in placed
    assert "- `t.patient` gives up after 1h of deferrals (give_up_after=3600s)" in placed
    assert "`t.plain` expires" not in placed

    # MESSAGE_TTL_SECONDS is every durable receiver's lifetime unless it declares its own.
    settings.DJANGO_DOMAIN_EVENTS = {"MESSAGE_TTL_SECONDS": 5400}
    cat = catalogue()
    assert by_key(cat, "t.plain").ttl_seconds == 5400
    assert by_key(cat, "t.ttl").ttl_seconds == 86400
    assert by_key(cat, "t.inline").ttl_seconds is None
    assert "- `t.plain` expires 1h 30m after it is due (ttl=5400s)" in render_catalogue(cat)


# ---------------------------------------------------------------- never running user code


class Boom(Exception):
    pass


@dataclass(frozen=True)
class Guarded:
    tags: tuple[str, ...] = field(default_factory=make_default_tags)

    @staticmethod
    def upgrade(payload: dict[str, Any], from_version: int) -> dict[str, Any]:
        raise AssertionError("the catalogue called an upgrade() hook")


def test_the_catalogue_never_calls_targets_due_upgrade_or_retry_code() -> None:
    called: list[str] = []

    def targets(evt: object, ctx: object) -> list[str]:
        called.append("targets")
        raise Boom("targets")

    def due(evt: object) -> datetime:
        called.append("due")
        raise Boom("due")

    def on_failure(failure: object) -> None:
        called.append("on_failure")

    def func(evt: object) -> None:
        called.append("receiver")

    receiver(OrderPlaced, key="t.fan", targets=targets, on_failure=on_failure)(func)
    receiver(OrderPlaced, key="t.scheduled", due=due, retry=Stubborn())(func)
    guarded = RegisteredEvent(Guarded, "t.Guarded", 3, None, upgrade=Guarded.upgrade)

    for cat in (catalogue(), catalogue(private_registry(guarded))):
        render_catalogue(cat, "markdown")
        render_catalogue(cat, "json")

    assert called == []
    cat = catalogue()
    assert by_key(cat, "t.fan").targets == f"{HERE}.{targets.__qualname__}"
    assert by_key(cat, "t.scheduled").due_callable == f"{HERE}.{due.__qualname__}"


# ---------------------------------------------------------------- rendering


def test_json_parses_to_the_catalogue_dataclasses() -> None:
    receiver(OrderPlaced, key="t.later", due=timedelta(hours=48), retry=Constant(2))(noop)
    receiver(AnyEvent, key="t.audit", mode=ON_COMMIT)(noop)
    cat = catalogue()

    text = render_catalogue(cat, format="json")
    parsed = json.loads(text)

    assert parsed == json.loads(json.dumps(dataclasses.asdict(cat)))
    rebuilt = Catalogue(
        events=tuple(
            CatalogueEvent(
                **{
                    **e,
                    "fields": tuple(CatalogueField(**f) for f in e["fields"]),
                    "receivers": tuple(CatalogueReceiver(**r) for r in e["receivers"]),
                }
            )
            for e in parsed["events"]
        ),
        wildcard_receivers=tuple(CatalogueReceiver(**r) for r in parsed["wildcard_receivers"]),
        schedules=tuple(CatalogueSchedule(**r) for r in parsed["schedules"]),
    )
    assert rebuilt == cat
    assert list(parsed) == ["events", "schedules", "wildcard_receivers"]
    assert list(parsed["events"][0]) == sorted(parsed["events"][0])
    assert text.startswith('{\n  "events": [\n')


@pytest.mark.parametrize("fmt", ["markdown", "json"])
def test_output_is_deterministic_and_ends_in_exactly_one_newline(fmt: str) -> None:
    receiver(OrderShipped, key="t.b")(noop)
    receiver(OrderPlaced, key="t.a", due=due_in_a_week)(noop)
    receiver(AnyEvent, key="t.z")(noop)
    receiver(AnyEvent, key="t.y")(noop)

    first = render_catalogue(catalogue(), fmt)
    second = render_catalogue(catalogue(), fmt)

    assert first == second
    assert first.endswith("\n") and not first.endswith("\n\n")
    if fmt == "markdown":
        assert first.startswith("# Event catalogue\n")
        every = section(first, "Every event (AnyEvent)")
        assert every.index("`t.y`") < every.index("`t.z`")


def test_markdown_escapes_table_pipes() -> None:
    text = render_catalogue(catalogue())
    assert "| `when` | `datetime \\| None` | `None` |" in section(text, "testapp.Pinged")


def test_an_empty_registry_still_renders() -> None:
    cat = catalogue(Registry(), schedules=Schedules())
    assert cat == Catalogue(events=(), wildcard_receivers=(), schedules=())
    assert "No events are declared." in render_catalogue(cat)
    assert "Schedules" not in render_catalogue(cat)
    assert json.loads(render_catalogue(cat, "json")) == {
        "events": [],
        "schedules": [],
        "wildcard_receivers": [],
    }


def test_an_unknown_format_is_refused_with_the_accepted_ones() -> None:
    with pytest.raises(ValueError, match=r"format='xml'.*'markdown', 'json'"):
        render_catalogue(catalogue(), format="xml")


# ---------------------------------------------------------------- schedules


def declare_schedules() -> dict[str, object]:
    """Three schedules whose functions must never run in the catalogue."""

    @recurring(cron="0 6 * * MON-FRI", timezone="America/New_York", key="t.weekday")
    def weekday(tick: datetime) -> ReportDue:
        raise AssertionError("the catalogue called a schedule")

    @recurring(
        every=timedelta(minutes=90),
        key="t.often",
        catch_up="all",
        catch_up_limit=10,
        tolerance=timedelta(hours=2),
    )
    def often(tick):  # type: ignore[no-untyped-def] - no annotation: no event known
        raise AssertionError("the catalogue called a schedule")

    @recurring(cron="30 2 * * *", key="t.nightly", catch_up="none")
    def nightly(tick: datetime) -> ReportDue:
        raise AssertionError("the catalogue called a schedule")

    return {"t.weekday": weekday, "t.often": often, "t.nightly": nightly}


def test_schedules_are_listed_by_key_with_when_and_what_they_fire() -> None:
    functions = declare_schedules()
    cat = catalogue()
    assert [s.key for s in cat.schedules] == ["t.nightly", "t.often", "t.weekday"]
    nightly, often, weekday = cat.schedules
    assert weekday == CatalogueSchedule(
        key="t.weekday",
        spec="cron 0 6 * * MON-FRI America/New_York",
        cron="0 6 * * MON-FRI",
        timezone="America/New_York",
        every_seconds=None,
        catch_up="latest",
        catch_up_limit=None,
        tolerance_seconds=None,
        event_name="testapp.ReportDue",
        function=dotted_name(functions["t.weekday"]),
    )
    # No zone declared: Django's TIME_ZONE; catch_up="none": a minute of tolerance.
    assert (nightly.timezone, nightly.catch_up, nightly.tolerance_seconds) == (
        "Europe/Paris",
        "none",
        60,
    )
    assert (often.cron, often.timezone, often.every_seconds) == (None, None, 5400)
    assert (often.catch_up_limit, often.tolerance_seconds, often.event_name) == (10, 7200, None)


def test_schedules_render_in_markdown_and_json() -> None:
    declare_schedules()
    text = render_catalogue(catalogue())
    table = section(text, "Schedules")
    assert "| key | when | catch-up | tolerance | event | function |" in table
    assert (
        "| `t.weekday` | cron `0 6 * * MON-FRI` in America/New_York | latest | no limit "
        "| `testapp.ReportDue` |"
    ) in table
    assert "| `t.often` | every 1h 30m | all (at most 10) | 2h | - |" in table
    assert table.index("`t.nightly`") < table.index("`t.often`") < table.index("`t.weekday`")
    assert "- Fired on a schedule by: `t.nightly`, `t.weekday`" in section(
        text, "testapp.ReportDue"
    )
    data = json.loads(render_catalogue(catalogue(), "json"))
    assert [s["key"] for s in data["schedules"]] == ["t.nightly", "t.often", "t.weekday"]
    assert data["schedules"][1]["every_seconds"] == 5400


# ---------------------------------------------------------------- export_catalogue


def test_export_catalogue_prints_markdown_by_default() -> None:
    out = StringIO()
    call_command("export_catalogue", stdout=out)
    assert out.getvalue() == render_catalogue(catalogue(), "markdown")
    # Loading the command must not rebind the package's ``catalogue`` to the submodule.
    assert django_domain_events.catalogue is catalogue


def test_export_catalogue_writes_a_file_with_output(tmp_path: Path) -> None:
    receiver(OrderPlaced, key="t.later", due=timedelta(hours=48))(noop)
    target = tmp_path / "catalogue.json"
    out = StringIO()

    call_command("export_catalogue", "--format", "json", "--output", str(target), stdout=out)

    assert out.getvalue() == f"Wrote {target}\n"
    written = target.read_bytes().decode("utf-8")
    assert written == render_catalogue(catalogue(), "json")
    assert '"due_seconds": 172800' in written


def test_export_catalogue_refuses_a_bad_format() -> None:
    with pytest.raises(CommandError, match="invalid choice: 'xml'"):
        call_command("export_catalogue", "--format", "xml", stdout=StringIO())
    with pytest.raises(CommandError, match="'xml' is not a catalogue format; use one of"):
        call_command("export_catalogue", format="xml", stdout=StringIO())


def test_export_catalogue_explains_an_unwritable_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "catalogue.md"
    with pytest.raises(CommandError, match="Cannot write the catalogue to .*no-such-dir") as info:
        call_command("export_catalogue", "--output", str(missing), stdout=StringIO())
    assert "existing, writable directory" in str(info.value)
    with pytest.raises(CommandError, match="Cannot write the catalogue"):
        call_command("export_catalogue", "--output", str(tmp_path), stdout=StringIO())
