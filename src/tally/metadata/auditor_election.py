"""Auditor election: one auditor in the cluster, and a successor ready when it goes.

Each candidate casts an ephemeral sequential vote; the lowest vote is the auditor. Every
other candidate watches only the vote just below its own (not the auditor's, so a change
of auditor wakes one candidate rather than all of them): when that vote goes, it looks
again, and is either the auditor now or watches its new predecessor. A vote lives as long
as its candidate's store session, so an auditor that dies or is partitioned away is
replaced within the session timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import re

from tally.core.errors import NoSuchKey
from tally.metadata import json_records
from tally.metadata.paths import AUDITOR, AUDITOR_VOTE_PREFIX, check_bookie_id
from tally.metadata.store import MetadataStore, Watch, WatchEvent, WatchKind, join, name_of

WHO_ATTEMPTS = 5

_KIND = "auditor-vote"
_FIELDS = frozenset({"bookie_id"})
_VOTE_NAME = re.compile(re.escape(name_of(AUDITOR_VOTE_PREFIX)) + r"(\d+)")


async def _votes(store: MetadataStore) -> list[str]:
    """The vote names, lowest (the auditor's) first."""
    numbered = []
    for name in await store.children(AUDITOR):
        match = _VOTE_NAME.fullmatch(name)
        if match:
            numbered.append((int(match.group(1)), name))
    return [name for _, name in sorted(numbered)]


async def who_is_auditor(store: MetadataStore) -> str | None:
    """The bookie id of the current auditor, or None when no candidate is running."""
    for _ in range(WHO_ATTEMPTS):
        votes = await _votes(store)
        if not votes:
            return None
        path = join(AUDITOR, votes[0])
        try:
            found = await store.get(path)
        except NoSuchKey:
            continue  # the auditor just went: look again
        return json_records.decode(found.data, _KIND, _FIELDS, f"auditor vote {path}").text(
            "bookie_id"
        )
    return None


class AuditorElection:
    """One candidate (`bookie_id`) on its store session.

    `elected` is set while this candidate is the auditor. `lost` is set, and `elected`
    cleared, when the session (and so the vote) is lost: the candidate must stop auditing
    and stand again on a new session.
    """

    def __init__(self, store: MetadataStore, bookie_id: str):
        self.store = store
        self.bookie_id = check_bookie_id(bookie_id)
        self.elected = asyncio.Event()
        self.lost = asyncio.Event()
        self.vote: str | None = None
        self._lock = asyncio.Lock()
        self._watch: Watch | None = None
        self._stopped = False

    @property
    def watching(self) -> str | None:
        """The vote this candidate waits on (its predecessor's), or None."""
        return None if self._watch is None else self._watch.path

    async def start(self) -> None:
        """Cast the vote and look at the result (`elected` is set at once if it won)."""
        self.store.on_session_lost(self._session_lost)
        data = json_records.encode(_KIND, {"bookie_id": self.bookie_id})
        self.vote = await self.store.create(
            AUDITOR_VOTE_PREFIX, data, ephemeral=True, sequential=True
        )
        await self._look()

    async def stop(self) -> None:
        """Withdraw the vote: the next candidate takes over at once."""
        self._stopped = True
        self.elected.clear()
        if self._watch is not None:
            self._watch.cancel()
        if self.vote is not None and not self.lost.is_set():
            with contextlib.suppress(NoSuchKey):
                await self.store.delete(self.vote)

    def _session_lost(self) -> None:
        self.elected.clear()
        self.lost.set()

    def _predecessor_changed(self, _: WatchEvent) -> object:
        return self._look()

    async def _look(self) -> None:
        """Become the auditor if this vote is the lowest, else watch the vote just below."""
        async with self._lock:
            while not (self._stopped or self.lost.is_set()):
                assert self.vote is not None
                votes = await _votes(self.store)
                mine = name_of(self.vote)
                if mine not in votes:
                    self._session_lost()  # the vote went with the session
                    return
                position = votes.index(mine)
                if position == 0:
                    if self._watch is not None:
                        self._watch.cancel()
                        self._watch = None
                    self.elected.set()
                    return
                predecessor = join(AUDITOR, votes[position - 1])
                if self._watch is None or self._watch.path != predecessor:
                    if self._watch is not None:
                        self._watch.cancel()
                    self._watch = await self.store.watch(
                        predecessor, WatchKind.EXISTS, self._predecessor_changed
                    )
                if await self.store.exists(predecessor) is not None:
                    return  # armed before it could go: its going will wake this candidate
