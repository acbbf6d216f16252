"""The shape of a raw JSON body, measured before it is parsed: nesting depth and number of values.

Parsing a body sizes memory by its structure, not only by its bytes (an empty object costs ~64 bytes of
Python for its 3 bytes of JSON), and a body nested a few hundred levels deep parses but cannot be encoded
back (RecursionError: a 500 for input that should be a 4xx). :func:`shape_problem` checks both on the
bytes with C-speed passes (a regex that blanks out strings, ``bytes.translate`` and one numpy cumulative
sum) and never raises: a body that is not JSON is left for the parser to refuse.
"""

from __future__ import annotations

import re

import numpy as np

_STRING = re.compile(rb'"[^"]*"')  # once escapes are gone, no quote stands inside a string
_ALL = bytes(range(256))
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b"[]{},")
_STEP = np.zeros(256, dtype=np.int8)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1
_BLOCK = 1 << 20  # structure bytes per numpy pass: the scratch stays a few MB for any body


def structure(body: bytes) -> bytes:
    """The brackets and commas of ``body`` outside its strings, in order. Linear: escape pairs are dropped
    left to right (``\\\\`` first, so ``\\\\"`` still closes a string), then strings, then all but ``[]{},``."""
    plain = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    return _STRING.sub(b"", plain).translate(_ALL, _NOT_STRUCTURE)


def shape_problem(body: bytes, max_depth: int, max_values: int) -> str | None:
    """Why ``body`` is refused (nested deeper than ``max_depth``, more than ``max_values`` values), or None.

    Cheap for the common case: a body with no more brackets than ``max_depth`` cannot be too deep, and one
    with fewer commas and brackets than ``max_values`` cannot hold too many values, so neither is scanned."""
    opens = body.count(b"[") + body.count(b"{")
    if opens <= max_depth and opens + body.count(b",") < max_values:
        return None
    marks = structure(body)
    depth = deepest = 0
    for start in range(0, len(marks), _BLOCK):
        steps = _STEP[
            np.frombuffer(marks, dtype=np.uint8, count=min(_BLOCK, len(marks) - start), offset=start)
        ]
        levels = np.cumsum(steps, dtype=np.int64) + depth
        deepest = max(deepest, int(levels.max()))
        depth = int(levels[-1])
        if deepest > max_depth:
            return (
                f"the JSON body is nested more than {max_depth} levels deep (--max-json-depth / "
                "AHEADRANK_MAX_JSON_DEPTH)"
            )
    values = marks.count(b",") + marks.count(b"[") + marks.count(b"{")
    if values > max_values:
        return (
            f"the JSON body holds about {values} values (items of arrays and objects); the limit is {max_values} "
            "(it follows --max-documents and --max-candidates)"
        )
    return None


def max_values(settings) -> int:
    """The most values a body may hold: room for every document or candidate with a few dozen fields each."""
    return max(100_000, 32 * max(settings.max_documents, settings.max_candidates))
