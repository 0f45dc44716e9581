"""The BROKERS setting, publish() declarations and their checks (no broker needed)."""

import importlib.util
import re

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_domain_events import registry
from django_domain_events.contrib.brokers import config, publish
from django_domain_events.declare import AnyEvent
from tests.app.events import OrderPlaced


def brokers(**entries):
    return override_settings(DJANGO_DOMAIN_EVENTS={"BROKERS": entries})


def test_the_url_scheme_picks_the_transport_and_other_keys_are_options():
    with brokers(
        default={"URL": "amqp://guest:guest@127.0.0.1:5672/%2F"},
        js={"URL": "nats://127.0.0.1:4222", "DUPLICATE_WINDOW_SECONDS": 60},
        streams={"URL": "redis://127.0.0.1:6379/0", "MAXLEN": 1000},
    ):
        configs = config.brokers()
    assert {name: c.transport for name, c in configs.items()} == {
        "default": "rabbitmq",
        "js": "nats",
        "streams": "redis",
    }
    assert configs["js"].options["DUPLICATE_WINDOW_SECONDS"] == 60
    assert configs["streams"].options["MAXLEN"] == 1000
    assert configs["default"].confirm_timeout == 10.0
    assert configs["default"].safe_url == "amqp://guest:***@127.0.0.1:5672/%2F"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"URL": "kafka://host"}, "the scheme 'kafka://' names no transport; use one of amqp://"),
        ({"URL": "amqp://host:port/"}, "is not a valid URL"),
        ({"URL": "nats://"}, "has no host"),
        ({"url": "amqp://host/"}, "must be a dict with a 'URL' string"),
        ({"URL": "amqp://h/", "MAXLEN": 5}, "'MAXLEN'] is not an option of rabbitmq brokers"),
        ({"URL": "redis://h/", "MAXLEN": 0}, "must be None or a whole number >= 1"),
        ({"URL": "amqp://h/", "CONFIRM_TIMEOUT_SECONDS": -1}, "must be a positive number"),
    ],
)
def test_problems_name_the_broker_the_bad_value_and_the_fix(entry, message):
    found = config.problems({"b": entry}, installed=False)
    assert len(found) == 1
    assert "['BROKERS']['b']" in found[0]
    assert message in found[0]
    with brokers(b=entry), pytest.raises(ImproperlyConfigured, match="'b'"):
        config.brokers()


def test_a_missing_client_library_is_named_with_its_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "nats" else real(name, *a)
    )
    found = config.problems({"js": {"URL": "nats://127.0.0.1:4222"}})
    assert found == [
        "DJANGO_DOMAIN_EVENTS['BROKERS']['js'] is a nats broker, and its client library (nats) "
        "is not installed: pip install 'django-domain-outbox[nats]'."
    ]


def test_an_unknown_broker_name_lists_the_configured_ones():
    with (
        brokers(default={"URL": "redis://127.0.0.1/"}),
        pytest.raises(
            ImproperlyConfigured, match=r"no broker named 'other'.*configured: 'default'"
        ),
    ):
        config.broker("other")


@pytest.mark.parametrize(
    ("transport", "to", "fine"),
    [
        ("rabbitmq", "orders", True),
        ("rabbitmq", "amq.topic", False),
        ("rabbitmq", "has space", False),
        ("nats", "orders.eu", True),
        ("nats", "orders.*", False),
        ("nats", "orders.", False),
        ("redis", "any thing:goes", True),
        ("redis", "", False),
    ],
)
def test_destination_names(transport, to, fine):
    assert (config.destination_problem(transport, to) == "") is fine


def test_nats_stream_names_replace_what_nats_forbids():
    assert config.nats_stream_name("orders.eu") == "orders_eu"
    assert config.nats_stream_name("a/b\\c d") == "a_b_c_d"


def test_event_source_defaults_to_the_settings_package_and_can_be_set():
    assert config.event_source() == "tests"
    with override_settings(DJANGO_DOMAIN_EVENTS={"EVENT_SOURCE": "shop"}):
        assert config.event_source() == "shop"
    with (
        override_settings(DJANGO_DOMAIN_EVENTS={"EVENT_SOURCE": ""}),
        pytest.raises(ImproperlyConfigured, match="EVENT_SOURCE"),
    ):
        config.event_source()


# publish() declarations ------------------------------------------------------


FOUR = {
    "default": {"URL": "amqp://guest:guest@127.0.0.1:5672/%2F"},
    "js": {"URL": "nats://127.0.0.1:4222"},
}


def test_publish_declares_a_durable_receiver_with_a_stable_key_and_the_options():
    with brokers(**FOUR):
        publish(OrderPlaced, to="orders", lane="brokers", max_attempts=9)
        publish(AnyEvent, to="audit.all", broker="js")
    declared = registry.receiver("brokers:default:orders:testapp.OrderPlaced")
    assert declared is not None
    assert (declared.durable, declared.lane, declared.max_attempts) == (True, "brokers", 9)
    assert registry.receiver("brokers:js:audit.all") is not None


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"to": "x", "broker": "nope"}, ImproperlyConfigured, "no broker named 'nope'"),
        ({"to": "amq.direct"}, ValueError, "not starting with 'amq.'"),
        ({"to": "a.>", "broker": "js"}, ValueError, "not a NATS subject prefix"),
        ({"to": "x", "key": "order_id"}, TypeError, "key=) must be a function of the event"),
        ({"to": "x", "ack": "batch"}, TypeError, "publish() decides ack= itself"),
        ({"to": "x", "max_attempts": 0}, ValueError, "max_attempts=) must be an int >= 1"),
    ],
)
def test_a_misconfigured_publish_is_refused_at_declaration(kwargs, error, message):
    with brokers(**FOUR), pytest.raises(error, match=re.escape(message)):
        publish(OrderPlaced, **kwargs)


def test_manage_py_check_reports_unusable_brokers_without_connecting():
    from django.core import checks

    entries = {
        "ok": {"URL": "redis://127.0.0.1:1/"},  # nothing listens there: never connected
        "bad": {"URL": "mqtt://host/"},
    }
    with brokers(**entries):
        found = [m for m in checks.run_checks(databases=[]) if m.id == "django_domain_events.E020"]
    assert [m.msg for m in found] == [
        "DJANGO_DOMAIN_EVENTS['BROKERS']['bad']['URL'] = 'mqtt://host/': the scheme "
        "'mqtt://' names no transport; use one of amqp://, amqps://, nats://, tls://, "
        "redis://, rediss://."
    ]


def test_manage_py_check_warns_of_broker_timeouts_that_outlast_the_lease():
    """W008: a relay may wait on a broker longer than its claims by row lock may idle
    (``LEASE_SECONDS``): the warning names the broker and the figures; the defaults
    (300 s against 2 + 10 + 5 s) raise none."""
    from django.core import checks

    def warned(**extra):
        entries = {
            "slow": {"URL": "nats://127.0.0.1:1", "CONFIRM_TIMEOUT_SECONDS": 60},
            "quick": {"URL": "redis://127.0.0.1:1/"},
        }
        with override_settings(DJANGO_DOMAIN_EVENTS={"BROKERS": entries, **extra}):
            return [m for m in checks.run_checks(databases=[]) if m.id.endswith("W008")]

    assert warned() == []
    (warning,) = warned(LEASE_SECONDS=120)
    assert warning.msg.startswith("Broker 'slow' may keep a relay waiting 67s for one batch")
    assert "LEASE_SECONDS = 120" in warning.msg
    assert warning.hint == "Raise LEASE_SECONDS, or lower the broker's timeouts."


#: Each option that moves a broker's client into a child process, and whose client.
CLIENT_PROCESS_OPTIONS = [("CONSUMER_PROCESS", "consumer"), ("PUBLISHER_PROCESS", "publisher")]


@pytest.mark.parametrize(("option", "client"), CLIENT_PROCESS_OPTIONS)
@pytest.mark.parametrize(
    ("url", "value", "message"),
    [
        ("nats://h", "yes", "['{option}'] must be True or False, not 'yes'"),
        ("redis://h", 1, "['{option}'] must be True or False, not 1"),
        (
            "amqp://h/",
            True,
            "= True: {option} is an option of nats and redis brokers only "
            "(rabbitmq {client}s keep up in the process); remove it.",
        ),
    ],
)
def test_a_client_process_option_is_a_bool_of_nats_and_redis_brokers(
    option, client, url, value, message
):
    found = config.problems({"b": {"URL": url, option: value}}, installed=False)
    assert len(found) == 1 and message.format(option=option, client=client) in found[0], found
    assert "['BROKERS']['b']" in found[0]


@pytest.mark.parametrize(("option", "client"), CLIENT_PROCESS_OPTIONS)
def test_manage_py_check_names_a_bad_client_process_option_and_the_fix(option, client):
    from django.core import checks

    with brokers(js={"URL": "nats://127.0.0.1:1", option: "no"}):
        found = [m for m in checks.run_checks(databases=[]) if m.id == "django_domain_events.E020"]
    assert [m.msg for m in found] == [
        f"DJANGO_DOMAIN_EVENTS['BROKERS']['js']['{option}'] must be True or False, "
        f"not 'no'; e.g. {{'{option}': False}} to run the {client}'s client on the "
        "process's broker thread."
    ]


@pytest.mark.parametrize(("option", "client"), CLIENT_PROCESS_OPTIONS)
def test_a_client_process_defaults_to_a_child_for_nats_and_redis(option, client):
    entries = {
        "js": {"URL": "nats://h"},
        "streams": {"URL": "redis://h", option: False},
        "queues": {"URL": "amqp://h/"},
    }
    assert config.problems(entries, installed=False) == []
    with brokers(**entries):
        configs = config.brokers()
    in_child = {name: getattr(c, f"{client}_process") for name, c in configs.items()}
    assert in_child == {"js": True, "streams": False, "queues": False}
