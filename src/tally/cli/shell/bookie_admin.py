"""Reaching a bookie's admin HTTP app (its `metrics_port`) from the shell, found from its
registration: for the commands that act on one bookie's own work (garbage collection,
scrubbing)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Annotated, Any

import typer

from tally.cli.shell.common import EXIT_FAILED, EXIT_NOT_FOUND, fail, with_store
from tally.core.addresses import join_host_port, split_host_port
from tally.metadata.views import bookie_views

HTTP_TIMEOUT = 600.0
"""Seconds a bookie's answer may take (a GC run, a scrub pass waited for) before the command
gives up waiting (the work goes on)."""

OptionalBookie = Annotated[
    str | None,
    typer.Option("--bookie", help="Bookie id (host:port); every registered bookie without it."),
]


def admin_urls(metadata: str | None, bookie: str | None) -> dict[str, str]:
    """Each wanted bookie's admin HTTP base URL, by bookie id."""
    views = with_store(metadata, bookie_views)
    if bookie is not None:
        views = [view for view in views if view["bookie_id"] == bookie]
        if not views:
            raise fail(f"bookie {bookie} is not registered (is it running?)", EXIT_NOT_FOUND)
    urls = {}
    for view in views:
        if view["http_port"] is None:
            raise fail(
                f"bookie {view['bookie_id']} serves no admin HTTP; start it with a "
                "metrics_port to reach it from here",
                EXIT_FAILED,
            )
        host, _ = split_host_port(view["address"])
        urls[view["bookie_id"]] = f"http://{join_host_port(host, view['http_port'])}"
    return urls


def call(bookie_id: str, method: str, url: str, timeout: float = HTTP_TIMEOUT) -> Any:
    """The JSON answer of the bookie's admin HTTP app to `method url`; a failure ends the
    command with one line saying what went wrong."""
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return json.load(answer)
    except urllib.error.HTTPError as error:
        raise fail(
            f"bookie {bookie_id}: {method} {url} answered {error.code}", EXIT_FAILED
        ) from None
    except TimeoutError:
        raise fail(
            f"bookie {bookie_id}: no answer to {method} {url} within {timeout:g} s (what it "
            "was asked to do goes on)",
            EXIT_FAILED,
        ) from None
    except OSError as error:
        raise fail(f"bookie {bookie_id}: cannot reach {url}: {error}", EXIT_FAILED) from None
