"""Queries and relevance judgements (qrels), for training and evaluation.

* Queries: BEIR ``queries.jsonl`` (``_id``, ``text``; ``id`` accepted too) or TSV ``qid<TAB>text``.
* Qrels: BEIR ``qrels/<split>.tsv`` (``query-id  corpus-id  score``, header optional) or TREC
  ``qid 0 docid rel`` (whitespace-separated); the kind is told per line by its column count.

Both accept plain, ``.gz`` and ``.zst`` files. These files are small and hand-made, so the policy is strict:
any malformed line, duplicate query id or conflicting judgement raises
:class:`aheadrank.errors.CollectionError` with file and line. Blank lines are ignored.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from aheadrank.errors import CollectionError
from aheadrank.evaluation import Qrels
from aheadrank.textio import is_tsv_header, strip_compression_suffix, text_lines

_QRELS_HEADER = ("query-id", "corpus-id", "score")


def _text_lines(path: Path) -> Iterator[tuple[int, str]]:
    return text_lines(path, CollectionError, skip_blank=True)


# the queries file of a BEIR directory, the first of these found (read_queries; the build's fingerprint)
QUERY_NAMES = ("queries.jsonl", "queries.jsonl.gz", "queries.jsonl.zst", "queries.tsv")


def _existing(path: Path, *candidates: str) -> Path:
    if path.is_dir():
        for name in candidates:
            if (path / name).is_file():
                return path / name
        raise CollectionError(f"none of {', '.join(candidates)} in directory {path}")
    if not path.is_file():
        raise CollectionError(f"file not found: {path}")
    return path


def _query_from_json(line: str) -> tuple[object, object]:
    try:
        record = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"invalid JSON ({exc})") from None
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    return record.get("_id", record.get("id")), record.get("text")


def _query_from_tsv(line: str) -> tuple[object, object]:
    columns = line.rstrip("\r\n").split("\t")
    if len(columns) != 2:
        raise ValueError(f"{len(columns)} tab-separated column(s), expected 2 (qid, text)")
    return columns[0], columns[1]


def read_queries(path: str | Path) -> dict[str, str]:
    """Read queries into ``{qid: text}`` in file order.

    ``path`` is a ``queries.jsonl`` / ``.tsv`` file (optionally compressed) or a BEIR directory
    (``queries.jsonl`` inside). Text is stripped; an empty text, a missing id or a repeated qid is an error.
    """
    path = _existing(Path(path), *QUERY_NAMES)
    is_tsv = strip_compression_suffix(path.name).lower().endswith((".tsv", ".txt"))
    parse = _query_from_tsv if is_tsv else _query_from_json
    queries: dict[str, str] = {}
    for lineno, line in _text_lines(path):
        if is_tsv and lineno == 1 and is_tsv_header(line):  # `qid<TAB>text`: the columns' names, not a query
            continue
        try:
            qid, text = parse(line)
            if isinstance(qid, bool) or not isinstance(qid, (str, int)) or not str(qid).strip():
                raise ValueError("missing query id")
            if not isinstance(text, str) or not text.strip():
                raise ValueError("missing or empty query text")
        except ValueError as exc:
            raise CollectionError(f"{path}:{lineno}: {exc}") from None
        qid = str(qid).strip()
        if qid in queries:
            raise CollectionError(f"{path}:{lineno}: query id {qid!r} repeated")
        queries[qid] = text.strip()
    return queries


def _grade(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        pass
    try:
        number = float(value)  # "1.0" is fine, "0.5" is not
    except ValueError:
        number = 0.5
    if not number.is_integer():
        raise ValueError(f"relevance {value!r} is not an integer")
    return int(number)


# a BEIR directory's qrels/<split> file, the first of these found (read_qrels, training, the build)
QRELS_SUFFIXES = (".tsv", ".tsv.gz", ".tsv.zst", ".txt")


def qrels_file(directory: str | Path, split: str) -> Path | None:
    """``qrels/<split>.tsv`` of a BEIR directory, or its ``.gz`` / ``.zst`` / ``.txt`` form; None when it has none."""
    folder = Path(directory) / "qrels"
    return next((folder / f"{split}{s}" for s in QRELS_SUFFIXES if (folder / f"{split}{s}").is_file()), None)


def qrels_splits(directory: str | Path) -> list[str]:
    """The splits a BEIR directory's ``qrels/`` folder holds judgements for."""
    folder = Path(directory) / "qrels"
    if not folder.is_dir():
        return []
    found = {f.name[: -len(s)] for f in folder.iterdir() for s in QRELS_SUFFIXES if f.name.endswith(s)}
    return sorted(found)


def qrels_path(path: str | Path, split: str = "test") -> Path:
    """The qrels file :func:`read_qrels` reads: ``path`` itself, or a BEIR directory's (or its ``qrels/`` folder's)
    ``<split>`` file; a CollectionError where there is none."""
    path = Path(path)
    if path.is_dir():  # a BEIR directory, or its qrels/ folder itself
        folder = path / "qrels" if (path / "qrels").is_dir() or path.name != "qrels" else path
        path = _existing(folder, *(f"{split}{s}" for s in QRELS_SUFFIXES))
    return _existing(path)


def read_qrels(path: str | Path, split: str = "test") -> Qrels:
    """Read judgements into ``{qid: {docid: grade}}`` (grades kept as given, negative ones included).

    ``path`` is a qrels file (BEIR 3-column TSV with or without its header, or TREC 4-column) or a BEIR
    directory, in which case ``qrels/<split>.tsv`` is read. Repeating a judgement with the same grade is
    allowed; with a different grade it is an error.
    """
    path = qrels_path(path, split)
    qrels: Qrels = {}
    for lineno, line in _text_lines(path):
        columns = line.split()
        if len(columns) == 3 and tuple(c.lower() for c in columns) == _QRELS_HEADER:
            continue
        if len(columns) == 3:
            qid, docid, grade_text = columns
        elif len(columns) == 4:
            qid, _iteration, docid, grade_text = columns
        else:
            raise CollectionError(
                f"{path}:{lineno}: {len(columns)} columns; expected 'query-id corpus-id score' (BEIR) "
                "or 'qid 0 docid rel' (TREC)"
            )
        try:
            grade = _grade(grade_text)
        except ValueError as exc:
            raise CollectionError(f"{path}:{lineno}: {exc}") from None
        judged = qrels.setdefault(qid, {})
        if judged.get(docid, grade) != grade:
            raise CollectionError(
                f"{path}:{lineno}: ({qid}, {docid}) judged {judged[docid]} before and {grade} now"
            )
        judged[docid] = grade
    return qrels


def read_beir_split(directory: str | Path, split: str = "test") -> tuple[dict[str, str], Qrels]:
    """A BEIR directory's queries that have judgements in ``qrels/<split>.tsv``, and those judgements."""
    directory = Path(directory)
    qrels = read_qrels(directory, split)
    queries = read_queries(directory)
    missing = sorted(set(qrels) - set(queries))
    if missing:
        raise CollectionError(
            f"{directory}: {len(missing)} judged query ids have no query text (e.g. {missing[:5]})"
        )
    return {qid: text for qid, text in queries.items() if qid in qrels}, qrels
