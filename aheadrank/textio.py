"""The one line reader (collections, queries, qrels, run files): plain, gzip and zstandard files.

Compression is recognised by the file's magic bytes (not its name), so ``corpus.jsonl`` that is really
gzip-compressed still reads. Lines come back as raw ``bytes`` with their 1-based line number, so callers
can report invalid UTF-8 with the exact file and line instead of failing the whole file; :func:`text_lines`
decodes them. Errors are raised as the caller's error class (``error``; default :class:`CollectionError`).
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterator
from pathlib import Path

from aheadrank.errors import CollectionError

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
COMPRESSION_SUFFIXES = (".gz", ".zst", ".zstd")
_BOM = b"\xef\xbb\xbf"
# what is taken off a word's edges before it is looked up as a word (keyword pseudo-queries, the language guess)
EDGE_PUNCTUATION = "\"'.,;:!?()[]{}<>"
_BUFFER = 1 << 20


def strip_compression_suffix(name: str) -> str:
    """``corpus.jsonl.gz`` -> ``corpus.jsonl``; other names unchanged."""
    lowered = name.lower()
    for suffix in COMPRESSION_SUFFIXES:
        if lowered.endswith(suffix):
            return name[: -len(suffix)]
    return name


def open_binary(
    path: str | Path, error: type[Exception] = CollectionError, what: str = "cannot open"
) -> io.BufferedIOBase:
    """Open ``path`` for binary reading, transparently decompressing gzip or zstandard content."""
    path = Path(path)
    try:
        raw = open(path, "rb")  # noqa: SIM115 - returned to the caller, who closes it
    except OSError as exc:
        raise error(f"{what} {path}: {exc.strerror or exc}") from exc
    magic = raw.peek(4)[:4] if hasattr(raw, "peek") else b""
    if magic.startswith(GZIP_MAGIC):  # buffered itself; an outer buffer would lose the lines before a cut
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if magic.startswith(ZSTD_MAGIC):
        return io.BufferedReader(_ZstdRawReader(raw), buffer_size=_BUFFER)
    return raw


class _ZstdRawReader(io.RawIOBase):
    """Decompresses concatenated zstandard frames and, unlike ``ZstdDecompressor.stream_reader``, raises
    ``EOFError`` when the file ends inside a frame (a truncated file must not silently lose documents)."""

    def __init__(self, fh: io.BufferedIOBase) -> None:
        import zstandard

        self._fh = fh
        self._dctx = zstandard.ZstdDecompressor()
        self._obj = self._dctx.decompressobj()
        self._in_frame = False
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        while not self._pending:
            chunk = self._fh.read(_BUFFER)
            if not chunk:
                if self._in_frame:
                    raise EOFError("zstandard stream ends inside a frame (truncated file?)")
                return 0
            self._pending = memoryview(self._decompress(chunk))
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def _decompress(self, chunk: bytes) -> bytes:
        out = []
        while chunk:
            self._in_frame = True
            out.append(self._obj.decompress(chunk))
            if not self._obj.eof:
                break
            self._in_frame = False  # frame complete; anything left starts the next frame
            chunk = self._obj.unused_data
            self._obj = self._dctx.decompressobj()
        return b"".join(out)

    def close(self) -> None:
        self._fh.close()
        super().close()


def iter_lines(
    path: str | Path, error: type[Exception] = CollectionError, what: str = "cannot open"
) -> Iterator[tuple[int, bytes]]:
    """Yield ``(line_number, line)`` for every line of ``path``, without the line ending.

    A UTF-8 byte-order mark on the first line is dropped; ``\\r\\n`` endings are accepted. A corrupt
    compressed stream raises ``error`` naming the file and the last good line; ``what`` starts the message
    when the file cannot be opened.
    """
    lineno = 0
    with open_binary(path, error, what) as fh:
        while True:
            try:
                line = fh.readline()
            except Exception as exc:  # gzip: OSError/EOFError, zstandard: ZstdError
                raise error(
                    f"{path}:{lineno + 1}: cannot read/decompress after line {lineno:,} ({exc}); "
                    "the file is truncated or corrupt: restore it"
                ) from exc
            if not line:
                return
            lineno += 1
            if lineno == 1 and line.startswith(_BOM):
                line = line[len(_BOM) :]
            yield lineno, line.rstrip(b"\r\n")


def text_lines(
    path: str | Path,
    error: type[Exception] = CollectionError,
    skip_blank: bool = False,
    what: str = "cannot open",
) -> Iterator[tuple[int, str]]:
    """:func:`iter_lines` decoded as UTF-8 (invalid UTF-8 raises ``error`` naming file and line); blank lines
    are left out with ``skip_blank``."""
    for lineno, raw in iter_lines(path, error, what):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(f"{path}:{lineno}: invalid UTF-8 ({exc.reason})") from None
        if not skip_blank or line.strip():
            yield lineno, line


# What the first line of a two-column TSV calls its columns when it names them (pandas' `to_csv(sep="\t")` writes
# such a line): an id column, then a text column.
TSV_ID_NAMES = frozenset(
    {
        "id",
        "_id",
        "docid",
        "doc_id",
        "doc-id",
        "did",
        "pid",
        "passage_id",
        "passage-id",
        "corpus-id",
        "corpus_id",
    }
    | {"qid", "query_id", "query-id", "queryid"}
    | {"sku", "product_id", "item_id"}  # catalogues of short texts (docs/training.md, "Short texts")
)
TSV_TEXT_NAMES = frozenset(
    {"text", "contents", "content", "passage", "body", "document", "doc", "query", "question", "title"}
    | {"name", "product_name", "description", "answer", "sentence"}
)


def is_tsv_header(line: str) -> bool:
    """Whether a TSV's first line names its two columns (``docid<TAB>text``, ``qid<TAB>query``, any case) rather
    than holding a record: read as one, it would be a document called ``docid`` whose text is ``text``."""
    columns = [c.strip().lower() for c in line.rstrip("\r\n").split("\t")]
    return len(columns) == 2 and columns[0] in TSV_ID_NAMES and columns[1] in TSV_TEXT_NAMES
