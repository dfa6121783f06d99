"""The admin HTTP app, served for real on a loopback port inside the test's event loop and
asked with real HTTP requests (urllib, in a thread, so the loop keeps serving)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import socket
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from tally.bookie.config import BookieConfig
from tally.bookie.server import Bookie
from tally.core.digest import DigestType
from tally.core.errors import BadRequest
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerMetadata
from tally.http.admin import LocalAutoRecovery, LocalBookie, create_app, serve
from tally.metadata.auditor_election import AuditorElection
from tally.metadata.bookie_registry import BookieInfo, BookieRegistry
from tally.metadata.cluster import init_cluster
from tally.metadata.ledger_manager import LedgerManager
from tally.metadata.ledger_tree import create_with_parents
from tally.metadata.paths import LEDGER_METADATA
from tally.metadata.store import MetadataStore
from tally.metadata.stores import open_store
from tally.metadata.underreplication import UnderReplicationManager

ENDPOINTS = {
    "/heartbeat",
    "/metrics",
    "/api/v1/bookie/info",
    "/api/v1/bookie/list",
    "/api/v1/ledger/list",
    "/api/v1/ledger/metadata",
    "/api/v1/autorecovery/list_under_replicated_ledger",
    "/api/v1/autorecovery/who_is_auditor",
    "/api/v1/autorecovery/trigger_audit",
    "/api/v1/autorecovery/lost_bookie_recovery_delay",
    "/api/v1/autorecovery/status",
    "/api/v1/autorecovery/process",
    "/api/v1/ledger/delete",
    "/api/v1/ledger/undelete",
    "/api/v1/cluster/settings",
    "/api/v1/bookie/gc",
    "/api/v1/bookie/gc_details",
    "/api/v1/bookie/gc/orphans",
    "/api/v1/bookie/scrub",
    "/api/v1/bookie/corrupt_entries",
}
ENSEMBLE = ("10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181")
_stores = itertools.count()


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Served:
    port: int
    store: MetadataStore

    async def get(self, path: str) -> Answer:
        return await asyncio.to_thread(_get, f"http://127.0.0.1:{self.port}{path}")

    async def put(self, path: str, body: object = None) -> Answer:
        return await self.send("PUT", path, body)

    async def send(self, method: str, path: str, body: object = None) -> Answer:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method=method,
        )
        return await asyncio.to_thread(_get, request)


def _get(url: str | urllib.request.Request) -> Answer:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return Answer(answer.status, answer.headers["content-type"], answer.read())
    except urllib.error.HTTPError as error:
        return Answer(error.code, error.headers["content-type"], error.read())


@contextlib.asynccontextmanager
async def cluster_store() -> AsyncIterator[tuple[str, MetadataStore]]:
    uri = f"memory://admin-test-{os.getpid()}-{next(_stores)}"
    async with open_store(uri) as store:
        await init_cluster(store)
        yield uri, store


@contextlib.asynccontextmanager
async def served(
    store: MetadataStore,
    bookie: LocalBookie | None = None,
    registry: CollectorRegistry | None = None,
    autorecovery: LocalAutoRecovery | None = None,
) -> AsyncIterator[Served]:
    app = create_app(
        store, bookie=bookie, autorecovery=autorecovery, registry=registry or CollectorRegistry()
    )
    task, port = await serve(app, "127.0.0.1", 0)
    try:
        yield Served(port, store)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def run(test: Any) -> None:
    asyncio.run(asyncio.wait_for(test(), 30))


async def create_ledger(store: MetadataStore, ledger_id: LedgerId) -> LedgerMetadata:
    metadata = LedgerMetadata.create(
        ensemble=ENSEMBLE,
        write_quorum=2,
        ack_quorum=2,
        digest_type=DigestType.CRC32C,
        password=b"secret",
        ctime_ms=1_700_000_000_000,
        creator_token=ledger_id.qualified_name[:16].encode(),
    )
    await LedgerManager(store).create_ledger_metadata(ledger_id, metadata)
    return metadata


# --- health and metrics ---------------------------------------------------------------------


def test_heartbeat_and_the_metrics_of_the_given_registry() -> None:
    registry = CollectorRegistry()
    Counter("admin_test_things", "Things counted by the test", registry=registry).inc(3)

    async def check() -> None:
        async with cluster_store() as (_, store), served(store, registry=registry) as http:
            heartbeat = await http.get("/heartbeat")
            assert (heartbeat.status, heartbeat.body) == (200, b"OK\n")
            metrics = await http.get("/metrics")
            assert metrics.status == 200
            assert metrics.content_type.startswith("text/plain")
            assert "admin_test_things_total 3.0" in metrics.body.decode()
            assert "python_gc" not in metrics.body.decode(), "served the global registry"

    run(check)


# --- bookies --------------------------------------------------------------------------------


def test_bookie_info_reports_the_bookie_of_the_process(tmp_path: Path) -> None:
    async def check() -> None:
        async with cluster_store() as (uri, store):
            bookie = Bookie(BookieConfig(metadata=uri, data_dir=tmp_path, listen="127.0.0.1:0"))
            await bookie.start()
            try:
                async with served(store, bookie=bookie, registry=bookie.metrics.registry) as http:
                    info = await http.get("/api/v1/bookie/info")
                    metrics = await http.get("/metrics")
            finally:
                await bookie.stop()
        assert info.status == 200
        view = info.json()
        assert (view["bookie_id"], view["address"]) == (bookie.bookie_id, bookie.address)
        assert (view["state"], view["state_reason"]) == ("writable", "writable")
        assert view["ledger_directory"] == str(tmp_path / "ledgers")
        assert view["total_space"] >= view["free_space"] > 0
        assert "bookie_connections" in metrics.body.decode()

    run(check)


def test_bookie_info_without_a_bookie_is_404_with_a_reason() -> None:
    async def check() -> None:
        async with cluster_store() as (_, store), served(store) as http:
            answer = await http.get("/api/v1/bookie/info")
        assert answer.status == 404
        assert "runs no bookie" in answer.json()["reason"]

    run(check)


def test_bookie_list_filters_by_type() -> None:
    async def check() -> None:
        async with cluster_store() as (uri, store), open_store(uri) as other:
            info = BookieInfo("127.0.0.1:4001", None, "0.1.0", 1_700_000_000_000)
            await BookieRegistry(store).register("127.0.0.1:4001", info)
            spare = BookieInfo("127.0.0.1:4002", 8080, "0.1.0", 1_700_000_000_001)
            await BookieRegistry(other).register("127.0.0.1:4002", spare, read_only=True)
            async with served(store) as http:
                every = (await http.get("/api/v1/bookie/list")).json()
                writable = (await http.get("/api/v1/bookie/list?type=rw")).json()
                read_only = (await http.get("/api/v1/bookie/list?type=ro")).json()
                bad = await http.get("/api/v1/bookie/list?type=sideways")
        assert [(b["bookie_id"], b["state"]) for b in every] == [
            ("127.0.0.1:4001", "writable"),
            ("127.0.0.1:4002", "readonly"),
        ]
        assert writable == every[:1]
        assert read_only == every[1:]
        assert read_only[0]["http_port"] == 8080
        assert bad.status == 422
        assert "'rw', 'ro' or 'all'" in bad.json()["reason"]
        assert "type" in bad.json()["reason"]

    run(check)


# --- ledgers --------------------------------------------------------------------------------


def test_ledger_metadata_by_id_and_name_and_4xx_with_reasons() -> None:
    ledger = LedgerId.classic(7)

    async def check() -> None:
        async with cluster_store() as (_, store):
            metadata = await create_ledger(store, ledger)
            async with served(store) as http:
                by_id = await http.get("/api/v1/ledger/metadata?ledger_id=7")
                by_name = await http.get(
                    f"/api/v1/ledger/metadata?ledger_id={ledger.qualified_name}"
                )
                malformed = await http.get("/api/v1/ledger/metadata?ledger_id=seven")
                unknown = await http.get("/api/v1/ledger/metadata?ledger_id=8")
                missing = await http.get("/api/v1/ledger/metadata")
        assert by_id.status == 200
        assert by_id.json() == by_name.json()
        view = by_id.json()
        assert view["ledger_id"] == "7"
        assert view["state"] == metadata.state.name
        assert [s["ensemble"] for s in view["segments"]] == [list(ENSEMBLE)]
        assert (malformed.status, malformed.json()["error"]) == (400, "BadRequest")
        assert "qualified ledger name 'seven'" in malformed.json()["reason"]
        assert (unknown.status, unknown.json()["error"]) == (404, "NoSuchLedger")
        assert "ledger 8 has no metadata" in unknown.json()["reason"]
        assert missing.status == 422
        assert "ledger_id" in missing.json()["reason"]

    run(check)


def test_ledger_list_pages_through_every_ledger_in_id_order() -> None:
    ids = [LedgerId.classic(n) for n in (3, 1, 2)] + [LedgerId(9, 4), LedgerId(5, 6)]
    corrupt = LedgerId.classic(10)

    async def check() -> None:
        async with cluster_store() as (_, store):
            for ledger in ids:
                await create_ledger(store, ledger)
            await create_with_parents(store, LEDGER_METADATA.path(corrupt), b"not metadata")
            async with served(store) as http:
                pages = [
                    (await http.get(f"/api/v1/ledger/list?limit=2&page={n}")).json()
                    for n in range(3)
                ]
                full = (await http.get("/api/v1/ledger/list?print_metadata=true")).json()
                broken = await http.get(f"/api/v1/ledger/metadata?ledger_id={corrupt}")
                too_big = await http.get("/api/v1/ledger/list?limit=0")
                negative = await http.get("/api/v1/ledger/list?page=-1")
        listed = [item["qualified_name"] for page in pages for item in page["ledgers"]]
        assert listed == [ledger.qualified_name for ledger in sorted(ids)]
        assert [page["next_page"] for page in pages] == [1, 2, None]
        (unreadable,) = [u for page in pages for u in page["unreadable"]]
        assert unreadable["path"] == LEDGER_METADATA.path(corrupt)
        assert full["next_page"] is None
        assert [item["segments"][0]["ensemble"] for item in full["ledgers"]] == [
            list(ENSEMBLE)
        ] * len(ids)
        assert broken.status == 500
        assert broken.json()["error"] == "MalformedData"
        assert (too_big.status, negative.status) == (422, 422)
        assert "limit" in too_big.json()["reason"]
        assert "page" in negative.json()["reason"]

    run(check)


# --- the document and the server -----------------------------------------------------------


def test_the_openapi_document_lists_every_endpoint() -> None:
    async def check() -> None:
        async with cluster_store() as (_, store), served(store) as http:
            answer = await http.get("/openapi.json")
        assert answer.status == 200
        document = answer.json()
        assert document["openapi"].startswith("3.")
        assert set(document["paths"]) == ENDPOINTS
        writable = {
            "/api/v1/autorecovery/trigger_audit": {"put"},
            "/api/v1/autorecovery/lost_bookie_recovery_delay": {"get", "put"},
            "/api/v1/autorecovery/status": {"get", "put"},
            "/api/v1/ledger/delete": {"delete"},
            "/api/v1/ledger/undelete": {"put"},
            "/api/v1/bookie/gc": {"put"},
            "/api/v1/bookie/gc/orphans": {"get", "delete"},
            "/api/v1/bookie/scrub": {"get", "put"},
        }
        for path, operations in document["paths"].items():
            assert set(operations) == writable.get(path, {"get"}), path
        metadata = document["paths"]["/api/v1/ledger/metadata"]["get"]
        assert [p["name"] for p in metadata["parameters"]] == ["ledger_id"]
        assert {"400", "404"} <= set(metadata["responses"])
        (kind,) = document["paths"]["/api/v1/bookie/list"]["get"]["parameters"]
        assert kind["name"] == "type"

    run(check)


def test_serve_picks_a_port_leaves_signals_alone_and_stops_on_cancel() -> None:
    async def check() -> None:
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        async with cluster_store() as (_, store):
            task, port = await serve(create_app(store), "127.0.0.1", 0)
            assert port > 0
            assert (await Served(port, store).get("/heartbeat")).status == 200
            assert {s: signal.getsignal(s) for s in handlers} == handlers
            with pytest.raises(BadRequest, match=f"cannot listen on 127.0.0.1:{port}"):
                await serve(create_app(store), "127.0.0.1", port)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        assert task.cancelled()
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port)):
            pass
        assert {s: signal.getsignal(s) for s in handlers} == handlers

    run(check)


# --- auto-recovery --------------------------------------------------------------------------


@dataclass
class FakeAutoRecovery:
    """Stands for the process's auditor and worker, whose own tests cover their status."""

    def status(self) -> dict[str, Any]:
        return {"auditor": {"elected": True}, "worker": {"replicated": 2}}


def test_autorecovery_marks_lost_entries_auditor_and_audit_requests() -> None:
    lost_ledger, marked = LedgerId.classic(5), LedgerId(3, 9)

    async def check() -> None:
        async with cluster_store() as (_, store), served(store) as http:
            manager = UnderReplicationManager(store)
            assert (
                await http.get("/api/v1/autorecovery/list_under_replicated_ledger")
            ).json() == []
            await manager.mark_under_replicated(marked, ["10.0.0.1:3181"], now_ms=11)
            await manager.record_lost_entries(lost_ledger, [(0, 1)], "gone", mark_version=0)
            listed = await http.get("/api/v1/autorecovery/list_under_replicated_ledger")
            assert [m["qualified_name"] for m in listed.json()] == [marked.qualified_name]
            assert listed.json()[0]["missing_bookies"] == ["10.0.0.1:3181"]
            other = await http.get(
                "/api/v1/autorecovery/list_under_replicated_ledger?missing_bookie=10.9.9.9:1"
            )
            assert other.json() == []
            lost = await http.get("/api/v1/autorecovery/list_under_replicated_ledger?lost=true")
            assert [(x["ledger_id"], x["entries"]) for x in lost.json()] == [("5", [[0, 1]])]

            assert (await http.get("/api/v1/autorecovery/who_is_auditor")).json() == {
                "auditor": None
            }
            refused = await http.put("/api/v1/autorecovery/trigger_audit")
            assert (refused.status, refused.json()["error"]) == (409, "NoAuditor")
            election = AuditorElection(store, "autorecovery-1")
            await election.start()
            try:
                who = await http.get("/api/v1/autorecovery/who_is_auditor")
                assert who.json() == {"auditor": "autorecovery-1"}
                triggered = await http.put("/api/v1/autorecovery/trigger_audit")
                assert triggered.status == 200
                assert triggered.json()["auditor"] == "autorecovery-1"
            finally:
                await election.stop()

    run(check)


def test_autorecovery_settings_and_process_status() -> None:
    async def check() -> None:
        async with cluster_store() as (_, store), served(store) as http:
            delay = "/api/v1/autorecovery/lost_bookie_recovery_delay"
            assert (await http.get(delay)).json() == {"delay_seconds": None}
            assert (await http.put(delay, {"delay_seconds": 30})).status == 200
            assert (await http.get(delay)).json() == {"delay_seconds": 30}
            assert await UnderReplicationManager(store).lost_bookie_recovery_delay() == 30
            for bad in ({"delay_seconds": -1}, {"delay_seconds": "soon"}, {}):
                refused = await http.put(delay, bad)
                assert refused.status == 422
                assert "delay_seconds" in refused.json()["reason"]
            status = "/api/v1/autorecovery/status"
            assert (await http.get(status)).json() == {"enabled": True}
            assert (await http.put(f"{status}?enabled=false")).json() == {"enabled": False}
            assert not await UnderReplicationManager(store).is_replication_enabled()
            assert (await http.get(status)).json() == {"enabled": False}
            assert (await http.put(f"{status}?enabled=maybe")).status == 422
            absent = await http.get("/api/v1/autorecovery/process")
            assert (absent.status, absent.json()["error"]) == (404, "NoAutoRecovery")
        async with (
            cluster_store() as (_, store),
            served(store, autorecovery=FakeAutoRecovery()) as http,
        ):
            process = await http.get("/api/v1/autorecovery/process")
            assert process.json() == FakeAutoRecovery().status()

    run(check)


def test_deleting_through_the_api_takes_the_delete_path() -> None:
    async def check() -> None:
        async with cluster_store() as (_, store), served(store) as http:
            closed, left_open = LedgerId.classic(31), LedgerId.classic(32)
            await create_ledger(store, closed)
            await create_ledger(store, left_open)
            await LedgerManager(store).update(closed, lambda m: m.close(-1, 0))
            deleted = await http.send("DELETE", f"/api/v1/ledger/delete?ledger_id={closed}")
            assert deleted.status == 200, deleted.body
            assert deleted.json()["deletion"]["reason"] == "deleted through the admin HTTP API"
            assert deleted.json()["deletion"]["detail"].startswith("nothing to check")
            shown = await http.get(f"/api/v1/ledger/metadata?ledger_id={closed}")
            assert shown.json()["state"] == "DELETED"
            refused = await http.send("DELETE", f"/api/v1/ledger/delete?ledger_id={left_open}")
            assert refused.status == 409
            assert "is OPEN" in refused.json()["reason"]
            missing = await http.send("DELETE", "/api/v1/ledger/delete?ledger_id=999")
            assert missing.status == 404
            back = await http.put(f"/api/v1/ledger/undelete?ledger_id={closed}")
            assert back.status == 200
            assert back.json()["state"] == "CLOSED"
            settings = await http.get("/api/v1/cluster/settings")
            assert settings.json()["ledger_delete_retention"] == 86400
            no_bookie = await http.put("/api/v1/bookie/gc")
            assert no_bookie.status == 404

    run(check)
