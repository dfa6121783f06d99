"""The one encoding of the services' small records: versioned, checksummed JSON.

A record is a JSON object with a `kind` (so a cookie is never read as a registration), a
`format` version, its fields, and `crc32c`: the CRC32C of the record's canonical form
without it. The canonical form (sorted keys, no spaces) is also what `encode` writes, so
equal records are equal bytes, which a bookie needs to compare the cookie in each of its
directories with the one in the store. The store has no checksum of its own and a flipped
byte in a bookie id or an instance id would read as another valid value; the CRC turns it
into an error instead.

A reader refuses what it cannot fully understand (another kind, a newer format, a bad
checksum, a missing, mistyped or unknown field) with MalformedData naming the key or file
it came from, rather than guess, or drop fields it would lose on its next write.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

from tally.core.digest import crc32c
from tally.core.errors import BadRequest, MalformedData

FORMAT = 1
MAX_RECORD_BYTES = 1 << 20
"""A record is a few hundred bytes; anything near this is not one."""
_ENVELOPE = ("kind", "format", "crc32c")


def _canonical(record: Mapping[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def encode(kind: str, fields: Mapping[str, Any]) -> bytes:
    """The bytes of a record of `kind` with `fields` (JSON-ready values)."""
    record = {**fields, "kind": kind, "format": FORMAT}
    try:
        return _canonical({**record, "crc32c": crc32c(_canonical(record))})
    except UnicodeEncodeError as e:
        raise BadRequest(f"{kind} record has a string that is not valid Unicode: {e}") from None


class Record:
    """A decoded record's fields, read with their types checked; `source` names it in errors."""

    def __init__(self, fields: dict[str, Any], source: str):
        self._fields = fields
        self.source = source

    def _take(self, name: str, types: type, what: str) -> Any:
        if name not in self._fields:
            raise MalformedData(f"{self.source}: the record has no {name!r} field")
        value = self._fields[name]
        if not isinstance(value, types) or isinstance(value, bool):
            raise MalformedData(f"{self.source}: field {name!r} is not {what}: {value!r}")
        return value

    @property
    def names(self) -> frozenset[str]:
        """The fields the record has."""
        return frozenset(self._fields)

    def flag(self, name: str) -> bool:
        if name not in self._fields:
            raise MalformedData(f"{self.source}: the record has no {name!r} field")
        value = self._fields[name]
        if not isinstance(value, bool):
            raise MalformedData(f"{self.source}: field {name!r} is not true or false: {value!r}")
        return value

    def text(self, name: str) -> str:
        value: str = self._take(name, str, "a non-empty string")
        if not value:
            raise MalformedData(f"{self.source}: field {name!r} is empty")
        return value

    def string(self, name: str) -> str:
        """A string that may be empty."""
        value: str = self._take(name, str, "a string")
        return value

    def integer(self, name: str, low: int = 0) -> int:
        value: int = self._take(name, int, "an integer")
        if value < low:
            raise MalformedData(f"{self.source}: field {name!r} is {value}, below {low}")
        return value

    def optional_integer(self, name: str, low: int = 0) -> int | None:
        if name in self._fields and self._fields[name] is None:
            return None
        return self.integer(name, low)

    def optional_integers(self, name: str) -> tuple[int | None, ...]:
        values: list[Any] = self._take(name, list, "a list of integers or nulls")
        if not all(value is None or type(value) is int for value in values):
            raise MalformedData(f"{self.source}: field {name!r} holds an item that is no integer")
        return tuple(values)

    def texts(self, name: str) -> tuple[str, ...]:
        values: list[Any] = self._take(name, list, "a list of strings")
        if not all(isinstance(value, str) and value for value in values):
            raise MalformedData(f"{self.source}: field {name!r} holds a non-string or empty item")
        return tuple(values)

    def integer_pairs(self, name: str) -> tuple[tuple[int, int], ...]:
        values: list[Any] = self._take(name, list, "a list of [int, int] pairs")
        if not all(
            isinstance(pair, list) and len(pair) == 2 and all(type(item) is int for item in pair)
            for pair in values
        ):
            raise MalformedData(f"{self.source}: field {name!r} holds an item that is no pair")
        return tuple((first, second) for first, second in values)

    def pairs_by_text(self, name: str) -> dict[str, tuple[tuple[int, int], ...]]:
        """An object of non-empty strings to lists of [int, int] pairs."""
        values: dict[str, Any] = self._take(name, dict, "an object of pair lists")
        found = {}
        for key, pairs in values.items():
            if not key:
                raise MalformedData(f"{self.source}: field {name!r} holds an empty key")
            found[key] = Record({key: pairs}, f"{self.source} {name}").integer_pairs(key)
        return found


def decode(data: bytes, kind: str, fields: frozenset[str], source: str) -> Record:
    """The record of `kind` in `data`, whose fields must be exactly `fields`."""
    if len(data) > MAX_RECORD_BYTES:
        raise MalformedData(f"{source}: {len(data)} bytes is too long for a {kind} record")
    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise MalformedData(f"{source}: not a {kind} record (not JSON: {e})") from None
    if not isinstance(parsed, dict):
        raise MalformedData(f"{source}: not a {kind} record (a JSON {type(parsed).__name__})")
    if parsed.get("kind") != kind:
        raise MalformedData(f"{source}: a {parsed.get('kind')!r} record, not a {kind!r} one")
    version = parsed.get("format")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise MalformedData(f"{source}: {kind} record with an invalid format {version!r}")
    if version > FORMAT:
        raise MalformedData(
            f"{source}: {kind} record format {version} is newer than this tally "
            f"understands (max {FORMAT}); upgrade tally"
        )
    stored = parsed.pop("crc32c", None)
    try:
        computed = crc32c(_canonical(parsed))
    except UnicodeEncodeError as e:
        raise MalformedData(f"{source}: {kind} record holds invalid Unicode: {e}") from None
    if stored != computed:
        raise MalformedData(
            f"{source}: {kind} record checksum mismatch: stored {stored!r}, computed {computed}"
        )
    body = {name: value for name, value in parsed.items() if name not in _ENVELOPE}
    unknown = sorted(set(body) - fields)
    if unknown:
        raise MalformedData(f"{source}: {kind} record has unknown field(s) {unknown}")
    return Record(body, source)


@contextlib.contextmanager
def building(source: str) -> Iterator[None]:
    """Report decoded fields that the record's type refuses as MalformedData naming `source`."""
    try:
        yield
    except MalformedData:
        raise
    except BadRequest as e:
        raise MalformedData(f"{source}: {e}") from None
