"""The record family and its one JSON codec.

Records that cross a layer or leave the process (the ledger entry and its parts, the
audit's and the journal's records) are msgspec Structs deriving from ``Record``. JSON is
made from them and read back into them only here: ``to_json`` gives the builtins of a JSON
document, ``encode`` its bytes; ``from_json`` and ``decode`` check a document against a
record type. Amounts (``Usd``, a ``Cost``'s total) are written as decimal strings or ``"unknown"``; a stored
document written before a field existed still reads (new fields have defaults).
"""

from __future__ import annotations

import functools
import sys
from decimal import Decimal
from typing import Any, TypeVar, overload

import msgspec

from stayer.money import Usd

T = TypeVar("T")


class Record(msgspec.Struct):
    """A record of the family: typed attributes inside, JSON only through this module. (A
    record with defaulted fields before required ones says ``kw_only=True`` itself: msgspec
    does not inherit it.)

    ``record[name]`` reads a field as its JSON document has it (by its JSON name, as JSON
    builtins; ``KeyError`` where the document has no such field): for readers written
    against the documents (the tests' assertions); stayer's own code reads attributes."""

    def __getitem__(self, key: str) -> Any:
        names = _json_names(type(self))
        if key not in names:
            raise KeyError(key)
        value = getattr(self, names[key])
        if value is msgspec.UNSET:
            raise KeyError(key)
        return to_json(value)

    def __eq__(self, other: object) -> bool:
        # A record equals the JSON document it encodes to, as well as a record of its kind.
        if isinstance(other, dict):
            return to_json(self) == other
        if type(other) is not type(self):
            return NotImplemented
        return msgspec.structs.astuple(self) == msgspec.structs.astuple(other)  # type: ignore[arg-type]


@functools.cache
def _json_names(cls: type[msgspec.Struct]) -> dict[str, str]:
    return {f.encode_name: f.name for f in msgspec.structs.fields(cls)}


# stayer.pricing (and its price data) is loaded only where a Cost exists: a record that
# holds none (an eval's trial, re-rendered without running anything) does not load it.


def _enc_hook(o: Any) -> Any:
    pricing = sys.modules.get("stayer.pricing")
    if isinstance(o, Usd) or (pricing is not None and isinstance(o, pricing.Cost)):
        return o.to_json()
    raise NotImplementedError(f"cannot encode a {type(o).__name__}")


def _dec_hook(t: type, o: Any) -> Any:
    if t is Usd and (o is None or isinstance(o, str | int | float | Decimal)):
        return Usd.parse(o if not isinstance(o, int | float) else Decimal(str(o)))
    pricing = sys.modules.get("stayer.pricing")  # a record declaring a Cost imported it
    if (
        pricing is not None
        and t is pricing.Cost
        and (o is None or isinstance(o, str | int | float | Decimal))
    ):
        return pricing.Cost(_dec_hook(Usd, o).amount, None, None, "")
    raise NotImplementedError(f"cannot decode a {t.__name__}")


_encoder = msgspec.json.Encoder(enc_hook=_enc_hook)


@overload
def to_json(value: msgspec.Struct) -> dict[str, Any]: ...
@overload
def to_json(value: Any) -> Any: ...
def to_json(value: Any) -> Any:
    """``value`` (records, Usd, containers of them) as JSON builtins: a record as an
    object."""
    return msgspec.to_builtins(value, enc_hook=_enc_hook)


def encode(value: Any) -> bytes:
    """``value`` as JSON bytes."""
    return _encoder.encode(value)


def from_json(value: Any, type_: type[T]) -> T:
    """JSON builtins as a ``type_``; a wrong shape raises ``msgspec.ValidationError``."""
    return msgspec.convert(value, type_, strict=False, dec_hook=_dec_hook)


def decode(data: bytes | str, type_: type[T]) -> T:
    """JSON bytes as a ``type_``."""
    return msgspec.json.decode(data, type=type_, strict=False, dec_hook=_dec_hook)
