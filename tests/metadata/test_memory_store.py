"""The memory backend's own rule: a name is one tree for the whole process."""

from __future__ import annotations

import uuid

from tally.metadata import open_store


async def test_stores_on_one_name_share_a_tree_that_outlives_them() -> None:
    uri = f"memory://shared-{uuid.uuid4().hex}"
    async with open_store(uri) as first, open_store(uri) as second:
        await first.create("/k", b"v")
        assert (await second.get("/k")).data == b"v"
        assert first.session_id != second.session_id
    async with open_store(uri) as later:
        assert (await later.get("/k")).data == b"v"


async def test_unnamed_stores_are_private() -> None:
    async with open_store("memory://") as first, open_store("memory://") as second:
        await first.create("/k")
        assert await second.exists("/k") is None
