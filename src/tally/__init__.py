"""tally: a durable, replicated log store built on the design of Apache BookKeeper.

import tally
async with tally.Client("sqlite:///path/meta.db") as client: ...
with tally.SyncClient("sqlite:///path/meta.db") as client: ...
"""

from typing import TYPE_CHECKING

from tally.core.ids import LedgerId
from tally.version import __version__

if TYPE_CHECKING:
    from tally.client.client import Client
    from tally.client.config import ClientConfig
    from tally.client.sync import SyncClient

__all__ = ["Client", "ClientConfig", "LedgerId", "SyncClient", "__version__"]


def __getattr__(name: str) -> object:
    # The client pulls in the metadata store and asyncio machinery: load it on first use,
    # so that `import tally` stays cheap for the bookie and the core.
    if name in ("Client", "ClientConfig", "SyncClient"):
        from tally.client import client, config, sync

        return {
            "Client": client.Client,
            "ClientConfig": config.ClientConfig,
            "SyncClient": sync.SyncClient,
        }[name]
    raise AttributeError(f"module 'tally' has no attribute {name!r}")
