"""Filling a component's config dataclass: defaults < TOML file < TALLY_* variables < flags.

Each component (bookie, client, auto-recovery, local cluster, audit) declares one frozen
dataclass whose field defaults are its documented defaults, durations in seconds. `load`
fills it from a TOML file's section named after the component, then from environment
variables `TALLY_<SECTION>_<FIELD>`, then from the flags the command line was given. One
variable serves every component: `TALLY_METADATA`, the metadata store's URI, read where a
config has a `metadata` setting that nothing else gave (the component's own variable
wins). Unknown keys and values of the wrong type are refused with the place they came
from, and so is a value the config's own checks refuse (`BadSetting`, raised by its
`__post_init__`): a typo never silently keeps a default.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from tally.core.errors import BadRequest, BadSetting

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

METADATA_VARIABLE = "TALLY_METADATA"
"""The metadata store URI for every command that has none given otherwise."""


def check(condition: bool, setting: str, problem: str) -> None:
    """A config's check: BadSetting(`setting`, `problem`) unless `condition` holds."""
    if not condition:
        raise BadSetting(setting, problem)


def metadata_uri(given: str | None, *, environment: Mapping[str, str] | None = None) -> str | None:
    """The metadata URI a command uses: the one given, else $TALLY_METADATA, else None."""
    if given:
        return given
    return (os.environ if environment is None else environment).get(METADATA_VARIABLE) or None


def load(
    cls: type[T],
    section: str,
    *,
    file: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    flags: Mapping[str, str] | None = None,
) -> T:
    """An instance of the dataclass `cls` from its defaults and the given sources.

    `overrides` are the command line's flags; a None value means "flag not given". `flags`
    names the flag of a setting whose flag is not --<setting> (for the messages).
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    environment = os.environ if env is None else env
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}

    if file is not None:
        table = _read_section(file, section)
        for key, raw in table.items():
            name = key.replace("-", "_")
            if name not in fields:
                known = ", ".join(sorted(fields))
                raise BadRequest(f"{file}: [{section}] has no setting {key!r}; known: {known}")
            sources[name] = f"{file} [{section}] {key}"
            values[name] = _convert(raw, hints[name], sources[name])

    prefix = f"TALLY_{section.upper()}_"
    for var, raw in environment.items():
        if not var.startswith(prefix):
            continue
        name = var[len(prefix) :].lower()
        if name not in fields:
            raise BadRequest(
                f"environment variable {var} names no {section} setting; "
                f"known: {', '.join(prefix + n.upper() for n in sorted(fields))}"
            )
        sources[name] = f"environment variable {var}"
        values[name] = _convert(raw, hints[name], sources[name])

    for name, raw in (overrides or {}).items():
        if raw is None:
            continue
        if name not in fields:
            raise BadRequest(f"no {section} setting named {name!r}")
        flag = (flags or {}).get(name, f"--{name.replace('_', '-')}")
        sources[name] = f"option {flag}"
        values[name] = _convert(raw, hints[name], sources[name])

    if "metadata" in fields and "metadata" not in values:
        uri = metadata_uri(None, environment=environment)
        if uri is not None:
            sources["metadata"] = f"environment variable {METADATA_VARIABLE}"
            values["metadata"] = uri

    try:
        return cls(**values)
    except BadSetting as error:
        name = error.setting
        where = sources.get(name, "the default")
        shown = values[name] if name in values else getattr(fields[name], "default", "?")
        raise BadRequest(
            f"{section} setting {name} = {shown!r} (from {where}): {error.problem}"
        ) from None


def _read_section(file: Path, section: str) -> Mapping[str, Any]:
    try:
        with file.open("rb") as handle:
            document = tomllib.load(handle)
    except OSError as error:
        raise BadRequest(f"cannot read config file {file}: {error.strerror}") from error
    except tomllib.TOMLDecodeError as error:
        raise BadRequest(f"config file {file} is not valid TOML: {error}") from error
    table = document.get(section, {})
    if not isinstance(table, dict):
        raise BadRequest(f"{file}: {section} must be a table ([{section}])")
    return table


def _convert(raw: Any, hint: Any, where: str) -> Any:
    """`raw` (from TOML, a variable's text or a flag) as a value of type `hint`."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if raw is None or (isinstance(raw, str) and raw.strip().lower() in ("", "none")):
            return None
        return _convert(raw, options[0], where)
    if origin is tuple:
        (item,) = {a for a in typing.get_args(hint) if a is not Ellipsis}
        items = raw.split(",") if isinstance(raw, str) else raw
        if not isinstance(items, list | tuple):
            raise BadRequest(f"{where}: expected a list, got {raw!r}")
        return tuple(_convert(i.strip() if isinstance(i, str) else i, item, where) for i in items)
    if hint is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
            return raw.strip().lower() in _TRUE
        raise BadRequest(f"{where}: expected true or false, got {raw!r}")
    if hint in (int, float):
        if isinstance(raw, bool):
            raise BadRequest(f"{where}: expected a number, got {raw!r}")
        try:
            return hint(raw)
        except (TypeError, ValueError):
            raise BadRequest(f"{where}: expected {hint.__name__}, got {raw!r}") from None
    if hint is Path:
        return Path(raw)
    if hint is str:
        if not isinstance(raw, str):
            raise BadRequest(f"{where}: expected text, got {raw!r}")
        return raw
    raise TypeError(f"{where}: settings of type {hint!r} are not supported")
