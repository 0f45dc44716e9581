"""Declarations: what @event and @receiver accept, refuse, and how the registry answers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pytest

from django_domain_events import (
    DURABLE,
    INLINE,
    ON_COMMIT,
    AnyEvent,
    Constant,
    Exponential,
    Retention,
    event,
    receiver,
    registry,
)
from django_domain_events.declare import RegisteredReceiver
from tests.app.events import OrderPlaced, Pinged


def noop(evt: object) -> None:
    pass


def test_event_defaults_its_name_to_app_label_and_class() -> None:
    registered = registry.event_for_class(OrderPlaced)
    assert registered is not None
    assert (registered.name, registered.version, registered.retention) == (
        "testapp.OrderPlaced",
        1,
        None,
    )
    assert registry.event_named("testapp.OrderPlaced") is registered


def test_event_refuses_a_class_that_is_not_a_frozen_dataclass() -> None:
    with pytest.raises(TypeError, match="is not frozen"):

        @event
        @dataclass
        class Mutable:
            n: int

    with pytest.raises(TypeError, match="is not a dataclass"):

        @event
        class Plain:
            pass


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"name": "x" * 256}, "at most 255"),
        ({"name": ""}, "non-empty"),
        ({"version": 0}, "int >= 1"),
        ({"version": True}, "int >= 1"),
        ({"retention": timedelta(seconds=-1)}, "positive timedelta"),
        ({"retention": timedelta(seconds=1.5)}, "whole seconds"),
        ({"retention": 30}, "takes None, a timedelta"),
    ],
)
def test_event_refuses_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):

        @event(**kwargs)
        @dataclass(frozen=True)
        class Bad:
            n: int = 0


def test_event_refuses_a_plain_upgrade_method() -> None:
    with pytest.raises(TypeError, match="@staticmethod or @classmethod"):

        @event(name="t.PlainUpgrade")
        @dataclass(frozen=True)
        class PlainUpgrade:
            n: int = 0

            def upgrade(self, payload: dict, from_version: int) -> dict:
                return payload


def test_two_classes_cannot_share_an_event_name() -> None:
    with pytest.raises(ValueError, match="already declared"):

        @event(name="testapp.OrderPlaced")
        @dataclass(frozen=True)
        class Impostor:
            n: int = 0


def test_event_accepts_retention_policies() -> None:
    @event(name="t.Kept", retention=Retention.SUCCEEDED)
    @dataclass(frozen=True)
    class Kept:
        n: int = 0

    @event(name="t.Week", retention=timedelta(days=7))
    @dataclass(frozen=True)
    class Week:
        n: int = 0

    assert registry.event_named("t.Kept").retention is Retention.SUCCEEDED  # type: ignore[union-attr]
    assert registry.event_named("t.Week").retention == timedelta(days=7)  # type: ignore[union-attr]


def test_receiver_defaults() -> None:
    @receiver(OrderPlaced)
    def send_receipt(evt: OrderPlaced) -> None:
        pass

    declared = registry.receiver("tests.send_receipt")
    assert isinstance(declared, RegisteredReceiver)
    assert declared.func is send_receipt
    assert (declared.mode, declared.max_attempts, declared.site, declared.lane) == (
        DURABLE,
        5,
        "relay",
        "default",
    )
    assert not declared.eager and not declared.takes_context and declared.due is None


def test_receiver_key_too_long_or_duplicated_is_refused() -> None:
    with pytest.raises(ValueError, match="Choose a shorter key"):
        receiver(OrderPlaced, key="k" * 256)(noop)
    receiver(OrderPlaced, key="t.taken")(noop)

    def other(evt: object) -> None:
        pass

    with pytest.raises(ValueError, match="already taken"):
        receiver(OrderPlaced, key="t.taken")(other)


def test_receiver_needs_an_event_class() -> None:
    class NotAnEvent:
        pass

    with pytest.raises(TypeError, match="decorate the class with @event first"):
        receiver(NotAnEvent)(noop)


@pytest.mark.parametrize(
    "mode, argument",
    [
        (INLINE, {"max_attempts": 3}),
        (INLINE, {"eager": True}),
        (ON_COMMIT, {"site": "task"}),
        (ON_COMMIT, {"lease_seconds": 10}),
        (INLINE, {"targets": lambda evt, ctx: []}),
        (INLINE, {"backoff_base_seconds": 1}),
        (INLINE, {"retry": Constant(1)}),
        (ON_COMMIT, {"lane": "mail"}),
        (INLINE, {"give_up_after": timedelta(hours=1)}),
        (ON_COMMIT, {"due": timedelta(hours=1)}),
        (INLINE, {"ttl": timedelta(hours=1)}),
    ],
)
def test_row_arguments_are_refused_without_a_row(mode: object, argument: dict) -> None:
    (name,) = argument
    with pytest.raises(ValueError, match=rf"{name}=.*writes none"):
        receiver(OrderPlaced, key="t.x", mode=mode, **argument)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_attempts": 0}, "int >= 1 or None"),
        ({"max_attempts": None}, "bound it with ttl= or give_up_after="),
        ({"site": "celery"}, "'relay' or 'task'"),
        ({"lease_seconds": 0}, "positive number of seconds"),
        ({"backoff_base_seconds": 10, "backoff_cap_seconds": 5}, "cap must be at least"),
        ({"backoff_base_seconds": 1, "retry": Constant(1)}, "use retry=Exponential"),
        ({"retry": "fast"}, "delay\\(attempt, error\\)"),
        ({"lane": ""}, "non-empty string"),
        ({"give_up_after": timedelta(0)}, "positive timedelta"),
        ({"give_up_after": 60}, "must be a timedelta"),
        ({"ttl": timedelta(seconds=-5)}, "positive timedelta"),
        ({"eager": "yes"}, "True or False"),
    ],
)
def test_bad_row_arguments_are_refused_naming_the_argument(kwargs: dict, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        receiver(OrderPlaced, key="t.x", **kwargs)


def test_async_targets_are_refused() -> None:
    async def targets(evt: object, ctx: object) -> list[str]:
        return []

    with pytest.raises(TypeError, match="not an async def"):
        receiver(OrderPlaced, key="t.x", targets=targets)


def test_unbounded_attempts_are_accepted_with_a_bound() -> None:
    receiver(OrderPlaced, key="t.ttl", max_attempts=None, ttl=timedelta(days=1))(noop)
    assert registry.receiver("t.ttl").max_attempts is None  # type: ignore[union-attr]


def test_takes_context_must_match_the_signature() -> None:
    def one(evt: object) -> None:
        pass

    def two(evt: object, ctx: object) -> None:
        pass

    with pytest.raises(TypeError, match="add the ctx parameter"):
        receiver(OrderPlaced, key="t.a", takes_context=True)(one)
    with pytest.raises(TypeError, match="declare takes_context=True"):
        receiver(OrderPlaced, key="t.b")(two)
    receiver(OrderPlaced, key="t.c", takes_context=True)(two)


def test_retry_policies_validate_themselves() -> None:
    with pytest.raises(ValueError, match="cap must be at least the base"):
        Exponential(10, 5)
    with pytest.raises(ValueError, match="positive number"):
        Constant(0)
    assert Constant(2).delay(3, ValueError()) == 2.0


def test_what_listens_and_lanes_come_from_the_registry() -> None:
    receiver(OrderPlaced, key="t.b")(noop)
    receiver(OrderPlaced, key="t.a", lane="mail")(noop)
    receiver(AnyEvent, key="t.all")(noop)
    keys = [r.key for r in registry.receivers_for(OrderPlaced)]
    assert keys == ["t.a", "t.all", "t.b"]
    assert [r.key for r in registry.receivers_for(Pinged)] == ["t.all"]
    lanes = registry.lanes()
    assert lanes["mail"] == ("t.a",)
    assert "t.b" in lanes["default"]


def test_redeclaring_the_same_function_replaces_it() -> None:
    receiver(OrderPlaced, key="t.same", max_attempts=2)(noop)
    receiver(OrderPlaced, key="t.same", max_attempts=7)(noop)
    assert registry.receiver("t.same").max_attempts == 7  # type: ignore[union-attr]


def test_what_listens_to_and_listens_for() -> None:
    from django_domain_events import listens_for, what_listens_to

    receiver(OrderPlaced, key="t.z")(noop)
    receiver(OrderPlaced, key="t.y")(noop)
    receiver(AnyEvent, key="t.every")(noop)
    assert [r.key for r in what_listens_to(OrderPlaced)] == ["t.y", "t.z"]
    assert [r.key for r in what_listens_to(AnyEvent)] == ["t.every"]
    assert listens_for("t.y") is registry.event_for_class(OrderPlaced)
    assert listens_for("t.every") is None
    assert listens_for("t.unknown") is None


def test_a_copy_pasted_receiver_for_another_event_cannot_take_the_key() -> None:
    @receiver(OrderPlaced)
    def notify_doctor(evt: object) -> None:
        pass

    first = notify_doctor
    with pytest.raises(ValueError) as refused:

        @receiver(Pinged)
        def notify_doctor(evt: object) -> None:  # noqa: F811 - the copy-paste under test
            pass

    message = str(refused.value)
    assert "'tests.notify_doctor'" in message
    assert "OrderPlaced" in message and "Pinged" in message
    assert "key=" in message
    assert registry.receiver("tests.notify_doctor").func is first  # type: ignore[union-attr]


def test_the_same_function_cannot_be_declared_again_for_another_event() -> None:
    receiver(OrderPlaced, key="t.twice")(noop)
    with pytest.raises(ValueError, match="already taken"):
        receiver(Pinged, key="t.twice")(noop)
    assert registry.receiver("t.twice").event_class is OrderPlaced  # type: ignore[union-attr]


def test_a_module_imported_again_declares_its_receiver_again(tmp_path, monkeypatch) -> None:
    import importlib
    import sys

    (tmp_path / "reimported_events.py").write_text(
        "from dataclasses import dataclass\n"
        "from django_domain_events import event, receiver\n\n"
        "@event(name='t.Reimported')\n"
        "@dataclass(frozen=True)\n"
        "class Reimported:\n"
        "    n: int = 0\n\n"
        "@receiver(Reimported, key='t.reimported')\n"
        "def on_reimported(evt):\n"
        "    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        first = importlib.import_module("reimported_events")
        del sys.modules["reimported_events"]
        second = importlib.import_module("reimported_events")
        assert second.Reimported is not first.Reimported
        declared = registry.receiver("t.reimported")
        assert declared is not None and declared.func is second.on_reimported
        assert declared.accepts("t.Reimported")
    finally:
        sys.modules.pop("reimported_events", None)
        registered = registry._events_by_name.pop("t.Reimported", None)
        if registered is not None:
            registry._events_by_class.pop(registered.event_class, None)


def test_a_receiver_accepts_rows_of_its_own_event_only() -> None:
    receiver(OrderPlaced, key="t.own")(noop)
    receiver(AnyEvent, key="t.every")(noop)
    own, every = registry.receiver("t.own"), registry.receiver("t.every")
    assert own is not None and every is not None
    assert own.accepts("testapp.OrderPlaced")
    assert not own.accepts("testapp.Pinged")
    assert own.accepts("gone.Undeclared")  # such a row dies undecoded instead
    assert every.accepts("testapp.OrderPlaced") and every.accepts("anything.Else")
