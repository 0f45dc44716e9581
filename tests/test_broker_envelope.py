"""The CloudEvents envelope and each transport's headers, both directions (no broker)."""

from datetime import UTC, datetime, timedelta, timezone

import pytest

from django_domain_events.contrib.brokers import envelope
from django_domain_events.contrib.brokers.envelope import Envelope, EnvelopeError


def sample(**extensions) -> Envelope:
    return envelope.build(
        id="41-7",
        source="shop",
        type="orders.OrderPlaced",
        data=b'{"order_id":7}',
        time=datetime(2026, 12, 3, 17, 5, 9, 120000, tzinfo=timezone(timedelta(hours=1))),
        payloadversion=2,
        correlationid="c0ffee",
        causationid=None,
        traceparent="",
        partitionkey="customer-9",
        **extensions,
    )


def test_build_sets_the_required_attributes_and_omits_the_absent_ones():
    env = sample()
    assert env.attributes == {
        "specversion": "1.0",
        "id": "41-7",
        "source": "shop",
        "type": "orders.OrderPlaced",
        "time": "2026-12-03T16:05:09.120000Z",
        "datacontenttype": "application/json",
        "payloadversion": "2",
        "correlationid": "c0ffee",
        "partitionkey": "customer-9",
    }
    assert env.payload() == {"order_id": 7}


def test_expirytime_is_rfc3339_in_utc():
    env = sample(expirytime=datetime(2026, 12, 4, 0, 0, tzinfo=UTC))
    assert env.get("expirytime") == "2026-12-04T00:00:00.000000Z"


def test_an_unknown_extension_is_refused():
    with pytest.raises(EnvelopeError, match="'colour' is not an attribute"):
        envelope.build(id="1", source="s", type="t", data=b"{}", colour="red")


def test_a_message_without_the_required_attributes_is_refused_naming_them():
    with pytest.raises(EnvelopeError, match="lacks id, type"):
        envelope.from_nats({"ce-specversion": "1.0", "ce-source": "s"}, b"{}")


def test_amqp_round_trip():
    env = sample(tracestate="k=v")
    message = envelope.to_amqp(env)
    assert message.content_type == "application/json"
    assert message.message_id == "41-7"
    assert message.headers["cloudEvents_type"] == "orders.OrderPlaced"
    assert message.headers["cloudEvents_payloadversion"] == "2"
    assert "cloudEvents_datacontenttype" not in message.headers
    assert all(isinstance(v, str) for v in message.headers.values())
    back = envelope.from_amqp(
        message.headers,
        message.body,
        content_type=message.content_type,
        message_id=message.message_id,
    )
    assert back == env


def test_amqp_reader_accepts_the_colon_prefix_bytes_and_message_id():
    headers = {
        "cloudEvents:specversion": b"1.0",
        "cloudEvents:source": "other",
        "cloudEvents:type": "x.Y",
        "unrelated": "ignored",
    }
    env = envelope.from_amqp(headers, b"{}", content_type="application/json", message_id="m1")
    assert env.id == "m1"
    assert env.source == "other"
    assert env.type == "x.Y"
    assert "unrelated" not in env.attributes


def test_nats_round_trip_and_msg_id():
    env = sample()
    headers = envelope.to_nats(env)
    assert headers["Nats-Msg-Id"] == "41-7"
    assert headers["ce-id"] == "41-7"
    assert headers["content-type"] == "application/json"
    assert "ce-datacontenttype" not in headers
    assert envelope.from_nats(headers, env.data) == env


def test_redis_round_trip_with_bytes_as_redis_returns_them():
    env = sample()
    fields = envelope.to_redis(env)
    assert fields["data"] == b'{"order_id":7}'
    assert fields["ce-type"] == "orders.OrderPlaced"
    assert fields["content-type"] == "application/json"
    as_read = {k.encode(): v if isinstance(v, bytes) else v.encode() for k, v in fields.items()}
    assert envelope.from_redis(as_read) == env


def test_a_consumers_attributes_are_the_envelopes_and_none_without_a_required_one():
    headers = envelope.to_nats(sample())
    assert envelope.attributes_of(headers) == dict(envelope.from_nats(headers, b"{}").attributes)
    shouted = {k.upper(): v for k, v in headers.items()}  # header names match in any case
    assert envelope.attributes_of(shouted) == envelope.attributes_of(headers)
    for required in ("ce-specversion", "ce-id", "ce-source", "ce-type"):
        partial = {k: v for k, v in headers.items() if k != required}
        with pytest.raises(EnvelopeError):
            envelope.from_nats(partial, b"{}")
        assert envelope.attributes_of(partial) == {}  # no CloudEvent: kept dead as such
