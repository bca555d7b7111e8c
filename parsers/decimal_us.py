"""Decimal microsecond timestamps ("1736412474757059.740") -> integer nanoseconds, exactly."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from parsers.base import TraceError

DECIMAL = r"^\s*(?P<whole>-?\d+)(?:\.(?P<frac>\d*))?\s*$"
"""An exact decimal number of µs (what profilers write; a spreadsheet's `1.69512E+15` is not)."""


def us_to_ns(values: Sequence[object], where: str) -> np.ndarray:
    """Decimal µs ("1736412474757059.740" or a number) -> integer ns, exactly (never via float)."""
    text = _decimal_text(values)
    parts = pc.extract_regex(text, DECIMAL)
    if parts.null_count:
        bad = text.filter(pc.is_null(parts))[0].as_py()
        raise TraceError(f"{where}: unreadable timestamp {bad!r}")
    whole = pc.cast(parts.field("whole"), pa.int64())
    frac = pc.cast(pc.utf8_slice_codeunits(pc.utf8_rpad(parts.field("frac"), 3, "0"), 0, 3),
                   pa.int64())
    negative = pc.starts_with(parts.field("whole"), "-")
    signed = pc.if_else(negative, pc.negate(frac), frac)
    return pc.add(pc.multiply(whole, 1000), signed).to_numpy()


def _decimal_text(values: Sequence[object]) -> pa.Array:
    try:
        return pa.array(values, type=pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([_number_text(v) for v in values], type=pa.string())


def _number_text(value: object) -> str | None:
    """A number as the decimal text it was most likely written as."""
    if value is None or isinstance(value, str):
        return value
    text = repr(value)
    return format(value, ".3f") if isinstance(value, float) and "e" in text else text
