"""The indexes over owed rows: partial where the database can, led by status where not."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks
from django.db import connection

from django_domain_events.models import DeliveryRecord

pytestmark = pytest.mark.django_db


def index_columns() -> dict[str, list[str]]:
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(
            cursor, DeliveryRecord._meta.db_table
        )
    return {name: c["columns"] for name, c in constraints.items() if c["index"]}


def test_the_claim_index_never_covers_settled_history() -> None:
    columns = index_columns()
    if connection.features.supports_partial_indexes:
        assert columns["dde_delivery_claim_rank"] == ["claim_rank", "id"]
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(
                    "SELECT indexdef FROM pg_indexes WHERE indexname = 'dde_delivery_claim_rank'"
                )
            else:
                cursor.execute(
                    "SELECT sql FROM sqlite_master WHERE name = 'dde_delivery_claim_rank'"
                )
            assert "WHERE" in cursor.fetchone()[0]
    else:  # MariaDB/MySQL: no partial indexes, so a range on status skips history
        assert columns["dde_delivery_claim_rank"] == ["status", "claim_rank", "id"]


def test_no_system_check_warns_about_the_indexes() -> None:
    """Django checks indexes per database (W037 conditions, W040 included columns)."""
    ids = {message.id for message in run_checks(databases=["default"])}
    assert not ids & {"models.W037", "models.W040"}
