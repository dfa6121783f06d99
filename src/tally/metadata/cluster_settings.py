"""The cluster settings in the store: one record, read by every process that deletes.

Absent until an operator changes a setting; until then every reader gets the defaults of
`ClusterSettings`, so a cluster made by an older tally needs no migration.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tally.core.deletion import ClusterSettings
from tally.core.errors import NoSuchKey
from tally.metadata import json_records
from tally.metadata.key_ops import put
from tally.metadata.paths import SETTINGS
from tally.metadata.store import MetadataStore

_KIND = "cluster-settings"
_FIELDS = frozenset(field.name for field in dataclasses.fields(ClusterSettings))


def encode_settings(settings: ClusterSettings) -> bytes:
    return json_records.encode(_KIND, settings.to_dict())


def decode_settings(data: bytes, source: str = f"cluster settings {SETTINGS}") -> ClusterSettings:
    """The settings in `data`; fields it lacks (written by an older tally) take defaults."""
    record = json_records.decode(data, _KIND, _FIELDS, source)
    values: dict[str, int | bool] = {}
    for field in dataclasses.fields(ClusterSettings):
        if field.name in record.names:
            values[field.name] = (
                record.flag(field.name) if field.type == "bool" else record.integer(field.name)
            )
    with json_records.building(record.source):
        return ClusterSettings(**values)  # type: ignore[arg-type]


def settings_of(values: Mapping[str, Any], source: str) -> ClusterSettings:
    """The settings `ClusterSettings.to_dict` gave (a snapshot keeps them so), checked as
    the store's record is."""
    return decode_settings(json_records.encode(_KIND, values), source)


async def read_settings(store: MetadataStore) -> ClusterSettings:
    try:
        found = await store.get(SETTINGS)
    except NoSuchKey:
        return ClusterSettings()
    return decode_settings(found.data)


async def write_settings(store: MetadataStore, settings: ClusterSettings) -> None:
    await put(store, SETTINGS, encode_settings(settings))
