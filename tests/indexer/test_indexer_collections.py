"""Collection readers: formats, compression, detection and the problem policy."""

from __future__ import annotations

import gzip
import logging

import pytest
from aheadrank.indexer.collections import (
    Collection,
    CollectionFormat,
    Document,
    ProblemKind,
    detect_format,
    join_title_text,
    read_collection,
)
from indexer_testkit import SAMPLE, write_lines

from aheadrank.errors import CollectionError

BEIR_RECORDS = [
    {"_id": "d1", "title": "Wing aerodynamics", "text": "Lift of a wing in a slipstream."},
    {"_id": "d2", "title": "", "text": "Heat conduction in composite slabs."},
    {"_id": "d3", "title": "Is it so?", "text": "Unicode: naïve café — 東京, and a\nnewline."},
    {"_id": 17, "text": "An integer id and no title field."},
]
EXPECTED = [
    Document("d1", "Wing aerodynamics. Lift of a wing in a slipstream."),
    Document("d2", "Heat conduction in composite slabs."),
    Document("d3", "Is it so? Unicode: naïve café — 東京, and a\nnewline."),
    Document("17", "An integer id and no title field."),
]
SUFFIXES = ["", ".gz", ".zst"]


def tsv_line(doc: Document) -> str:
    return f"{doc.docid}\t{doc.text.replace(chr(10), ' ')}"


def flat(doc: Document) -> Document:
    return Document(doc.docid, doc.text.replace("\n", " "))


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_beir_jsonl_plain_and_compressed(tmp_path, suffix):
    path = write_lines(tmp_path / f"corpus.jsonl{suffix}", BEIR_RECORDS)
    collection = Collection(path)
    assert collection.format is CollectionFormat.BEIR
    assert list(collection) == EXPECTED
    assert collection.report.documents == 4 and collection.report.problems == 0


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_pyserini_jsonl_plain_and_compressed(tmp_path, suffix):
    records = [{"id": d.docid, "contents": d.text, "extra": 1} for d in EXPECTED]
    path = write_lines(tmp_path / f"docs.jsonl{suffix}", records)
    collection = Collection(path)
    assert collection.format is CollectionFormat.PYSERINI
    assert list(collection) == EXPECTED


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_tsv_plain_and_compressed(tmp_path, suffix):
    path = write_lines(tmp_path / f"collection.tsv{suffix}", [tsv_line(d) for d in EXPECTED])
    collection = Collection(path)
    assert collection.format is CollectionFormat.TSV
    assert list(collection) == [flat(d) for d in EXPECTED]


def test_compression_is_detected_by_content_not_name(tmp_path):
    path = tmp_path / "corpus.jsonl"  # gzip bytes under a plain name
    path.write_bytes(gzip.compress(b'{"_id": "a", "text": "alpha"}\n'))
    assert list(Collection(path)) == [Document("a", "alpha")]


def test_crlf_and_bom_are_accepted(tmp_path):
    path = tmp_path / "c.tsv"
    path.write_bytes(b"\xef\xbb\xbfa\talpha\r\nb\tbeta\r\n")
    assert list(Collection(path)) == [Document("a", "alpha"), Document("b", "beta")]


def test_beir_directory_reads_corpus_jsonl(tmp_path):
    write_lines(tmp_path / "beir" / "corpus.jsonl.zst", BEIR_RECORDS)
    write_lines(tmp_path / "beir" / "queries.jsonl", [{"_id": "q", "text": "not a document"}])
    assert list(read_collection(tmp_path / "beir")) == EXPECTED


def test_directory_of_files_is_read_in_name_order(tmp_path):
    write_lines(
        tmp_path / "coll" / "b.jsonl", [{"id": "2", "contents": "two"}, {"id": "1", "contents": "dup"}]
    )
    write_lines(tmp_path / "coll" / "a.jsonl.gz", [{"id": "1", "contents": "one"}])
    (tmp_path / "coll" / "README").write_text("ignored")
    collection = Collection(tmp_path / "coll")
    assert [p.name for p in collection.files] == ["a.jsonl.gz", "b.jsonl"]
    assert list(collection) == [Document("1", "one"), Document("2", "two")]
    assert collection.report.counts == {"duplicate_id": 1}
    assert str(collection.report.examples[0]).startswith(f"{tmp_path / 'coll' / 'b.jsonl'}:2: duplicate_id")


def test_a_folder_of_jsonl_and_tsv_parts_reads_each_in_its_own_format(tmp_path):
    """The folder's format was the first file's: a TSV part beside a JSONL one was read as JSON, every line of it
    skipped as bad JSON (half the corpus lost behind a warning). Each file is now read in its own format (a
    TSV header still counts as no document), and the formats are named together."""
    write_lines(tmp_path / "coll" / "a.jsonl", [{"_id": "1", "title": "T", "text": "one"}])
    (tmp_path / "coll" / "b.tsv").write_text("docid\ttext\n2\ttwo\n3\tthree\n")
    write_lines(tmp_path / "coll" / "c.jsonl", [{"id": "4", "contents": "four"}])
    collection = Collection(tmp_path / "coll")
    assert list(collection) == [
        Document("1", "T. one"),
        Document("2", "two"),
        Document("3", "three"),
        Document("4", "four"),
    ]
    assert collection.report.problems == 0 and collection.report.headers == 1
    assert collection.format_name == "beir+tsv+pyserini" and collection.format.value == "beir"


def test_format_sniffed_for_unknown_extension_and_overridable(tmp_path):
    tsv = write_lines(tmp_path / "docs.txt", ["a\talpha"])
    assert detect_format(tsv) is CollectionFormat.TSV
    jsonl = write_lines(tmp_path / "docs.data", ["not json", {"_id": "a", "text": "alpha"}])
    assert detect_format(jsonl) is CollectionFormat.BEIR
    forced = write_lines(tmp_path / "odd.jsonl", ["a\talpha"])
    assert list(Collection(forced, "tsv")) == [Document("a", "alpha")]


def test_ambiguous_or_unknown_format_is_an_error(tmp_path):
    with pytest.raises(CollectionError, match="cannot tell the JSONL flavour"):
        Collection(write_lines(tmp_path / "x.jsonl", [{"docno": "a", "body": "alpha"}]))
    with pytest.raises(
        CollectionError, match="cannot detect the collection format: expected JSON lines"
    ) as info:
        Collection(write_lines(tmp_path / "x.csv", ["id,name", "1,red shoe"]))
    assert "convert a CSV file" in str(info.value)
    # {"id", "text"} (the id as most JSONL files name it): BEIR's fields, read as BEIR; "_id" wins where both are
    plain = Collection(
        write_lines(
            tmp_path / "ids.jsonl",
            [{"id": 1, "title": "T", "text": "a"}, {"_id": "x", "id": "y", "text": "b"}],
        )
    )
    assert plain.format is CollectionFormat.BEIR and list(plain.titled()) == [("1", "T", "a"), ("x", "", "b")]
    with pytest.raises(CollectionError, match="collection not found"):
        Collection(tmp_path / "missing.jsonl")
    (tmp_path / "empty-dir").mkdir()
    with pytest.raises(CollectionError, match="no collection files"):
        Collection(tmp_path / "empty-dir")


MALFORMED_BEIR = [
    {"_id": "ok1", "title": "T", "text": "first good"},  # 1
    '{"_id": "broken", "text": ',  # 2 bad JSON
    {"title": "no id", "text": "x"},  # 3 missing id
    {"_id": "notext", "title": "only a title"},  # 4 missing text field
    b'{"_id": "latin1", "text": "caf\xe9"}',  # 5 invalid UTF-8
    "",  # 6 blank line
    {"_id": "ok1", "text": "duplicate"},  # 7 duplicate docid
    {"_id": "empty", "title": " ", "text": " \t "},  # 8 empty document
    {"_id": "ok2", "text": "second good"},  # 9
    '{"_id": "surrogate", "text": "\\ud800"}',  # 10 lone surrogate: not encodable as UTF-8
    '["a", "list"]',  # 11 JSON but not an object
    {"_id": None, "text": "null id"},  # 12
    {"_id": "numtext", "text": 5},  # 13 text not a string
]
MALFORMED_KINDS = {
    2: ProblemKind.BAD_JSON,
    3: ProblemKind.MISSING_ID,
    4: ProblemKind.MISSING_TEXT,
    5: ProblemKind.INVALID_UTF8,
    6: ProblemKind.BLANK_LINE,
    7: ProblemKind.DUPLICATE_ID,
    8: ProblemKind.EMPTY_DOCUMENT,
    10: ProblemKind.INVALID_UTF8,
    11: ProblemKind.BAD_JSON,
    12: ProblemKind.MISSING_ID,
    13: ProblemKind.MISSING_TEXT,
}


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_malformed_lines_are_skipped_and_counted(tmp_path, caplog, suffix):
    path = write_lines(tmp_path / f"corpus.jsonl{suffix}", MALFORMED_BEIR)
    collection = Collection(path, max_examples=50)
    with caplog.at_level(logging.WARNING, logger="aheadrank.indexer.collections"):
        docs = list(collection)
    assert docs == [Document("ok1", "T. first good"), Document("ok2", "second good")]
    report = collection.report
    assert report.lines == len(MALFORMED_BEIR) and report.documents == 2
    assert {(p.line, p.kind) for p in report.examples} == set(MALFORMED_KINDS.items())
    assert all(p.path == str(path) for p in report.examples)
    assert report.counts["invalid_utf8"] == 2 and report.counts["bad_json"] == 2
    assert report.problems == len(MALFORMED_KINDS)
    # one warning summary naming file:line of the examples
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"{path}:2: bad_json" in warnings[0] and "skipped 11" in warnings[0]


def test_the_same_problems_read_again_are_warned_of_once(tmp_path, caplog):
    """A build reads its collection in five stages: its problems were warned of at each (the same block five or six
    times in `aheadrank build`'s output); now once, and the later passes say it at debug level only. Another file, or
    the same file with other problems, is warned of again."""
    path = write_lines(tmp_path / "corpus.jsonl", MALFORMED_BEIR)
    with caplog.at_level(logging.DEBUG, logger="aheadrank.indexer.collections"):
        for _ in range(3):
            assert len(list(Collection(path))) == 2
        other = write_lines(tmp_path / "other.jsonl", MALFORMED_BEIR)
        list(Collection(other))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and str(path) in warnings[0] and str(other) in warnings[1]
    again = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.DEBUG and "warned before" in r.getMessage()
    ]
    assert len(again) == 2 and all(str(path) in m for m in again)


def test_a_null_field_is_told_from_a_missing_one(tmp_path):
    rows = [{"_id": None, "text": "x"}, {"text": "y"}, {"_id": "a", "text": None, "title": "T"}, {"_id": "b"}]
    collection = Collection(write_lines(tmp_path / "c.jsonl", rows))
    assert list(collection) == []
    assert [p.message for p in collection.report.examples] == [
        "'_id' is null",
        "no '_id' field",
        "'text' is null",
        "no 'text' field",
    ]


def test_report_keeps_only_the_first_examples(tmp_path):
    path = write_lines(tmp_path / "c.tsv", ["x"] * 30)
    collection = Collection(path, max_examples=3)
    assert list(collection) == []
    assert collection.report.counts == {"bad_columns": 30}
    assert [p.line for p in collection.report.examples] == [1, 2, 3]


@pytest.mark.parametrize(("line_no", "kind"), sorted(MALFORMED_KINDS.items()))
def test_strict_raises_at_the_first_problem_with_file_and_line(tmp_path, line_no, kind):
    lines = [MALFORMED_BEIR[0], MALFORMED_BEIR[line_no - 1]]  # the good first line, then the bad one
    path = write_lines(tmp_path / "corpus.jsonl.gz", lines)
    collection = Collection(path, strict=True)
    docs = iter(collection)
    assert next(docs) == Document("ok1", "T. first good")  # lazy: good records before the problem stream
    with pytest.raises(CollectionError) as info:
        list(docs)
    assert f"{path}:2: {kind.value}" in str(info.value)
    assert "first kept" not in str(info.value)  # strict keeps nothing: it stops


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_tsv_header_naming_the_columns_is_no_document(tmp_path, suffix):
    """pandas' `to_csv(sep="\\t")` writes `docid<TAB>text` first: not a document called "docid" whose text is
    "text". Only a file's first line is taken for one, in any case; each file of a folder may have its own."""
    path = write_lines(tmp_path / f"c.tsv{suffix}", ["DocID\tText", "a\talpha", "docid\ttext", "b\tbeta"])
    collection = Collection(path)
    assert list(collection) == [Document("a", "alpha"), Document("docid", "text"), Document("b", "beta")]
    report = collection.report
    assert (report.lines, report.documents, report.headers, report.problems) == (4, 3, 1, 0)
    assert "a header line naming the columns skipped" in report.summary() and report.to_dict()["headers"] == 1
    # a first line that is a record stays one (MS MARCO's collection.tsv starts "0<TAB>The presence of ...")
    plain = write_lines(tmp_path / "plain.tsv", ["0\tid text", "pid\tpassage about pids"])
    assert [d.docid for d in Collection(plain)] == ["0", "pid"] and Collection(plain).report.headers == 0
    folder = tmp_path / "parts"
    folder.mkdir()
    write_lines(folder / "1.tsv", ["pid\tpassage", "a\talpha"])
    write_lines(folder / "2.tsv", ["pid\tpassage", "b\tbeta"])
    both = Collection(folder)
    assert [d.docid for d in both] == ["a", "b"] and both.report.headers == 2
    assert "2 header lines naming the columns skipped" in both.report.summary()
    # a catalogue's header (short texts: product names, FAQ answers)
    for header in ("sku\tname", "product_id\tdescription", "item_id\tproduct_name", "id\tanswer"):
        items = Collection(write_lines(tmp_path / "items.tsv", [header, "a\tred running shoe"]))
        assert list(items) == [Document("a", "red running shoe")] and items.report.headers == 1
    # a header of three columns is no two-column header: reported as any malformed line
    three = Collection(write_lines(tmp_path / "three.tsv", ["id\ttitle\ttext", "a\talpha"]))
    assert list(three) == [Document("a", "alpha")] and dict(three.report.counts) == {"bad_columns": 1}
    # JSONL is never sniffed for one
    assert list(Collection(write_lines(tmp_path / "j.jsonl", [{"_id": "docid", "text": "text"}]))) == [
        Document("docid", "text")
    ]


def test_a_tsv_quoted_across_lines_is_reported_with_what_to_do(tmp_path):
    """A CSV writer's TSV (pandas' `to_csv(sep="\\t")`, quoting a text with a newline over two lines): read a record a
    line, the cut text's second line is a bad_columns problem that says TSV is read without quoting, not silence."""
    import csv

    path = tmp_path / "pandas.tsv"
    with path.open("w", newline="") as f:
        csv.writer(f, delimiter="\t", lineterminator="\n").writerows(
            [["a", "first line\nsecond line"], ["b", "beta"]]
        )
    collection = Collection(path)
    assert [d.docid for d in collection] == ["a", "b"]
    (problem,) = collection.report.examples
    assert (problem.line, problem.kind) == (
        2,
        ProblemKind.BAD_COLUMNS,
    ) and "without CSV quoting" in problem.message


def test_tsv_problems(tmp_path):
    path = write_lines(
        tmp_path / "c.tsv", ["a\talpha", "b\tbeta\textra", "nocolumns", "\tno id", "c\t   ", "d\tdelta"]
    )
    collection = Collection(path)
    assert list(collection) == [Document("a", "alpha"), Document("d", "delta")]
    kinds = {p.line: p.kind.value for p in collection.report.examples}
    assert kinds == {2: "bad_columns", 3: "bad_columns", 4: "missing_id", 5: "empty_document"}
    with pytest.raises(CollectionError, match=r"c\.tsv:2: bad_columns: 3 tab-separated columns"):
        list(Collection(path, strict=True))


def test_empty_first_occurrence_does_not_shadow_a_later_valid_one(tmp_path):
    path = write_lines(tmp_path / "c.tsv", ["a\t ", "a\talpha"])
    collection = Collection(path)
    assert list(collection) == [Document("a", "alpha")]
    assert collection.report.counts == {"empty_document": 1}


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_truncated_compressed_file_is_an_error_naming_the_file(tmp_path, suffix):
    path = write_lines(
        tmp_path / f"c.jsonl{suffix}", [{"_id": str(i), "text": str(i * 7919)} for i in range(5000)]
    )
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # cut mid-stream
    with pytest.raises(CollectionError, match=rf"c\.jsonl\{suffix}:\d+: cannot read/decompress"):
        list(Collection(path))


def test_each_pass_gets_a_fresh_report(tmp_path):
    collection = Collection(write_lines(tmp_path / "c.tsv", ["a\talpha", "bad"]))
    assert len(list(collection)) == 1 and len(list(collection)) == 1
    assert collection.report.counts == {"bad_columns": 1}


@pytest.mark.parametrize(
    ("title", "text", "joined"),
    [
        ("A title", "The body.", "A title. The body."),
        ("A title.", "The body.", "A title. The body."),
        ("Why?", "Because.", "Why? Because."),
        ("  padded  ", "  body ", "padded. body"),
        ("", "body", "body"),
        (None, "body", "body"),
        ("title only", "", "title only"),
        ("", "", ""),
    ],
)
def test_join_title_text(title, text, joined):
    assert join_title_text(title, text) == joined


def test_bundled_sample_reads_cleanly():
    collection = Collection(SAMPLE, strict=True)
    docs = list(collection)
    assert collection.format is CollectionFormat.BEIR and len(docs) == 1000
