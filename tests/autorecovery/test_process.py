"""The auto-recovery process in-process: it serves its admin API, and when its metadata
session is lost it stands again on a new one (a new generation) on the same HTTP port."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

from tally.autorecovery.config import AutoRecoveryConfig
from tally.autorecovery.process import AutoRecoveryProcess
from tally.cli.autorecovery import admin_http
from tally.metadata.auditor_election import who_is_auditor
from tally.metadata.stores import open_store
from tests.support.polling import until
from tests.support.processes import init_cluster

STATUS = "/api/v1/autorecovery/process"


def _get(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
        return json.load(answer)


async def test_a_lost_session_starts_a_new_generation_on_the_same_port(tmp_path: Path) -> None:
    uri = init_cluster(tmp_path)
    config = AutoRecoveryConfig(metadata=uri, http_port=0, session_timeout=2.0)
    process = AutoRecoveryProcess(config, "ar-process-test", admin_http=admin_http)
    ready: list[int] = []
    running = asyncio.create_task(process.run(on_ready=lambda p: ready.append(p.generation)))
    async with open_store(uri) as observer:

        async def elected() -> bool:
            """Its vote leads in the store, and its auditor knows it has been elected."""
            if await who_is_auditor(observer) != "ar-process-test" or process.http_port is None:
                return False
            status = await asyncio.to_thread(_get, process.http_port, STATUS)
            return bool(status["auditor"]["elected"])

        try:
            await until(lambda: ready, "the first generation", timeout=20)
            await until(elected, "elected", timeout=20)
            port = process.http_port
            assert port is not None
            status = await asyncio.to_thread(_get, port, STATUS)
            assert status["generation"] == 1

            assert process.store is not None
            await process.store.expire_session()

            async def second_generation() -> bool:
                return process.generation == 2 and await elected()

            await until(second_generation, "a second generation, elected again", timeout=20)
            await until(lambda: process.http_port == port, "same port", timeout=20)
            status = await asyncio.to_thread(_get, port, STATUS)
            assert status["generation"] == 2
            assert ready == [1], "on_ready is for the first generation only"
        finally:
            await process.stop()
            await asyncio.wait_for(running, 20)
        assert await who_is_auditor(observer) is None, "the stopped process withdrew its vote"
