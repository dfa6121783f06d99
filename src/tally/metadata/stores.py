"""Opening a metadata store by URI: which backend serves which scheme.

Apart from store.py, which every backend imports, so that the protocol does not import
its own implementations; a backend's modules (kazoo for ZooKeeper) load only when used.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from tally.core.errors import BadRequest
from tally.metadata.store import DEFAULT_CONNECT_TIMEOUT, DEFAULT_SESSION_TIMEOUT, MetadataStore

KNOWN_SCHEMES = ("memory", "sqlite", "zk")


def open_store(
    uri: str,
    *,
    session_timeout: float = DEFAULT_SESSION_TIMEOUT,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
) -> MetadataStore:
    """The store for `uri`, not yet started: use `async with` or `await store.start()`.

    memory://[name] | sqlite:///path/meta.db | zk://host:port[,host:port][/chroot]
    """
    if not isinstance(uri, str):
        raise BadRequest(f"metadata store URI must be a str, got {uri!r}")
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme not in KNOWN_SCHEMES:
        known = ", ".join(f"{s}://" for s in KNOWN_SCHEMES)
        raise BadRequest(
            f"unknown metadata store scheme {parts.scheme or uri!r} in {uri!r}; known: {known}"
        )
    if not uri.lower().startswith(f"{scheme}://"):
        raise BadRequest(f"metadata store URI {uri!r} must start with {scheme}://")
    if parts.query or parts.fragment:
        raise BadRequest(f"metadata store URI {uri!r} takes no query or fragment")
    timeouts = {"session_timeout": session_timeout, "connect_timeout": connect_timeout}
    if scheme == "memory":
        from tally.metadata.memory import MemoryStore

        if parts.path not in ("", "/"):
            raise BadRequest(f"memory store URI {uri!r} takes a name, not a path")
        return MemoryStore(parts.netloc, **timeouts)
    if scheme == "sqlite":
        from tally.metadata.sqlite import SqliteStore

        if parts.netloc not in ("", "localhost") or not parts.path or parts.path == "/":
            raise BadRequest(f"sqlite store URI {uri!r} must be sqlite:///path/to/meta.db")
        return SqliteStore(parts.path, **timeouts)
    from tally.metadata.zookeeper import ZooKeeperStore

    return ZooKeeperStore.from_uri_parts(parts.netloc, parts.path, **timeouts)
