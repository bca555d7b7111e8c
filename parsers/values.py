"""Raw values of a profile as the normalized tables hold them, converted without ever raising.

Profiles arrive cut, hand-edited and from profiler versions nobody here has seen: a number may
be text, thirty digits long, 1e308, "nan" or absent; a name may run to megabytes; a file name
may not be UTF-8. Parsers convert what they read with these helpers. A value that cannot be read,
or lies beyond int64, becomes UNREADABLE; text longer than its limit is cut, ending in CUT_MARK.
`parsers.validate` then drops, clamps and counts what they marked, once per profile.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracegraph.schema import NO_INT

UNREADABLE = int(np.iinfo(np.int64).min)
"""An integer column's mark for a raw value that could not be read (int32 columns: INT32_MIN)."""
NAME_LIMIT = 16 << 10
"""Characters kept of a name (the longest real op names, C++ kernel templates, run to ~5,000)."""
LABEL_LIMIT = 256
"""Characters kept of a string copied onto many rows: an annotation, a thread's name."""
CUT_MARK = "…"
_INT64_MAX = int(np.iinfo(np.int64).max)
_INT32_MAX = int(np.iinfo(np.int32).max)
_MICROS_LIMIT = 9e15  # |µs| whose ns still fit int64


# --- integers ------------------------------------------------------------------------------------
def int64(value: int) -> int:
    """`value` when int64 holds it, else UNREADABLE."""
    return value if -_INT64_MAX <= value <= _INT64_MAX else UNREADABLE


def to_int(value: object, missing: int = NO_INT) -> int:
    """An int from a JSON / CSV value: an int, a finite float (truncated), decimal or 0x-hex
    text; `missing` for None or empty text, UNREADABLE for anything else or beyond int64."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return missing
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return int64(value)
    if isinstance(value, float):
        return int64(int(value)) if math.isfinite(value) else UNREADABLE
    if isinstance(value, str):
        return _text_int(value.strip())
    return UNREADABLE


def _text_int(text: str) -> int:
    for parse in (lambda t: int(t, 0), int):  # 0x1f and 42; then 007
        try:
            return int64(parse(text))
        except ValueError:
            pass
    try:
        number = float(text)  # "12.0"
    except ValueError:
        return UNREADABLE
    return int64(int(number)) if math.isfinite(number) else UNREADABLE


def ints(values: Sequence[object], missing: int = NO_INT) -> np.ndarray:
    """An int64 column from JSON / CSV values (`to_int` for each)."""
    try:
        return np.fromiter(values, np.int64, len(values))  # all plain ints: the common case
    except (TypeError, ValueError, OverflowError):
        return np.fromiter((to_int(v, missing) for v in values), np.int64, len(values))


def rank_id(value: object) -> int | None:
    """A global rank from a JSON / CSV value or a file name's digits; None when it states none
    (absent, negative as msprof's -1, unreadable or beyond int32)."""
    rank = to_int(value)
    return rank if 0 <= rank <= _INT32_MAX else None


# --- times ---------------------------------------------------------------------------------------
def micros_to_ns(values: Sequence[object], unit_us: float = 1.0) -> np.ndarray:
    """Times in units of `unit_us` µs (numbers or numeric text) -> int64 ns; UNREADABLE for a
    missing, non-numeric, non-finite or out-of-range value. Only the fraction is scaled, so
    epoch µs (~1.7e15) lose nothing beyond what the float already lost."""
    with np.errstate(over="ignore", invalid="ignore"):  # what overflows is marked below
        micros = _floats(values) * unit_us
    ok = np.isfinite(micros) & (np.abs(micros) < _MICROS_LIMIT)
    micros = np.where(ok, micros, 0.0)
    whole = np.floor(micros)
    ns = whole.astype(np.int64) * 1000 + np.rint((micros - whole) * 1e3).astype(np.int64)
    ns = np.where((micros < 0) & (ns == 0), -1, ns)  # -1e-9 µs: negative, as said, not 0
    return np.where(ok, ns, UNREADABLE)


def _floats(values: Sequence[object]) -> np.ndarray:
    try:
        return np.fromiter(values, np.float64, len(values))  # None -> nan
    except (TypeError, ValueError, OverflowError):
        return np.fromiter((_to_float(v) for v in values), np.float64, len(values))


def _to_float(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return math.nan


DECIMAL = r"^\s*(?P<whole>-?\d{1,16})(?:\.(?P<frac>\d*))?\s*$"


def decimal_micros_to_ns(values: Sequence[object]) -> np.ndarray:
    """Decimal µs ("1736412474757059.740", or a number) -> int64 ns, exactly (never via float);
    UNREADABLE for a missing or unreadable value, or one beyond int64 ns."""
    text = _decimal_text(values)
    parts = pc.extract_regex(text, DECIMAL)
    matched = pc.is_valid(parts)
    whole_text = pc.if_else(matched, parts.field("whole"), "0")  # a null struct's fields are
    whole = pc.cast(whole_text, pa.int64())  # undefined
    ok = pc.and_(matched, pc.less(pc.abs(whole), int(_MICROS_LIMIT)))
    frac = pc.utf8_rpad(pc.if_else(matched, parts.field("frac"), ""), 3, "0")
    frac = pc.cast(pc.utf8_slice_codeunits(frac, 0, 3), pa.int64())
    negative = pc.starts_with(whole_text, "-")
    ns = pc.add(pc.multiply(pc.if_else(ok, whole, 0), 1000),
                pc.if_else(negative, pc.negate(frac), frac))
    return pc.if_else(ok, ns, UNREADABLE).to_numpy()


def _decimal_text(values: Sequence[object]) -> pa.Array:
    try:
        return pa.array(values, type=pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return pa.array([_number_text(v) for v in values], type=pa.string())


def _number_text(value: object) -> str | None:
    """A number as the decimal text it was most likely written as (None when not a number)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, float):
        text = repr(value)
        return format(value, ".3f") if "e" in text and math.isfinite(value) else text
    return str(value) if isinstance(value, int) else None


# --- text ----------------------------------------------------------------------------------------
def cut(text: str, limit: int = NAME_LIMIT) -> str:
    """`text`, or its first characters ending in CUT_MARK when longer than `limit`."""
    return text if len(text) <= limit else text[: limit - 1] + CUT_MARK


def capped(text: pa.Array, limit: int = NAME_LIMIT) -> pa.Array:
    """A string column with every value longer than `limit` cut (see `cut`)."""
    long = pc.fill_null(pc.greater(pc.utf8_length(text), limit), False)
    if not pc.any(long).as_py():
        return text
    short = pc.binary_join_element_wise(pc.utf8_slice_codeunits(text, 0, limit - 1), CUT_MARK,
                                        "")
    return pc.if_else(long, short, text)


def texts(values: Iterable[object], limit: int = NAME_LIMIT) -> pa.Array:
    """A string column from raw values (None stays null, non-strings as their text), cut."""
    values = list(values)
    try:
        array = pa.array(values, type=pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        array = pa.array([None if v is None else cut(str(v), limit) for v in values],
                         type=pa.string())
    return capped(array, limit)
