"""The incarnations the auditor remembers: one key per bookie id, the incarnation id of the
bookie's cookie when the auditor last looked, kept in the store so that an auditor elected
later still knows which incarnation each bookie's copies were written to.

Written only by the elected auditor, by compare-and-set, after the ledgers of a changed
bookie are marked (see `tally.core.incarnations`). Never deleted when a cookie goes: the
bookie's next format must be seen as a change.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tally.core.errors import BadRequest, MalformedData, NoSuchKey
from tally.metadata import json_records
from tally.metadata.ledger_tree import create_with_parents
from tally.metadata.paths import INCARNATIONS, incarnation_path
from tally.metadata.store import MetadataStore, join

log = logging.getLogger(__name__)

_KIND = "bookie-incarnation"
_FIELDS = frozenset({"incarnation_id", "learnt_ms"})


@dataclass(frozen=True)
class RememberedIncarnation:
    bookie_id: str
    incarnation_id: str | None
    """None when the record does not decode: the incarnation is unknown."""
    learnt_ms: int | None
    """When the auditor learnt it (None when unknown)."""
    version: int
    """The record's version, for the compare-and-set that replaces it."""


class RememberedIncarnations:
    """The auditor's records of each bookie's incarnation, on one store session."""

    def __init__(self, store: MetadataStore):
        self.store = store

    async def all(self) -> dict[str, RememberedIncarnation]:
        """Every remembered bookie (none in a cluster whose auditor never looked)."""
        try:
            names = await self.store.children(INCARNATIONS)
        except NoSuchKey:
            return {}  # a cluster made before incarnations were remembered
        paths = [join(INCARNATIONS, name) for name in names]
        found = await self.store.get_many(paths)
        remembered = {}
        for name, path, value in zip(names, paths, found, strict=True):
            if value is None:
                continue  # removed meanwhile
            try:
                record = json_records.decode(value.data, _KIND, _FIELDS, f"incarnation {path}")
                incarnation: str | None = record.text("incarnation_id")
                learnt: int | None = record.integer("learnt_ms")
            except MalformedData as error:
                log.error("%s; the bookie's incarnation counts as unknown (changed)", error)
                incarnation, learnt = None, None
            remembered[name] = RememberedIncarnation(name, incarnation, learnt, value.version)
        return remembered

    async def remember(
        self, bookie_id: str, incarnation_id: str, *, expected_version: int | None, now_ms: int
    ) -> None:
        """Record `incarnation_id` as the bookie's: a new record when `expected_version` is
        None (KeyExists if there is one), else a CAS (MetadataVersionConflict)."""
        if not isinstance(incarnation_id, str) or not incarnation_id:
            raise BadRequest(f"an incarnation id is a non-empty str, not {incarnation_id!r}")
        path = incarnation_path(bookie_id)
        data = json_records.encode(_KIND, {"incarnation_id": incarnation_id, "learnt_ms": now_ms})
        if expected_version is None:
            await create_with_parents(self.store, path, data)
        else:
            await self.store.set(path, data, expected_version)
