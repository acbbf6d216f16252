"""Document collections: BEIR JSONL, Pyserini JsonCollection JSONL and TSV, plain, ``.gz`` or ``.zst``.

``Collection(path)`` streams :class:`Document` objects lazily. The same text (see :func:`join_title_text`)
feeds BM25 and the encoders, so the two indexes always see the same document.

Problem policy (see ``indexer/README.md``): every malformed line (invalid UTF-8, bad JSON, missing id,
missing text field, wrong TSV column count, blank line), every duplicate docid (the first valid occurrence
is kept) and every empty document is recorded in a :class:`CollectionReport` with file and line. By
default the record is skipped and counted, and a warning summary is logged at the end of the pass; with
``strict=True`` the first problem raises :class:`aheadrank.errors.CollectionError`.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from aheadrank.errors import CollectionError
from aheadrank.textio import is_tsv_header, iter_lines, strip_compression_suffix

log = logging.getLogger(__name__)

CORPUS_NAMES = ("corpus.jsonl", "corpus.jsonl.gz", "corpus.jsonl.zst", "corpus.tsv", "corpus.tsv.gz")
JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
TSV_SUFFIXES = (".tsv", ".tab")
_SENTENCE_END = (".", "!", "?", ":", ";")
_SURROGATE = re.compile("[\ud800-\udfff]")
_SNIFF_LINES = 100


@dataclass(frozen=True, slots=True)
class Document:
    """One collection document: its id and the single text both BM25 and the encoders index."""

    docid: str
    text: str


class CollectionFormat(str, Enum):
    """On-disk collection formats; ``auto`` picks one from the file name and the first record."""

    AUTO = "auto"
    BEIR = "beir"  # JSONL {"_id", "title", "text"}
    PYSERINI = "pyserini"  # JSONL {"id", "contents"} (Pyserini / Anserini JsonCollection)
    TSV = "tsv"  # docid<TAB>text


class ProblemKind(str, Enum):
    """The kinds of problems a collection pass reports."""

    INVALID_UTF8 = "invalid_utf8"
    BAD_JSON = "bad_json"
    MISSING_ID = "missing_id"
    INVALID_ID = "invalid_id"
    MISSING_TEXT = "missing_text"
    BAD_COLUMNS = "bad_columns"
    BLANK_LINE = "blank_line"
    DUPLICATE_ID = "duplicate_id"
    EMPTY_DOCUMENT = "empty_document"


@dataclass(frozen=True, slots=True)
class Problem:
    kind: ProblemKind
    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.kind.value}: {self.message}"


# the problem summaries this process has warned of: each collection's problems are warned of once, not again at
# every later pass over it (``aheadrank build`` reads it in five stages)
_WARNED: set[str] = set()


@dataclass
class CollectionReport:
    """What one pass over a collection saw: counts per problem kind plus the first examples."""

    max_examples: int = 10
    files: list[str] = field(default_factory=list)
    lines: int = 0
    documents: int = 0
    headers: int = 0  # TSV first lines naming the columns (``docid<TAB>text``): no record, no problem
    counts: Counter[str] = field(default_factory=Counter)
    examples: list[Problem] = field(default_factory=list)

    @property
    def problems(self) -> int:
        return sum(self.counts.values())

    @property
    def skipped(self) -> int:
        """Records not yielded (equal to :attr:`problems`: every problem skips exactly one record)."""
        return self.problems

    def add(self, problem: Problem) -> None:
        self.counts[problem.kind.value] += 1
        if len(self.examples) < self.max_examples:
            self.examples.append(problem)

    def summary(self) -> str:
        where = ", ".join(self.files) if len(self.files) <= 3 else f"{len(self.files)} files"
        head = f"{where}: {self.documents:,} documents from {self.lines:,} lines"
        if self.headers:
            named = "a header line" if self.headers == 1 else f"{self.headers:,} header lines"
            head += f" ({named} naming the columns skipped)"
        if not self.problems:
            return head + ", no problems"
        kinds = ", ".join(f"{kind} {n:,}" for kind, n in sorted(self.counts.items()))
        lines = [f"{head}; skipped {self.problems:,} ({kinds}); first examples:"]
        lines += [f"  {p}" for p in self.examples]
        return "\n".join(lines)

    def log(self, logger: logging.Logger = log) -> None:
        if self.problems:
            said = self.summary()
            # the same file read again (a build's later stages): said once, at the first pass
            if said in _WARNED:
                logger.debug("collection problems, as warned before: %s", said)
            else:
                _WARNED.add(said)
                logger.warning("collection problems: %s", said)
        else:
            logger.info("collection read: %s", self.summary())

    def to_dict(self) -> dict[str, object]:
        return {
            "files": list(self.files),
            "lines": self.lines,
            "documents": self.documents,
            "headers": self.headers,
            "problems": dict(sorted(self.counts.items())),
            "examples": [str(p) for p in self.examples],
        }


def join_title_text(title: str | None, text: str | None) -> str:
    """The one rule joining a title and a body, used for BM25 and for every encoder.

    Both parts are stripped. With a title, the result is ``"{title}. {text}"``, except that no period is
    added when the title already ends in ``. ! ? : ;`` (``"{title} {text}"``). An empty title gives the
    text alone, an empty text the title alone.
    """
    title = (title or "").strip()
    text = (text or "").strip()
    if not title:
        return text
    if not text:
        return title
    if title.endswith(_SENTENCE_END):
        return f"{title} {text}"
    return f"{title}. {text}"


def is_blank(text: str) -> bool:
    """True when ``text`` has no content: only whitespace or control characters.

    Matches both Python's ``str.isspace`` and Java's ``String.trim`` (chars <= U+0020), so a document
    counted as non-empty here is never dropped as empty by Lucene, and vice versa.
    """
    return all(c <= " " or c.isspace() for c in text)


class _Skip(Exception):  # noqa: N818 - internal control flow, not an error type
    def __init__(self, kind: ProblemKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _absent(record: dict, key: str) -> str:
    """Why ``record[key]`` is None: the field is not there, or it is ``null``."""
    return f"{key!r} is null" if key in record else f"no {key!r} field"


def _as_id(record: dict, key: str) -> str:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        if value is None:
            raise _Skip(ProblemKind.MISSING_ID, _absent(record, key))
        raise _Skip(ProblemKind.MISSING_ID, f"{key!r} is a {type(value).__name__}, not a string")
    docid = str(value).strip()
    if not docid:
        raise _Skip(ProblemKind.MISSING_ID, f"empty {key!r}")
    if "\x00" in docid:  # one policy for bm25-index and index: the store cannot hold such a docid
        raise _Skip(ProblemKind.INVALID_ID, f"{key!r} {docid!r} contains a NUL character")
    return docid


def _as_text(record: dict, key: str, *, required: bool) -> str:
    value = record.get(key)
    if value is None:
        if required:
            raise _Skip(ProblemKind.MISSING_TEXT, _absent(record, key))
        return ""
    if not isinstance(value, str):
        raise _Skip(ProblemKind.MISSING_TEXT, f"{key!r} is a {type(value).__name__}, not a string")
    if _SURROGATE.search(value):
        raise _Skip(ProblemKind.INVALID_UTF8, f"{key!r} holds a lone surrogate escape (not valid UTF-8)")
    return value


def _load_json(line: str) -> dict:
    try:
        record = json.loads(line)
    except ValueError as exc:
        raise _Skip(ProblemKind.BAD_JSON, f"invalid JSON ({exc})") from None
    if not isinstance(record, dict):
        raise _Skip(ProblemKind.BAD_JSON, f"a JSON {type(record).__name__}, not an object")
    return record


# every parser returns (docid, title, body); formats without a title give "" (the text is the body)
def _parse_beir(line: str) -> tuple[str, str, str]:
    record = _load_json(line)
    docid = _as_id(record, "id" if "_id" not in record and "id" in record else "_id")  # {"id", "text"} too
    text = _as_text(record, "text", required=True)
    return docid, _as_text(record, "title", required=False).strip(), text.strip()


def _parse_pyserini(line: str) -> tuple[str, str, str]:
    record = _load_json(line)
    docid = _as_id(record, "id")
    return docid, "", _as_text(record, "contents", required=True).strip()


def _columns(n: int) -> str:
    return f"{n} tab-separated column" + ("" if n == 1 else "s")


def _parse_tsv(line: str) -> tuple[str, str, str]:
    columns = line.split("\t")
    if len(columns) != 2:
        hint = ""
        if len(columns) == 1:  # the rest of a text that a CSV writer quoted across lines, most often
            hint = "; TSV is read one record a line, without CSV quoting (a quoted text over several lines?)"
        raise _Skip(ProblemKind.BAD_COLUMNS, f"{_columns(len(columns))}, expected 2 (docid, text){hint}")
    docid = columns[0].strip()
    if not docid:
        raise _Skip(ProblemKind.MISSING_ID, "empty docid column")
    if "\x00" in docid:
        raise _Skip(ProblemKind.INVALID_ID, f"docid {docid!r} contains a NUL character")
    return docid, "", columns[1].strip()


_PARSERS = {
    CollectionFormat.BEIR: _parse_beir,
    CollectionFormat.PYSERINI: _parse_pyserini,
    CollectionFormat.TSV: _parse_tsv,
}


def resolve_files(path: str | Path) -> list[Path]:
    """The files of a collection: the file itself, a BEIR directory's ``corpus.jsonl[.gz|.zst]``, or
    else every ``*.jsonl`` / ``*.json`` / ``*.tsv`` (optionally compressed) file of a directory, sorted."""
    path = Path(path)
    if not path.exists():
        raise CollectionError(f"collection not found: {path}")
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise CollectionError(f"collection is neither a file nor a directory: {path}")
    for name in CORPUS_NAMES:
        if (path / name).is_file():
            return [path / name]
    known = JSON_SUFFIXES + TSV_SUFFIXES
    files = sorted(
        p for p in path.iterdir() if p.is_file() and strip_compression_suffix(p.name).lower().endswith(known)
    )
    if not files:
        raise CollectionError(
            f"no collection files in directory {path} (expected corpus.jsonl or *.jsonl / *.tsv files)"
        )
    return files


def _sniff_json(path: Path) -> CollectionFormat:
    lineno = 0
    blank = True
    for lineno, raw in iter_lines(path):
        if lineno > _SNIFF_LINES:
            break
        blank = blank and not raw.strip()
        try:
            record = json.loads(raw.decode("utf-8"))
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if "_id" in record:
            return CollectionFormat.BEIR
        if "id" in record and "contents" in record:
            return CollectionFormat.PYSERINI
        if "id" in record and "text" in record:  # BEIR's fields with the id named as most JSONL files name it
            return CollectionFormat.BEIR
        raise CollectionError(
            f"{path}:{lineno}: cannot tell the JSONL flavour from keys {sorted(record)}: expected '_id' (or "
            "'id'), 'text' and an optional 'title' (BEIR), or 'id' and 'contents' (Pyserini); rename the keys"
        )
    if blank:
        raise CollectionError(f"{path}: the file holds no documents (it is empty or blank)")
    raise CollectionError(f"{path}: no JSON object in the first {min(lineno, _SNIFF_LINES)} lines")


def detect_format(path: str | Path) -> CollectionFormat:
    """Guess the format of one collection file from its name, then from its first records."""
    path = Path(path)
    name = strip_compression_suffix(path.name).lower()
    if name.endswith(TSV_SUFFIXES):
        return CollectionFormat.TSV
    if name.endswith(JSON_SUFFIXES):
        return _sniff_json(path)
    for lineno, raw in iter_lines(path):
        if lineno > _SNIFF_LINES:
            break
        stripped = raw.strip()
        if stripped.startswith(b"{"):
            return _sniff_json(path)
        if b"\t" in stripped:
            return CollectionFormat.TSV
    raise CollectionError(
        f"{path}: cannot detect the collection format: expected JSON lines (BEIR's _id, title, text or Pyserini's "
        "id, contents) or TSV lines (docid<TAB>text), plain, .gz or .zst; convert a CSV file to one of these"
    )


class Collection:
    """A document collection on disk, read lazily, any number of times.

    ``for doc in Collection(path): ...`` streams valid documents; after each complete pass
    :attr:`report` holds that pass's :class:`CollectionReport` (a fresh one per pass).
    """

    def __init__(
        self,
        path: str | Path,
        fmt: CollectionFormat | str = CollectionFormat.AUTO,
        *,
        strict: bool = False,
        max_examples: int = 10,
        check_duplicates: bool = True,
    ) -> None:
        self.path = Path(path)
        self.files = resolve_files(self.path)
        try:
            fmt = CollectionFormat(fmt)
        except ValueError:
            choices = ", ".join(f.value for f in CollectionFormat)
            raise CollectionError(f"unknown collection format {fmt!r} (choose from {choices})") from None
        # each file's own (a folder may hold JSONL and TSV parts alike); ``format`` is the first file's
        self.formats = [detect_format(f) if fmt is CollectionFormat.AUTO else fmt for f in self.files]
        self.format = self.formats[0]
        self.strict = strict
        self.max_examples = max_examples
        self.check_duplicates = check_duplicates
        self.report = CollectionReport(max_examples=max_examples, files=[str(f) for f in self.files])

    def __repr__(self) -> str:
        return f"Collection({str(self.path)!r}, fmt={self.format.value!r}, strict={self.strict})"

    @property
    def format_name(self) -> str:
        """The files' formats, each once in file order: ``beir``, or ``beir+tsv`` for a folder of both."""
        return "+".join(dict.fromkeys(f.value for f in self.formats))

    def __iter__(self) -> Iterator[Document]:
        for docid, title, body in self.titled():
            yield Document(docid, join_title_text(title, body))

    def titled(self) -> Iterator[tuple[str, str, str]]:
        """``(docid, title, body)`` of each valid document, before :func:`join_title_text` makes its one text
        (formats without titles give ``""``): the same records, checks and report as iterating the collection.
        """
        report = self.report = CollectionReport(
            max_examples=self.max_examples, files=[str(f) for f in self.files]
        )
        seen: set[str] = set()

        def problem(kind: ProblemKind, file: Path, lineno: int, message: str) -> None:
            found = Problem(kind, str(file), lineno, message)
            if self.strict:
                raise CollectionError(f"{found} (strict mode; drop --strict to skip and count such records)")
            report.add(found)

        for file, fmt in zip(self.files, self.formats, strict=True):
            parse = _PARSERS[fmt]
            for lineno, raw in iter_lines(file):
                report.lines += 1
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    problem(
                        ProblemKind.INVALID_UTF8,
                        file,
                        lineno,
                        f"invalid UTF-8 ({exc.reason} at byte {exc.start})",
                    )
                    continue
                if not line.strip():
                    problem(ProblemKind.BLANK_LINE, file, lineno, "blank line")
                    continue
                if lineno == 1 and fmt is CollectionFormat.TSV and is_tsv_header(line):
                    report.headers += 1
                    continue
                try:
                    docid, title, body = parse(line)
                except _Skip as skip:
                    problem(skip.kind, file, lineno, str(skip))
                    continue
                if is_blank(join_title_text(title, body)):
                    problem(ProblemKind.EMPTY_DOCUMENT, file, lineno, f"document {docid!r} has no text")
                    continue
                if self.check_duplicates:
                    if docid in seen:
                        problem(
                            ProblemKind.DUPLICATE_ID,
                            file,
                            lineno,
                            f"docid {docid!r} seen before" + ("" if self.strict else " (first kept)"),
                        )
                        continue
                    seen.add(docid)
                report.documents += 1
                yield docid, title, body
        report.log()


def read_collection(
    path: str | Path,
    fmt: CollectionFormat | str = CollectionFormat.AUTO,
    *,
    strict: bool = False,
    max_examples: int = 10,
) -> Collection:
    """Open a collection (files resolved and format detected now; documents read lazily on iteration)."""
    return Collection(path, fmt, strict=strict, max_examples=max_examples)


# queries and qrels live in their own module; re-exported here for convenience
from aheadrank.indexer.topics import read_beir_split, read_qrels, read_queries  # noqa: E402

__all__ = [
    "Collection",
    "CollectionFormat",
    "CollectionReport",
    "Document",
    "Problem",
    "ProblemKind",
    "detect_format",
    "is_blank",
    "join_title_text",
    "read_beir_split",
    "read_collection",
    "read_qrels",
    "read_queries",
    "resolve_files",
]
