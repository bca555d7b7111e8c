"""Text from a profile or a file name made safe to print on one line.

Kept apart from `parsers.values` (numpy, pyarrow) so the command line can print an error before
it loads any heavy library.
"""

from __future__ import annotations

_ESCAPES = {i: f"\\x{i:02x}" for i in (*range(32), 0x7F, 0x85)} | {
    ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t", 0x2028: "\\u2028", 0x2029: "\\u2029"}


def printable(text: str) -> str:
    """Text that prints on one line and encodes as UTF-8: control characters and line breaks
    escaped (a newline in a file name must not split an error line), the undecodable bytes of
    a file name (surrogate escapes) as \\xNN."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that is no escaped byte
        raw = text.encode("utf-8", "backslashreplace")
    return raw.decode("utf-8", "backslashreplace").translate(_ESCAPES)
