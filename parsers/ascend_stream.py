"""A JSON array of trace events read and decoded a slice at a time, never held whole.

Ascend timelines (trace_view.json, msprof_*.json) are JSON arrays of events that reach gigabytes
per rank. The file is read SLICE_BYTES at a time; each slice is cut after its last complete event
(a `}` then `,` then the next event's `{`) and decoded by msgspec into the caller's event type.
A cut that falls inside a string or a nested object leaves the slice unterminated, which the
decoder reports, and the cut before it is tried instead, so no scan of string state is needed.

What is not a plain array of well-formed events (an object at the top, invalid JSON, an event
the type does not fit) raises `Whole`: the caller decodes that file whole, whose errors name what
is wrong where. A file that ends before its array closes raises `Truncated` with what is left of
the array, for the caller to salvage.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import BinaryIO

import msgspec

SLICE_BYTES = 8 << 20  # bytes of JSON decoded at once: bounds the decoded events held at once
_BOUNDARY = re.compile(rb"\}[ \t\n\r]*,[ \t\n\r]*\{")
_CUT_TRIES = 8  # cuts tried per slice before the slice is taken for damaged
_WINDOW = 1 << 16  # bytes at the end of a slice searched for its cuts first
_OPENING = re.compile(rb"[ \t\n\r]*\[")  # JSON whitespace, the array's bracket
_OPEN, _CLOSE = ord("["), ord("]")

Decode = Callable[[memoryview | bytearray], list]
"""A JSON array of events -> the events; msgspec's errors where it is no such array."""


class Whole(Exception):
    """The file is no plain array of well-formed events: decode it whole."""


class Truncated(Exception):
    """The file ends before its array closes; `rest` holds the array from its first event not
    yet decoded, after a `[`."""

    def __init__(self, rest: bytes) -> None:
        super().__init__("truncated")
        self.rest = rest


def event_slices(stream: BinaryIO, decode: Decode) -> Iterator[list]:
    """The events of the JSON array `stream` holds, decoded by `decode` a slice of about
    SLICE_BYTES at a time (more where one event is larger). The slice is decoded where it lies
    in the read buffer: the separator before it set to `[`, the one after it to `]`."""
    slice_bytes = SLICE_BYTES
    buffer = bytearray(stream.read(slice_bytes))
    opening = _OPENING.match(buffer)
    if opening is None:
        raise Whole
    del buffer[:opening.end() - 1]  # from the `[` on
    while chunk := stream.read(slice_bytes):
        buffer += chunk
        if len(buffer) < slice_bytes:  # a short read: fill the slice first
            continue
        events, rest = _leading_events(buffer, decode)
        if events:
            yield events
            del buffer[:rest]
            buffer[0] = _OPEN
    yield _last_events(buffer, decode)


def _leading_events(buffer: bytearray, decode: Decode) -> tuple[list, int]:
    """The complete events at the start of `buffer` (`[`, then events) and where the separator
    after them lies; none when no cut is found (an event longer than `buffer`: more is read)."""
    cuts = _cuts(buffer)
    for cut in cuts:
        after = buffer[cut]
        buffer[cut] = _CLOSE
        try:
            with memoryview(buffer) as view, view[:cut + 1] as part:
                events = decode(part)
        except msgspec.ValidationError:
            raise Whole from None
        except (msgspec.DecodeError, RecursionError) as error:
            if "truncated" not in str(error):
                raise Whole from None
            continue
        finally:
            buffer[cut] = after
        return events, buffer.index(b",", cut)
    if len(cuts) == _CUT_TRIES:
        raise Whole  # as many cuts as are tried, none after a whole event: damaged
    return [], 0


def _cuts(data: bytearray) -> list[int]:
    """Where `data` may be cut after a complete event (just past its `}`), last first, at most
    _CUT_TRIES of them."""
    start = max(0, len(data) - _WINDOW)
    while True:
        found = [m.start() + 1 for m in _BOUNDARY.finditer(data, start)]
        if len(found) >= _CUT_TRIES or start == 0:
            return found[::-1][:_CUT_TRIES]
        start = max(0, start - 8 * (len(data) - start))


def _last_events(buffer: bytearray, decode: Decode) -> list:
    """The events of the array's last slice, `buffer` (`[`, then events) running to its
    closing bracket."""
    try:
        return decode(buffer)
    except msgspec.ValidationError:
        raise Whole from None
    except (msgspec.DecodeError, RecursionError) as error:
        if "truncated" in str(error):
            raise Truncated(bytes(buffer)) from None
        raise Whole from None
