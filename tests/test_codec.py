"""Unit tests for the payload codec: round trips, every error path, evolution and upgrades.

Annotations here are strings (``from __future__ import annotations``), so every test also
proves that the codec resolves hints rather than reading ``__annotations__`` raw.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Literal, NewType, Optional

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_domain_events.codec import (
    DataclassCodec,
    PayloadCodec,
    PayloadDecodeError,
    PayloadUpgradeFailed,
    UnsupportedPayloadType,
    decode_event,
    get_codec,
)
from django_domain_events.codec import dataclass as dataclass_module
from django_domain_events.codec import setting as codec_setting

IST = timezone(timedelta(hours=5, minutes=30))
OrderId = NewType("OrderId", int)


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Toggle(enum.Enum):
    ON = True
    ONE = 1


class Opaque(enum.Enum):
    THING = object()


@dataclass(frozen=True)
class Everything:
    text: str
    count: int
    ratio: float
    active: bool
    amount: Decimal
    at_aware: datetime
    at_naive: datetime
    day: date
    uid: uuid.UUID
    color: Color
    level: Level
    size: Literal["small", "large"]
    maybe: int | None
    maybe_old_style: Optional[str]  # noqa: UP045 - the typing spelling must work too
    colors: list[Color]
    counts: tuple[int, ...]
    pair: tuple[str, int]
    grid: list[list[int]]
    order_id: OrderId
    nothing: None = None


def everything(**overrides: Any) -> Everything:
    values: dict[str, Any] = {
        "text": "héllo",
        "count": 3,
        "ratio": 0.5,
        "active": True,
        "amount": Decimal("12.30"),
        "at_aware": datetime(2024, 5, 1, 12, 30, 15, 123456, tzinfo=IST),
        "at_naive": datetime(2024, 5, 1, 12, 30),
        "day": date(2024, 2, 29),
        "uid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "color": Color.GREEN,
        "level": Level.HIGH,
        "size": "large",
        "maybe": None,
        "maybe_old_style": "x",
        "colors": [Color.RED, Color.GREEN, Color.RED],
        "counts": (1, 2, 3),
        "pair": ("a", 1),
        "grid": [[1, 2], [], [3]],
        "order_id": OrderId(7),
    }
    values.update(overrides)
    return Everything(**values)


@dataclass(frozen=True)
class Quantity:
    quantity: int


@dataclass(frozen=True)
class Ratio:
    ratio: float


@dataclass(frozen=True)
class Switch:
    on: bool


@dataclass(frozen=True)
class Money:
    amount: Decimal


@dataclass(frozen=True)
class When:
    at: datetime
    day: date


@dataclass(frozen=True)
class Ids:
    ids: list[int]
    pair: tuple[int, int]
    maybe: int | None = None


@dataclass(frozen=True)
class Tagged:
    color: Color
    size: Literal["small", "large"]
    uid: uuid.UUID


@dataclass(frozen=True)
class Literals:
    one: Literal[1, "one", None]
    member: Literal[Color.RED]
    yes: Literal[True]


@dataclass(frozen=True)
class Flagged:
    flag: Toggle


@dataclass(frozen=True)
class Loose:
    extra: object


@dataclass(frozen=True)
class Inner:
    x: int


@dataclass(frozen=True)
class Unsupported:
    fine: int
    mapping: dict[str, int]
    inner: Inner
    tags: set[str]
    anything: Any
    extra: object
    bare: list
    either: int | str
    blob: bytes
    opaque: Opaque


@dataclass(frozen=True)
class Derived:
    base: int
    double: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "double", self.base * 2)


@dataclass(frozen=True)
class ExplodesOnInit:
    x: int

    def __post_init__(self) -> None:
        raise AssertionError("problems() must not build events")


# Evolution: the same event in three shapes.


@dataclass(frozen=True)
class OrderPlacedV1:
    order_id: int
    note: str


@dataclass(frozen=True)
class OrderPlacedV2:
    order_id: int
    currency: str = "EUR"
    lines: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class OrderPlacedV3:
    order_id: int
    customer: str


@pytest.fixture
def codec() -> DataclassCodec:
    return DataclassCodec()


# ---------------------------------------------------------------- round trips


def test_dataclass_codec_is_a_payload_codec(codec: DataclassCodec) -> None:
    assert isinstance(codec, PayloadCodec)


def test_encode_produces_json_safe_values(codec: DataclassCodec) -> None:
    assert codec.encode(everything()) == {
        "text": "héllo",
        "count": 3,
        "ratio": 0.5,
        "active": True,
        "amount": "12.30",
        "at_aware": "2024-05-01T12:30:15.123456+05:30",
        "at_naive": "2024-05-01T12:30:00",
        "day": "2024-02-29",
        "uid": "12345678-1234-5678-1234-567812345678",
        "color": "green",
        "level": 2,
        "size": "large",
        "maybe": None,
        "maybe_old_style": "x",
        "colors": ["red", "green", "red"],
        "counts": [1, 2, 3],
        "pair": ["a", 1],
        "grid": [[1, 2], [], [3]],
        "order_id": 7,
        "nothing": None,
    }


@pytest.mark.parametrize("through_json", [False, True])
def test_round_trip_every_supported_type(codec: DataclassCodec, through_json: bool) -> None:
    original = everything()
    payload = codec.encode(original)
    if through_json:
        payload = json.loads(json.dumps(payload))
    decoded = codec.decode(Everything, payload)
    assert decoded == original
    assert type(decoded.counts) is tuple
    assert type(decoded.pair) is tuple
    assert type(decoded.colors) is list
    assert all(type(c) is Color for c in decoded.colors)
    assert type(decoded.grid[0]) is list
    assert type(decoded.amount) is Decimal and str(decoded.amount) == "12.30"
    assert type(decoded.level) is Level
    assert type(decoded.uid) is uuid.UUID


def test_aware_datetime_keeps_its_offset(codec: DataclassCodec) -> None:
    decoded = codec.decode(Everything, codec.encode(everything()))
    assert decoded.at_aware.utcoffset() == timedelta(hours=5, minutes=30)
    assert decoded.at_aware.microsecond == 123456


def test_naive_datetime_stays_naive(codec: DataclassCodec) -> None:
    decoded = codec.decode(Everything, codec.encode(everything()))
    assert decoded.at_naive.tzinfo is None
    assert decoded.at_naive == datetime(2024, 5, 1, 12, 30)


def test_utc_datetime_round_trips(codec: DataclassCodec) -> None:
    at = datetime(2024, 1, 1, tzinfo=UTC)
    decoded = codec.decode(When, codec.encode(When(at=at, day=date(2024, 1, 1))))
    assert decoded.at == at
    assert decoded.at.utcoffset() == timedelta(0)


def test_optional_round_trips_a_value_and_none(codec: DataclassCodec) -> None:
    for maybe in (None, 0, 5):
        original = everything(maybe=maybe, maybe_old_style=None)
        assert codec.decode(Everything, codec.encode(original)) == original


def test_empty_collections_round_trip(codec: DataclassCodec) -> None:
    original = everything(colors=[], counts=(), grid=[])
    decoded = codec.decode(Everything, codec.encode(original))
    assert decoded == original
    assert decoded.counts == () and type(decoded.counts) is tuple


def test_float_field_accepts_int_and_returns_float(codec: DataclassCodec) -> None:
    assert codec.encode(Ratio(ratio=2)) == {"ratio": 2.0}
    decoded = codec.decode(Ratio, {"ratio": 2})
    assert decoded.ratio == 2.0 and type(decoded.ratio) is float


def test_decimal_keeps_precision_and_special_values(codec: DataclassCodec) -> None:
    for amount in (Decimal("0.1"), Decimal("1E+3"), Decimal("-0.000"), Decimal("NaN")):
        payload = json.loads(json.dumps(codec.encode(Money(amount))))
        assert str(codec.decode(Money, payload).amount) == str(amount)


def test_decimal_decodes_from_an_int(codec: DataclassCodec) -> None:
    assert codec.decode(Money, {"amount": 5}).amount == Decimal(5)


def test_int_enum_member_in_int_field_is_stored_as_plain_int(codec: DataclassCodec) -> None:
    payload = codec.encode(Quantity(quantity=Level.HIGH))
    assert payload == {"quantity": 2} and type(payload["quantity"]) is int


def test_str_enum_member_in_str_field_is_stored_as_its_value(codec: DataclassCodec) -> None:
    class Status(str, enum.Enum):  # noqa: UP042 - str() of this mixin is "Status.OPEN"
        OPEN = "open"

    @dataclass(frozen=True)
    class Ticket:
        status: str

    payload = codec.encode(Ticket(status=Status.OPEN))
    assert payload == {"status": "open"} and type(payload["status"]) is str


def test_literal_values_round_trip(codec: DataclassCodec) -> None:
    for one in (1, "one", None):
        original = Literals(one=one, member=Color.RED, yes=True)
        payload = codec.encode(original)
        assert payload == {"one": one, "member": "red", "yes": True}
        decoded = codec.decode(Literals, payload)
        assert decoded == original
        assert decoded.member is Color.RED


def test_enum_decodes_by_value(codec: DataclassCodec) -> None:
    decoded = codec.decode(
        Tagged, {"color": "red", "size": "small", "uid": "12345678123456781234567812345678"}
    )
    assert decoded.color is Color.RED
    assert decoded.uid == uuid.UUID("12345678-1234-5678-1234-567812345678")


def test_enum_with_bool_and_int_values_keeps_them_apart(codec: DataclassCodec) -> None:
    # Toggle.ONE is an alias of Toggle.ON (True == 1), so only True is stored or accepted.
    assert codec.encode(Flagged(flag=Toggle.ON)) == {"flag": True}
    assert codec.decode(Flagged, {"flag": True}).flag is Toggle.ON
    with pytest.raises(PayloadDecodeError, match=r"Flagged\.flag"):
        codec.decode(Flagged, {"flag": 1})


def test_class_built_without_string_annotations(codec: DataclassCodec) -> None:
    Plain = dataclasses.make_dataclass(
        "Plain", [("amount", Decimal), ("tags", tuple[str, ...])], frozen=True
    )
    original = Plain(amount=Decimal("1.5"), tags=("a", "b"))
    assert codec.decode(Plain, codec.encode(original)) == original


def test_init_false_fields_are_neither_stored_nor_passed_back(codec: DataclassCodec) -> None:
    payload = codec.encode(Derived(base=4))
    assert payload == {"base": 4}
    assert codec.decode(Derived, payload).double == 8


def test_type_hints_are_resolved_once_per_class(
    codec: DataclassCodec, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[type] = []
    real = dataclass_module.get_type_hints

    def counting(cls: type) -> dict[str, Any]:
        calls.append(cls)
        return real(cls)

    monkeypatch.setattr(dataclass_module, "get_type_hints", counting)
    for _ in range(3):
        codec.decode(Quantity, codec.encode(Quantity(quantity=1)))
    codec.problems(Quantity)
    assert calls == [Quantity]


# ---------------------------------------------------------------- encode errors


def test_encode_str_in_int_field_names_field_expected_type_and_value(
    codec: DataclassCodec,
) -> None:
    with pytest.raises(UnsupportedPayloadType) as info:
        codec.encode(Quantity(quantity="three"))  # type: ignore[arg-type]
    message = str(info.value)
    assert "Quantity.quantity" in message
    assert "expected int" in message
    assert "'three'" in message
    assert "str" in message


@pytest.mark.parametrize(
    ("event", "expected", "shown"),
    [
        (Quantity(quantity=True), "expected int", "True (bool)"),
        (Quantity(quantity=1.0), "expected int", "1.0 (float)"),  # type: ignore[arg-type]
        (Switch(on=1), "expected bool", "1 (int)"),  # type: ignore[arg-type]
        (Ratio(ratio=True), "expected float", "True (bool)"),
        (Ratio(ratio="1.5"), "expected float", "'1.5' (str)"),  # type: ignore[arg-type]
        (Money(amount=1.5), "expected Decimal", "1.5 (float)"),  # type: ignore[arg-type]
        (Money(amount=2), "expected Decimal", "2 (int)"),  # type: ignore[arg-type]
    ],
)
def test_encode_rejects_values_of_the_wrong_type(
    codec: DataclassCodec, event: object, expected: str, shown: str
) -> None:
    with pytest.raises(UnsupportedPayloadType) as info:
        codec.encode(event)
    message = str(info.value)
    assert f"{type(event).__qualname__}." in message
    assert expected in message
    assert shown in message


def test_encode_rejects_non_finite_floats(codec: DataclassCodec) -> None:
    for value in (float("nan"), float("inf")):
        with pytest.raises(UnsupportedPayloadType, match=r"Ratio\.ratio.*NaN or infinity"):
            codec.encode(Ratio(ratio=value))


def test_encode_rejects_a_datetime_in_a_date_field(codec: DataclassCodec) -> None:
    at = datetime(2024, 1, 1, 9)
    with pytest.raises(UnsupportedPayloadType, match=r"When\.day: expected date.*datetime"):
        codec.encode(When(at=at, day=at))


def test_encode_rejects_a_date_in_a_datetime_field(codec: DataclassCodec) -> None:
    with pytest.raises(UnsupportedPayloadType, match=r"When\.at: expected datetime.*\(date\)"):
        codec.encode(When(at=date(2024, 1, 1), day=date(2024, 1, 1)))  # type: ignore[arg-type]


def test_encode_none_in_a_required_field(codec: DataclassCodec) -> None:
    with pytest.raises(UnsupportedPayloadType, match=r"Quantity\.quantity: expected int.*None"):
        codec.encode(Quantity(quantity=None))  # type: ignore[arg-type]


def test_encode_optional_mismatch_names_the_optional_type(codec: DataclassCodec) -> None:
    with pytest.raises(UnsupportedPayloadType, match=r"Ids\.maybe: expected int \| None, got 'x'"):
        codec.encode(Ids(ids=[], pair=(1, 2), maybe="x"))  # type: ignore[arg-type]


def test_encode_names_the_bad_item_of_a_list(codec: DataclassCodec) -> None:
    with pytest.raises(UnsupportedPayloadType) as info:
        codec.encode(Ids(ids=[1, "x", 3], pair=(1, 2)))  # type: ignore[list-item]
    message = str(info.value)
    assert "Ids.ids[1]: expected int" in message
    assert "'x'" in message
    assert "list[int]" in message


def test_encode_list_field_refuses_a_tuple_and_tuple_field_a_list(codec: DataclassCodec) -> None:
    with pytest.raises(UnsupportedPayloadType, match=r"Ids\.ids: expected list\[int\]"):
        codec.encode(Ids(ids=(1, 2), pair=(1, 2)))  # type: ignore[arg-type]
    with pytest.raises(UnsupportedPayloadType, match=r"Ids\.pair: expected tuple\[int, int\]"):
        codec.encode(Ids(ids=[1], pair=[1, 2]))  # type: ignore[arg-type]


def test_encode_fixed_tuple_of_the_wrong_length(codec: DataclassCodec) -> None:
    with pytest.raises(UnsupportedPayloadType, match=r"Ids\.pair.*has 3 items, not 2"):
        codec.encode(Ids(ids=[], pair=(1, 2, 3)))  # type: ignore[arg-type]


def test_encode_set_in_list_field_lists_the_supported_types(codec: DataclassCodec) -> None:
    with pytest.raises(UnsupportedPayloadType) as info:
        codec.encode(Ids(ids={1, 2}, pair=(1, 2)))  # type: ignore[arg-type]
    message = str(info.value)
    assert "Ids.ids: expected list[int]" in message
    assert "set is not a supported payload type" in message
    assert "Decimal, datetime" in message


def test_encode_enum_field_wants_a_member(codec: DataclassCodec) -> None:
    uid = uuid.uuid4()
    with pytest.raises(UnsupportedPayloadType) as info:
        codec.encode(Tagged(color="red", size="small", uid=uid))  # type: ignore[arg-type]
    message = str(info.value)
    assert "Tagged.color: expected Color" in message
    assert "'red'" in message
    assert "Color.RED" in message


def test_encode_literal_checks_membership(codec: DataclassCodec) -> None:
    with pytest.raises(UnsupportedPayloadType) as info:
        codec.encode(Tagged(color=Color.RED, size="medium", uid=uuid.uuid4()))  # type: ignore[arg-type]
    message = str(info.value)
    assert "Tagged.size: expected Literal['small', 'large']" in message
    assert "'medium'" in message


@pytest.mark.parametrize(
    ("one", "shown"),
    [(True, "True (bool)"), (1.0, "1.0 (float)"), (Level.LOW, "(Level)"), ("ONE", "'ONE'")],
)
def test_encode_literal_does_not_confuse_equal_values(
    codec: DataclassCodec, one: object, shown: str
) -> None:
    with pytest.raises(UnsupportedPayloadType) as info:
        codec.encode(Literals(one=one, member=Color.RED, yes=True))  # type: ignore[arg-type]
    assert "Literals.one: expected Literal[1, 'one', None]" in str(info.value)
    assert shown in str(info.value)


def test_encode_object_field_holding_a_set(codec: DataclassCodec) -> None:
    with pytest.raises(UnsupportedPayloadType) as info:
        codec.encode(Loose(extra={1, 2}))
    message = str(info.value)
    assert "Loose.extra" in message
    assert "annotation object" in message
    assert "the value is a set" in message
    assert "Supported types: str, int, float, bool, None, Decimal" in message


@pytest.mark.parametrize(
    ("annotation", "value", "described", "hint"),
    [
        (dict[str, int], {"a": 1}, "dict[str, int]", "declare the keys as fields"),
        (Inner, Inner(x=1), "Inner", "nested dataclasses are not supported"),
        (set[str], {"a"}, "set[str]", "use a sorted tuple"),
        (Any, 1, "Any", "annotate the concrete type"),
    ],
)
def test_encode_unsupported_annotations(
    codec: DataclassCodec, annotation: object, value: object, described: str, hint: str
) -> None:
    cls = dataclasses.make_dataclass("Partial", [("fine", int), ("bad", annotation)], frozen=True)
    with pytest.raises(UnsupportedPayloadType) as info:
        codec.encode(cls(fine=1, bad=value))
    message = str(info.value)
    assert "Partial.bad" in message
    assert f"annotation {described}" in message
    assert f"the value is a {type(value).__qualname__}" in message
    assert hint in message
    assert "Supported types:" in message


def test_encode_enum_with_non_json_values(codec: DataclassCodec) -> None:
    @dataclass(frozen=True)
    class HoldsOpaque:
        opaque: Opaque

    message = codec.problems(HoldsOpaque)[0]
    assert "Opaque.THING" in message and "str, int, float, bool or None" in message


def test_encode_refuses_non_dataclasses(codec: DataclassCodec) -> None:
    with pytest.raises(UnsupportedPayloadType, match=r"not \{'a': 1\} \(dict\)"):
        codec.encode({"a": 1})
    with pytest.raises(UnsupportedPayloadType, match="dataclass instances"):
        codec.encode(Quantity)


# ---------------------------------------------------------------- decode errors


@pytest.mark.parametrize(
    ("event_class", "payload", "fragments"),
    [
        (Quantity, {"quantity": "3"}, ["Quantity.quantity", "expected int", "'3' (str)"]),
        (Quantity, {"quantity": True}, ["expected int", "True (bool)", "bool is not accepted"]),
        (Quantity, {"quantity": 3.0}, ["expected int", "3.0 (float)"]),
        (Quantity, {"quantity": None}, ["expected int", "None (NoneType)"]),
        (Switch, {"on": 1}, ["Switch.on", "expected bool", "1 (int)"]),
        (Ratio, {"ratio": False}, ["Ratio.ratio", "expected float", "False (bool)"]),
        (Ratio, {"ratio": "0.5"}, ["expected float", "'0.5' (str)"]),
        (Money, {"amount": "12,30"}, ["Money.amount", "expected Decimal", "'12,30'", "not a dec"]),
        (Money, {"amount": 1.5}, ["expected Decimal", "1.5 (float)", "stored as strings"]),
        (
            When,
            {"at": "yesterday", "day": "2024-01-01"},
            ["When.at", "expected datetime", "'yesterday'", "ISO 8601"],
        ),
        (
            When,
            {"at": "2024-01-01T00:00:00", "day": "2024-01-01T10:00:00"},
            ["When.day", "expected date", "'2024-01-01T10:00:00'"],
        ),
        (When, {"at": 1700000000, "day": "2024-01-01"}, ["When.at", "1700000000 (int)"]),
        (
            Tagged,
            {"color": "blue", "size": "small", "uid": str(uuid.UUID(int=1))},
            ["Tagged.color", "expected Color", "'blue'", "'red', 'green'"],
        ),
        (
            Tagged,
            {"color": "red", "size": "medium", "uid": str(uuid.UUID(int=1))},
            ["Tagged.size", "expected Literal['small', 'large']", "'medium'"],
        ),
        (
            Tagged,
            {"color": "red", "size": "small", "uid": "not-a-uuid"},
            ["Tagged.uid", "expected UUID", "'not-a-uuid'"],
        ),
        (
            Literals,
            {"one": True, "member": "red", "yes": True},
            ["Literals.one", "True (bool)"],
        ),
        (
            Literals,
            {"one": 1, "member": "green", "yes": True},
            ["Literals.member", "expected Literal[Color.RED]", "'green'"],
        ),
        (Ids, {"ids": [1, "2"], "pair": [1, 2]}, ["Ids.ids[1]", "expected int", "'2' (str)"]),
        (Ids, {"ids": "1,2", "pair": [1, 2]}, ["Ids.ids", "expected list[int]", "'1,2'"]),
        (Ids, {"ids": [], "pair": [1]}, ["Ids.pair", "tuple[int, int]", "1 items, not 2"]),
        (Ids, {"ids": [], "pair": [1, 2], "maybe": "x"}, ["Ids.maybe", "int | None", "'x'"]),
        (
            Everything,
            {**DataclassCodec().encode(everything()), "colors": ["red", "purple"]},
            ["Everything.colors[1]", "expected Color", "'purple'"],
        ),
    ],
)
def test_decode_incompatible_stored_values(
    codec: DataclassCodec, event_class: type, payload: dict[str, Any], fragments: list[str]
) -> None:
    with pytest.raises(PayloadDecodeError) as info:
        codec.decode(event_class, payload)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message
    assert "upgrade()" in message


def test_decode_error_truncates_huge_stored_values(codec: DataclassCodec) -> None:
    with pytest.raises(PayloadDecodeError) as info:
        codec.decode(Quantity, {"quantity": "x" * 10_000})
    assert len(str(info.value)) < 500


def test_decode_a_payload_that_is_not_a_dict(codec: DataclassCodec) -> None:
    with pytest.raises(PayloadDecodeError, match=r"Quantity.*\[1, 2\] \(list\), not a dict"):
        codec.decode(Quantity, [1, 2])  # type: ignore[arg-type]


def test_decode_unsupported_class_raises_unsupported(codec: DataclassCodec) -> None:
    with pytest.raises(UnsupportedPayloadType, match=r"Loose\.extra.*annotation object"):
        codec.decode(Loose, {"extra": 1})
    with pytest.raises(UnsupportedPayloadType, match="not a dataclass"):
        codec.decode(dict, {})


# ---------------------------------------------------------------- evolution


def test_added_fields_with_defaults_are_filled(codec: DataclassCodec) -> None:
    old = codec.encode(OrderPlacedV1(order_id=1, note="gift"))
    decoded = codec.decode(OrderPlacedV2, old)
    assert decoded == OrderPlacedV2(order_id=1, currency="EUR", lines=[])


def test_default_factory_gives_each_event_its_own_value(codec: DataclassCodec) -> None:
    first = codec.decode(OrderPlacedV2, {"order_id": 1})
    second = codec.decode(OrderPlacedV2, {"order_id": 2})
    assert first.lines == [] and first.lines is not second.lines


def test_removed_fields_are_ignored(codec: DataclassCodec) -> None:
    payload = {"order_id": 1, "note": "gift", "currency": "USD", "lines": [3]}
    assert codec.decode(OrderPlacedV2, payload) == OrderPlacedV2(1, "USD", [3])


def test_added_field_without_default_is_an_error(codec: DataclassCodec) -> None:
    old = codec.encode(OrderPlacedV1(order_id=1, note="gift"))
    with pytest.raises(PayloadDecodeError) as info:
        codec.decode(OrderPlacedV3, old)
    message = str(info.value)
    assert "OrderPlacedV3.customer" in message
    assert "added field without a default" in message
    assert "upgrade()" in message


def test_decode_errors_are_value_errors_and_encode_errors_type_errors() -> None:
    assert issubclass(PayloadDecodeError, ValueError)
    assert issubclass(UnsupportedPayloadType, TypeError)


# ---------------------------------------------------------------- upgrades


def test_upgrade_converts_an_old_payload(codec: DataclassCodec) -> None:
    seen: list[tuple[dict[str, Any], int]] = []

    def upgrade(payload: dict[str, Any], from_version: int) -> dict[str, Any]:
        seen.append((dict(payload), from_version))
        payload["customer"] = payload.pop("note").upper()
        return payload

    stored = {"order_id": 1, "note": "ada"}
    decoded = decode_event(
        codec, OrderPlacedV3, stored, stored_version=1, current_version=3, upgrade=upgrade
    )
    assert decoded == OrderPlacedV3(order_id=1, customer="ADA")
    assert seen == [({"order_id": 1, "note": "ada"}, 1)]
    assert stored == {"order_id": 1, "note": "ada"}, "the stored payload must not be mutated"


def test_upgrade_is_skipped_for_current_payloads(codec: DataclassCodec) -> None:
    stored_version = 3

    def upgrade(payload: dict[str, Any], from_version: int) -> dict[str, Any]:
        raise AssertionError("not an old payload")

    decoded = decode_event(
        codec,
        OrderPlacedV3,
        {"order_id": 1, "customer": "ada"},
        stored_version=stored_version,
        current_version=3,
        upgrade=upgrade,
    )
    assert decoded == OrderPlacedV3(order_id=1, customer="ada")


@pytest.mark.parametrize("upgrade", [None, lambda payload, from_version: payload])
def test_a_payload_newer_than_the_code_is_refused(codec: DataclassCodec, upgrade: Any) -> None:
    with pytest.raises(PayloadDecodeError) as info:
        decode_event(
            codec,
            OrderPlacedV3,
            {"order_id": 1, "customer": "ada"},
            stored_version=99,
            current_version=3,
            upgrade=upgrade,
        )
    message = str(info.value)
    assert "OrderPlacedV3" in message and "version 99" in message and "version 3" in message
    assert "deploy the code" in message.lower()


def test_without_upgrade_old_payloads_follow_the_evolution_rules(codec: DataclassCodec) -> None:
    decoded = decode_event(
        codec,
        OrderPlacedV2,
        {"order_id": 1, "note": "x"},
        stored_version=1,
        current_version=2,
        upgrade=None,
    )
    assert decoded == OrderPlacedV2(order_id=1)


def test_upgrade_that_raises(codec: DataclassCodec) -> None:
    def upgrade(payload: dict[str, Any], from_version: int) -> dict[str, Any]:
        return {"customer": payload["customer_name"]}

    with pytest.raises(PayloadUpgradeFailed) as info:
        decode_event(
            codec,
            OrderPlacedV3,
            {"order_id": 1},
            stored_version=2,
            current_version=3,
            upgrade=upgrade,
        )
    message = str(info.value)
    assert "OrderPlacedV3.upgrade" in message
    assert "from_version=2" in message
    assert "KeyError" in message and "customer_name" in message
    assert isinstance(info.value.__cause__, KeyError)


def test_upgrade_that_returns_a_non_dict(codec: DataclassCodec) -> None:
    def upgrade(payload: dict[str, Any], from_version: int) -> Any:
        payload["customer"] = "ada"  # forgot to return it

    with pytest.raises(PayloadUpgradeFailed) as info:
        decode_event(
            codec,
            OrderPlacedV3,
            {"order_id": 1},
            stored_version=1,
            current_version=2,
            upgrade=upgrade,
        )
    message = str(info.value)
    assert "OrderPlacedV3.upgrade" in message
    assert "from_version=1" in message
    assert "None (NoneType), not a dict" in message


def test_upgrade_result_is_still_checked_by_the_codec(codec: DataclassCodec) -> None:
    def upgrade(payload: dict[str, Any], from_version: int) -> dict[str, Any]:
        return {**payload, "customer": 42}

    with pytest.raises(PayloadDecodeError, match=r"OrderPlacedV3\.customer: expected str"):
        decode_event(
            codec,
            OrderPlacedV3,
            {"order_id": 1},
            stored_version=1,
            current_version=2,
            upgrade=upgrade,
        )


# ---------------------------------------------------------------- problems()


def test_problems_is_empty_for_supported_classes(codec: DataclassCodec) -> None:
    for cls in (Everything, Ids, Tagged, Literals, Flagged, Derived, OrderPlacedV2):
        assert codec.problems(cls) == [], cls


def test_problems_does_not_build_the_event(codec: DataclassCodec) -> None:
    assert codec.problems(ExplodesOnInit) == []


def test_problems_names_every_unsupported_field(codec: DataclassCodec) -> None:
    found = codec.problems(Unsupported)
    expected = {
        "mapping": "dict[str, int]",
        "inner": "Inner",
        "tags": "set[str]",
        "anything": "Any",
        "extra": "object",
        "bare": "list",
        "either": "int | str",
        "blob": "bytes",
        "opaque": "Opaque",
    }
    assert len(found) == len(expected)
    for sentence, (name, annotation) in zip(found, expected.items(), strict=True):
        assert sentence.startswith(f"Unsupported.{name} is annotated {annotation}, "), sentence
        assert "DataclassCodec cannot store" in sentence
        assert sentence.endswith(".")
    assert not any("Unsupported.fine" in s for s in found)


@pytest.mark.parametrize(
    ("annotation", "hint"),
    [
        (list[dict[str, int]], "dicts are not supported"),
        (tuple[int, ...] | int, "only `X | None` unions"),
        (tuple, "give the item types"),
        (Literal[b"x"], "Literal value b'x'"),
        (Literal[1.5], "Literal value 1.5"),
        (Literal[Color.RED, "red"], "store 'red' twice"),
        (frozenset[int], "sets are not supported"),
    ],
)
def test_problems_hints(codec: DataclassCodec, annotation: object, hint: str) -> None:
    cls = dataclasses.make_dataclass("Odd", [("value", annotation)], frozen=True)
    [sentence] = codec.problems(cls)
    assert sentence.startswith("Odd.value is annotated ")
    assert hint in sentence


def test_problems_for_a_django_model_field(codec: DataclassCodec) -> None:
    from django.contrib.contenttypes.models import ContentType

    cls = dataclasses.make_dataclass("Linked", [("ct", ContentType)], frozen=True)
    [sentence] = codec.problems(cls)
    assert "primary key" in sentence


def test_problems_for_a_non_dataclass(codec: DataclassCodec) -> None:
    class NotAnEvent:
        x: int

    [sentence] = codec.problems(NotAnEvent)
    assert "NotAnEvent is not a dataclass" in sentence


def test_problems_for_unresolvable_hints(codec: DataclassCodec) -> None:
    cls = dataclasses.make_dataclass("Forward", [("x", "NoSuchName")], frozen=True)
    [sentence] = codec.problems(cls)
    assert "Forward cannot be resolved" in sentence
    assert "NameError" in sentence and "NoSuchName" in sentence
    with pytest.raises(UnsupportedPayloadType, match="cannot be resolved"):
        codec.encode(cls(x=1))


# ---------------------------------------------------------------- get_codec()


class UpperCodec:
    """A custom codec: shouts on the way in, whispers on the way out."""

    def encode(self, evt: Any) -> dict[str, Any]:
        return {k: v.upper() for k, v in dataclasses.asdict(evt).items()}

    def decode(self, event_class: type, payload: dict[str, Any]) -> Any:
        return event_class(**{k: v.lower() for k, v in payload.items()})

    def problems(self, event_class: type) -> list[str]:
        return []


class NotACodec:
    def encode(self, evt: object) -> dict[str, Any]:
        return {}


class NeedsArguments:
    def __init__(self, key: str) -> None:
        self.key = key


@dataclass(frozen=True)
class Greeting:
    text: str


@pytest.fixture(autouse=True)
def fresh_codec_cache() -> Iterator[None]:
    codec_setting._codec = None
    yield
    codec_setting._codec = None


def test_get_codec_defaults_to_the_dataclass_codec() -> None:
    with override_settings(DJANGO_DOMAIN_EVENTS={}):
        codec = get_codec()
        assert type(codec) is DataclassCodec
        assert get_codec() is codec, "instantiated once"


def test_get_codec_honours_the_codec_setting() -> None:
    with override_settings(DJANGO_DOMAIN_EVENTS={"CODEC": "tests.test_codec.UpperCodec"}):
        codec = get_codec()
        assert type(codec).__qualname__ == "UpperCodec"
        assert isinstance(codec, PayloadCodec)
        assert codec.encode(Greeting("hi")) == {"text": "HI"}
        assert codec.decode(Greeting, {"text": "HI"}) == Greeting("hi")
        assert get_codec() is codec
    # Leaving override_settings fires setting_changed, which drops the cached instance.
    with override_settings(DJANGO_DOMAIN_EVENTS={}):
        assert type(get_codec()) is DataclassCodec


def test_get_codec_cache_is_reset_when_the_setting_changes() -> None:
    with override_settings(DJANGO_DOMAIN_EVENTS={}):
        before = get_codec()
        with override_settings(DJANGO_DOMAIN_EVENTS={"CODEC": "tests.test_codec.UpperCodec"}):
            assert get_codec() is not before
        assert get_codec() is not before
        assert type(get_codec()) is DataclassCodec


def test_get_codec_ignores_other_setting_changes() -> None:
    with override_settings(DJANGO_DOMAIN_EVENTS={}):
        codec = get_codec()
        with override_settings(USE_I18N=False):
            assert get_codec() is codec


@pytest.mark.parametrize(
    ("path", "fragments"),
    [
        ("tests.no_such_module.Codec", ["'tests.no_such_module.Codec'", "cannot be imported"]),
        ("tests.test_codec.NoSuchCodec", ["'tests.test_codec.NoSuchCodec'", "cannot be imported"]),
        ("tests.test_codec.NotACodec", ["'tests.test_codec.NotACodec'", "no decode() method"]),
        ("tests.test_codec.NeedsArguments", ["NeedsArguments'", "with no arguments"]),
    ],
)
def test_get_codec_with_a_bad_path(path: str, fragments: list[str]) -> None:
    with override_settings(DJANGO_DOMAIN_EVENTS={"CODEC": path}):
        with pytest.raises(ImproperlyConfigured) as info:
            get_codec()
        message = str(info.value)
        assert "DJANGO_DOMAIN_EVENTS['CODEC']" in message
        for fragment in fragments:
            assert fragment in message
