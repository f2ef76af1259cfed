"""The partition map a deployment records and its processes adopt (infra/settings/replicated.py):
what `pkgq migrate` records when nothing is configured, and how a configured map meets the
recorded one."""

from __future__ import annotations

import pytest

from events.routes import PACKAGE_PURCHASE, ROUTES, USAGE_RECORD
from infra.route_config import RouteSettings
from infra.settings import Settings
from infra.settings.replicated import PartitionMapMismatchError


def unconfigured() -> Settings:
    return Settings(partitions={}, route_settings={})


def test_a_new_unconfigured_deployment_records_sixteen_for_usage_and_purchase() -> None:
    recorded = unconfigured().partitions_to_record(True)
    assert recorded[USAGE_RECORD.name] == recorded[PACKAGE_PURCHASE.name] == 16
    assert {n for n, p in recorded.items() if p != 1} == {USAGE_RECORD.name, PACKAGE_PURCHASE.name}
    assert set(recorded) == set(ROUTES)


def test_an_existing_deployment_without_configured_partitions_records_one_everywhere() -> None:
    assert unconfigured().partitions_to_record(False) == dict.fromkeys(ROUTES, 1)


def test_a_configured_map_is_recorded_whole_on_a_new_deployment_too() -> None:
    four = Settings(partitions={USAGE_RECORD.name: 4}, route_settings={})
    assert four.partitions_to_record(True) == {**dict.fromkeys(ROUTES, 1), USAGE_RECORD.name: 4}


def test_an_unconfigured_process_adopts_the_recorded_map() -> None:
    adopted = unconfigured().with_recorded_partitions({USAGE_RECORD.name: 16, "gone.route": 3})
    assert adopted.partitions_for(USAGE_RECORD.name) == 16
    assert adopted.partitions_for(PACKAGE_PURCHASE.name) == 1
    assert "gone.route" not in adopted.partitions


def test_nothing_recorded_keeps_the_configured_map() -> None:
    four = Settings(partitions={USAGE_RECORD.name: 4}, route_settings={})
    assert four.with_recorded_partitions({}).partitions_for(USAGE_RECORD.name) == 4


def test_a_configured_count_that_disagrees_with_the_recorded_one_is_refused_naming_both() -> None:
    four = Settings(partitions={USAGE_RECORD.name: 4}, route_settings={})
    with pytest.raises(PartitionMapMismatchError) as refused:
        four.with_recorded_partitions({USAGE_RECORD.name: 16, PACKAGE_PURCHASE.name: 1})
    assert "telecom.usage_record: configured 4, recorded 16" in str(refused.value)
    assert "docs/how-to/partitions.md" in str(refused.value)


def test_a_configured_map_leaves_unnamed_routes_at_one_so_a_recorded_sixteen_disagrees() -> None:
    four = Settings(partitions={USAGE_RECORD.name: 4}, route_settings={})
    with pytest.raises(PartitionMapMismatchError, match="package_purchase: configured 1, rec"):
        four.with_recorded_partitions({USAGE_RECORD.name: 4, PACKAGE_PURCHASE.name: 16})


def test_a_routes_file_count_is_a_configured_map_checked_against_the_record() -> None:
    filed = Settings(
        partitions={}, route_settings={USAGE_RECORD.name: RouteSettings(partitions=16)}
    )
    assert filed.configures_partitions()
    agreed = filed.with_recorded_partitions({USAGE_RECORD.name: 16, PACKAGE_PURCHASE.name: 1})
    assert agreed.partitions_for(USAGE_RECORD.name) == 16
