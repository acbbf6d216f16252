"""BM25 Lucene index: build, count check, search, raw text. One JVM for the whole test process."""

from __future__ import annotations

import random
import threading

import pytest
from aheadrank.indexer import bm25
from aheadrank.indexer.bm25 import (
    Bm25Searcher,
    IndexBuildError,
    build_bm25_index,
    detach_thread,
    index_document_count,
    java_classes,
    read_index_meta,
)
from aheadrank.indexer.collections import Collection
from aheadrank.indexer.topics import read_beir_split
from indexer_testkit import SAMPLE, shared_dataset, write_lines

from aheadrank.errors import AheadrankError, CollectionError

pytestmark = pytest.mark.slow  # needs Java

FILLER = (
    "river mountain city market garden window bridge school paper music story letter winter summer "
    "engine signal network table kitchen doctor island forest planet ocean"
).split()
PLANTED = [
    {"_id": "p-zebra", "title": "Striped grazers", "text": "The zebra grazed beside the quantum laboratory."},
    {"_id": "p-volcano", "title": "Volcano", "text": "Basalt lava flows from a shield volcano in Iceland."},
    {"_id": "p-cafe", "title": "", "text": "Café naïve résumé über 東京 sushi.\nA second line."},
    {"_id": "p-turbine-short", "text": "turbine turbine turbine blades"},
    {"_id": "p-turbine-long", "text": "a turbine " + " ".join(FILLER * 3)},
]
PLANTED_QUERIES = {
    "zebra quantum": "p-zebra",
    "basalt lava in iceland": "p-volcano",
    "sushi": "p-cafe",
    "turbine": "p-turbine-short",
    "striped grazers": "p-zebra",  # title words are indexed too
}
BAD_LINES = ["{not json", {"_id": "p-zebra", "text": "a duplicate"}, {"_id": "blank", "text": "   "}]


def filler_docs(n: int, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    return [{"_id": f"f{i:03d}", "title": "", "text": " ".join(rng.choices(FILLER, k=25))} for i in range(n)]


def planted_records() -> list:
    records: list = filler_docs(60)
    for i, doc in enumerate(PLANTED):
        records.insert(i * 12, doc)
    return records + BAD_LINES


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A BEIR .zst collection (60 filler + 5 planted documents + 3 bad lines), indexed once."""
    root = tmp_path_factory.mktemp("planted")
    corpus = write_lines(root / "corpus.jsonl.zst", planted_records())
    result = build_bm25_index(corpus, root / "index", threads=2, k1=1.2, b=0.75, progress=False)
    with Bm25Searcher(result.index_dir) as searcher:
        yield corpus, result, searcher


def test_build_counts_valid_documents_and_records_metadata(planted):
    corpus, result, searcher = planted
    assert result.documents == 65 == searcher.num_docs == index_document_count(result.index_dir)
    assert result.report.counts == {"bad_json": 1, "duplicate_id": 1, "empty_document": 1}
    meta = read_index_meta(result.index_dir)
    assert meta["documents"] == 65 and meta["collection_format"] == "beir"
    assert (meta["k1"], meta["b"]) == (1.2, 0.75) == (searcher.k1, searcher.b)
    assert not result.index_dir.with_name("index.partial").exists()


@pytest.mark.parametrize(("query", "docid"), sorted(PLANTED_QUERIES.items()))
def test_planted_queries_find_their_documents(planted, query, docid):
    hits = planted[2].search(query, k=10)
    assert hits[0][0] == docid
    assert all(a[1] >= b[1] for a, b in zip(hits, hits[1:], strict=False))


def test_longer_document_ranks_below_the_focused_one(planted):
    ranked = [docid for docid, _ in planted[2].search("turbine", k=5)]
    assert ranked[:2] == ["p-turbine-short", "p-turbine-long"]


def test_doc_text_round_trip_for_every_document(planted):
    corpus, _, searcher = planted
    docs = list(Collection(corpus))
    assert len(docs) == 65
    for doc in docs:
        assert searcher.doc_text(doc.docid) == doc.text
    assert searcher.doc_text("no-such-doc") is None
    assert searcher.doc_texts(["p-volcano", "nope"]) == {
        "p-volcano": "Volcano. Basalt lava flows from a shield volcano in Iceland."
    }


def test_the_raw_texts_live_in_their_own_index(planted):
    """The searched index holds no raw documents (Anserini loads every hit's stored document: the raw texts
    made a search at depth 1000 3x slower); its texts/ index holds them, one per document, and doc_text reads
    them from there."""
    corpus, result, searcher = planted
    assert read_index_meta(result.index_dir)["texts"] == bm25.TEXTS_DIR
    texts = result.index_dir / bm25.TEXTS_DIR
    assert index_document_count(texts) == 65
    with searcher._lock:
        assert searcher._searcher.doc("p-volcano").get("raw") is None
    assert searcher.doc_text("p-volcano") == "Volcano. Basalt lava flows from a shield volcano in Iceland."


def test_an_index_with_its_texts_inside_still_serves_them(tmp_path):
    """separate_texts=False (one index with the raw texts inside, as Pyserini's own command builds it, and
    every index built before): search and doc_text work as with the texts apart, with the same results."""
    corpus = write_lines(tmp_path / "corpus.jsonl", planted_records())
    inside = build_bm25_index(corpus, tmp_path / "inside", threads=1, progress=False, separate_texts=False)
    apart = build_bm25_index(corpus, tmp_path / "apart", threads=1, progress=False)
    assert "texts" not in read_index_meta(inside.index_dir)
    assert not (inside.index_dir / bm25.TEXTS_DIR).exists()
    with Bm25Searcher(inside.index_dir) as one, Bm25Searcher(apart.index_dir) as two:
        for query in PLANTED_QUERIES:
            assert one.search(query, k=20) == two.search(query, k=20)
        for doc in Collection(corpus):
            assert one.doc_text(doc.docid) == two.doc_text(doc.docid) == doc.text


def test_an_index_in_another_language_analyses_documents_and_queries_alike(tmp_path):
    """language="fr": Lucene's French analyzer at index time (stopwords, light stemming: "chevaux" is "cheval"),
    recorded in the index, and the searcher analyses queries with it; the English index finds neither."""
    french = {
        "d1": "Les chevaux courent dans le pré.",
        "d2": "Le chat dort sur le canapé.",
        "d3": "Une voiture rouge.",
    }
    corpus = write_lines(tmp_path / "fr.jsonl", [{"id": k, "contents": v} for k, v in french.items()])
    fr = build_bm25_index(corpus, tmp_path / "fr", threads=1, progress=False, language="fr")
    en = build_bm25_index(corpus, tmp_path / "en", threads=1, progress=False)
    assert (
        read_index_meta(fr.index_dir)["language"] == "fr"
        and "French" in read_index_meta(fr.index_dir)["analyzer"]
    )
    assert read_index_meta(en.index_dir)["language"] == "en"
    with Bm25Searcher(fr.index_dir) as one, Bm25Searcher(en.index_dir) as two:
        assert (one.language, two.language) == ("fr", "en")
        assert [d for d, _ in one.search("cheval")] == ["d1"] and two.search("cheval") == []
        assert one.search("le") == [] and {d for d, _ in two.search("le")} == {"d1", "d2"}
        assert [d for d, _ in one.batch_search(["chevaux", "le"], k=5)[0]] == ["d1"]
    with pytest.raises(IndexBuildError, match="unknown BM25 language 'xx'"):
        build_bm25_index(corpus, tmp_path / "xx", threads=1, progress=False, language="xx")
    assert not (tmp_path / "xx").exists()


def test_a_missing_texts_index_is_a_clear_error(tmp_path):
    """An index whose texts/ folder is gone (copied without it): search still works, doc_text says what is
    wrong instead of returning nothing."""
    import shutil

    corpus = write_lines(tmp_path / "corpus.jsonl", planted_records())
    built = build_bm25_index(corpus, tmp_path / "index", threads=1, progress=False)
    shutil.rmtree(built.index_dir / bm25.TEXTS_DIR)
    with Bm25Searcher(built.index_dir) as searcher:
        assert searcher.search("zebra quantum", k=3)[0][0] == "p-zebra"
        with pytest.raises(AheadrankError, match="rebuild it"):
            searcher.check_texts()  # what the service calls at start
        with pytest.raises(AheadrankError, match="rebuild it"):
            searcher.doc_text("p-zebra")


def test_positions_and_document_vectors_are_stored(planted):
    from pyserini.index.lucene import LuceneIndexReader

    reader = LuceneIndexReader(str(planted[1].index_dir))
    try:
        assert reader.get_document_vector("p-turbine-short") == {"turbin": 3, "blade": 1}
        assert reader.stats()["documents"] == 65 == index_document_count(planted[1].index_dir)
        assert reader.get_term_positions("p-turbine-short")["turbin"] == [0, 1, 2]
    finally:
        reader.reader.close()


def test_batch_search_matches_search(planted):
    searcher = planted[2]
    queries = [*PLANTED_QUERIES, "", "the of and"]
    batched = searcher.batch_search(queries, k=7, threads=2)
    assert batched == [searcher.search(q, k=7) for q in queries]
    assert batched[-2:] == [[], []]  # empty and stopword-only queries have no hits


def test_doc_scores_are_the_scores_search_gives_those_documents(planted):
    """Given docids score as search scores them (up to Anserini's tie-breaking by a millionth a rank), whatever
    the searcher's BM25 parameters; a document without the query's terms scores 0 and an unknown docid is left
    out; a query of stopwords or nothing scores every known document 0."""
    searcher = planted[2]
    for query in PLANTED_QUERIES:
        ranked = searcher.search(query, k=1000)
        found = dict(ranked)
        absent = [d for d in searcher.doc_scores("", [f"f{i:03d}" for i in range(60)]) if d not in found][:3]
        wanted = [d for d, _ in ranked[::3]] + absent + ["no-such-doc"]
        got = searcher.doc_scores(query, wanted)
        assert set(got) == set(wanted) - {"no-such-doc"}
        assert {d: got[d] for d in found.keys() & got.keys()} == pytest.approx(
            {d: found[d] for d in found.keys() & got.keys()}, abs=1e-4
        )
        assert all(got[d] == 0.0 for d in absent)
    assert searcher.doc_scores("the of and", ["f001", "f002"]) == {"f001": 0.0, "f002": 0.0}
    assert searcher.doc_scores("turbine", []) == {}
    with Bm25Searcher(planted[1].index_dir, k1=0.9, b=0.4) as other:
        top = other.search("turbine", 3)
        assert other.doc_scores("turbine", [d for d, _ in top]) == pytest.approx(dict(top), abs=1e-4)


def test_a_text_scores_what_it_would_as_one_more_document_of_the_index(planted):
    """A text sent for scoring (not looked up) gets the BM25 score its document has where the index holds it (to
    Anserini's tie-breaking), under the searcher's own k1 and b; a text the index does not hold is scored with the
    index's statistics, each on its own (the same alone as among others); a query term the index lacks counts
    with the largest idf, so the text that has it scores above one that does not."""
    searcher = planted[2]
    for k1, b in ((1.2, 0.75), (0.9, 0.4), (0.0, 0.5), (2.0, 1.0)):
        with Bm25Searcher(planted[1].index_dir, k1=k1, b=b) as s:
            for query in [*PLANTED_QUERIES, "turbine turbine lava", "the of and"]:
                ids = [d for d, _ in s.search(query, 1000)][:20] + ["f001", "f002"]
                texts = s.doc_texts(ids)
                got = s.text_scores(query, [texts[d] for d in ids])
                assert got == pytest.approx([s.doc_scores(query, ids)[d] for d in ids], abs=1e-4)
    new = ["a turbine of basalt", "nothing of the kind", "turbine zzyzx", "zzyzx", ""]
    got = searcher.text_scores("turbine zzyzx", new)
    assert got[1] == got[4] == 0.0 and got[2] > got[0] > 0 and got[3] > got[0]
    assert [searcher.text_scores("turbine zzyzx", [t])[0] for t in new] == got
    assert searcher.text_scores("the of", new) == [0.0] * 5 and searcher.text_scores("turbine", []) == []
    longer = searcher.text_scores("turbine", ["turbine " + "basalt " * n for n in (0, 30, 300)])
    assert longer[0] > longer[1] > longer[2] > 0  # b = 0.75: a longer text, a lower score


def test_bm25_parameters_are_settable(planted):
    index_dir = planted[1].index_dir
    with Bm25Searcher(index_dir) as default, Bm25Searcher(index_dir, k1=0.9, b=0.4) as anserini:
        assert (default.k1, default.b) == (1.2, 0.75)  # from the build's metadata
        a, b = default.search("turbine", 3), anserini.search("turbine", 3)
        assert a[0][0] == b[0][0] and a[0][1] != pytest.approx(b[0][1])
        anserini.set_bm25(1.2, 0.75)
        assert anserini.search("turbine", 3) == a
        with pytest.raises(AheadrankError, match="0 <= b <= 1"):
            anserini.set_bm25(0.9, 1.5)
        with pytest.raises(AheadrankError, match="k must be >= 1"):
            anserini.search("turbine", 0)


def test_one_searcher_is_safe_to_share_between_threads(planted):
    searcher = planted[2]
    queries = list(PLANTED_QUERIES) * 8
    expected = [searcher.search(q, 5) for q in queries]
    results: dict[int, list] = {}

    def worker(offset: int) -> None:
        try:
            for i in range(offset, len(queries), 4):
                results[i] = searcher.search(queries[i], 5)
                assert searcher.doc_text(results[i][0][0])
        finally:
            detach_thread()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i] for i in range(len(queries))] == expected


def test_count_mismatch_is_an_error_and_nothing_is_installed(tmp_path, monkeypatch):
    corpus = write_lines(tmp_path / "c.tsv", ["a\talpha", "b\tbeta"])
    monkeypatch.setattr(bm25, "index_document_count", lambda path: 1)
    with pytest.raises(IndexBuildError, match="holds 1 documents but the collection has 2 valid ones"):
        build_bm25_index(corpus, tmp_path / "idx", threads=1, progress=False)
    assert not (tmp_path / "idx").exists()
    assert (tmp_path / "idx.partial").is_dir()  # kept for inspection


def test_rebuild_replaces_the_same_collections_index_and_another_only_with_overwrite(tmp_path):
    """An index of the same collection (edited since) is rebuilt in place; one of another collection, or one without
    aheadrank's record (built by another tool), is refused untouched unless ``overwrite`` (``--overwrite``)."""
    from typer.testing import CliRunner

    from aheadrank.cli import app

    index = tmp_path / "idx"
    one = write_lines(tmp_path / "one.tsv", ["a\talpha"])
    build_bm25_index(one, index, threads=1, progress=False)
    write_lines(one, ["a\talpha", "d\tdelta"])  # the same file, edited: rebuilt without a word
    assert build_bm25_index(one, index, threads=1, progress=False).documents == 2
    two = write_lines(tmp_path / "two.tsv", ["b\tbeta", "c\tgamma"])
    with pytest.raises(IndexBuildError, match=r"refusing to replace .*it is the BM25 index of .*one\.tsv"):
        build_bm25_index(two, index, threads=1, progress=False)
    res = CliRunner().invoke(
        app, ["bm25-index", "--collection", str(two), "--index", str(index), "--no-progress"]
    )
    assert res.exit_code == 2 and "give --overwrite" in res.output and "Traceback" not in res.output
    with Bm25Searcher(index) as searcher:
        assert searcher.doc_text("d") == "delta" and searcher.doc_text("b") is None
    result = build_bm25_index(two, index, threads=1, progress=False, overwrite=True)
    assert result.documents == 2 == index_document_count(index)
    with Bm25Searcher(index) as searcher:
        assert searcher.doc_text("a") is None and searcher.doc_text("c") == "gamma"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx", "one.tsv", "two.tsv"]
    (index / bm25.META_FILE).unlink()  # as an index built by Pyserini's own command
    with pytest.raises(IndexBuildError, match="a Lucene index aheadrank did not build"):
        build_bm25_index(two, index, threads=1, progress=False)
    res = CliRunner().invoke(
        app, ["bm25-index", "--collection", str(two), "--index", str(index), "--no-progress", "--overwrite"]
    )
    assert res.exit_code == 0, res.output


def test_refuses_to_overwrite_a_directory_that_is_not_an_index(tmp_path):
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "notes.txt").write_text("keep me")
    with pytest.raises(IndexBuildError, match="refusing to overwrite"):
        build_bm25_index(write_lines(tmp_path / "c.tsv", ["a\talpha"]), tmp_path / "precious", progress=False)
    assert (tmp_path / "precious" / "notes.txt").read_text() == "keep me"


def test_strict_build_fails_on_the_first_problem_and_leaves_nothing(tmp_path):
    corpus = write_lines(tmp_path / "c.tsv", ["a\talpha", "b\tbeta\tgamma"])
    with pytest.raises(CollectionError, match=r"c\.tsv:2: bad_columns"):
        build_bm25_index(corpus, tmp_path / "idx", strict=True, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.tsv"]


def test_a_collection_without_valid_documents_is_an_error(tmp_path):
    with pytest.raises(IndexBuildError, match="no valid documents"):
        build_bm25_index(write_lines(tmp_path / "c.tsv", ["bad", "a\t "]), tmp_path / "idx", progress=False)


def test_searcher_on_a_missing_index_is_a_clear_error(tmp_path):
    with pytest.raises(AheadrankError, match="not a Lucene index"):
        Bm25Searcher(tmp_path / "nothing")


def test_a_damaged_index_is_one_line_without_javas_stack(planted, tmp_path):
    import shutil

    damaged = tmp_path / "index"
    shutil.copytree(planted[1].index_dir, damaged)
    (damaged / "write.lock").unlink(missing_ok=True)
    segments = sorted(damaged.glob("segments_*"))
    assert segments
    with segments[-1].open("r+b") as f:
        f.truncate(10)
    with pytest.raises(AheadrankError) as info:
        Bm25Searcher(damaged)
    message = str(info.value)
    assert message.startswith(f"cannot open Lucene index {damaged}") and "\n" not in message, message
    assert "build it again (aheadrank bm25-index" in message and "\tat " not in message


def test_the_jvm_is_set_up_once_and_its_classes_shared(monkeypatch):
    """After the first call nothing is configured or started again: the same classes come back even where the
    Java set-up would now fail."""
    first = java_classes()

    def again():
        raise AssertionError("the JVM was set up a second time")

    monkeypatch.setattr(bm25, "configure_java", again)
    assert java_classes() is first


def recall_at(searcher: Bm25Searcher, queries: dict[str, str], qrels: dict, k: int) -> float:
    qids = list(queries)
    runs = searcher.batch_search([queries[q] for q in qids], k=k, threads=2)
    recalls = []
    for qid, hits in zip(qids, runs, strict=True):
        relevant = {d for d, grade in qrels[qid].items() if grade > 0}
        if relevant:
            recalls.append(len(relevant & {d for d, _ in hits}) / len(relevant))
    return sum(recalls) / len(recalls)


def test_cranfield_known_relevant_documents_are_retrieved(tmp_path):
    cranfield = shared_dataset("cranfield")
    result = build_bm25_index(cranfield, tmp_path / "cran", threads=2, progress=False)
    assert result.documents == 1398 and result.report.counts == {"empty_document": 2}  # docs 471 and 995
    queries, qrels = read_beir_split(cranfield, "test")
    with Bm25Searcher(result.index_dir) as searcher:
        top100 = {qid: {d for d, _ in searcher.search(queries[qid], 100)} for qid in ("3", "9", "15")}
        assert {"5", "90", "91", "144", "399"} <= top100["3"]  # heat conduction in composite slabs
        assert {"21", "22", "550"} <= top100["9"]  # internal slip-flow heat transfer
        assert {"462", "463"} <= top100["15"]  # photoelastic materials
        assert recall_at(searcher, queries, qrels, 100) > 0.7  # measured 0.74 (BM25 k1=0.9 b=0.4)


def test_bundled_sample_test_queries(tmp_path):
    result = build_bm25_index(SAMPLE, tmp_path / "sample", threads=2, progress=False)
    assert result.documents == 1000 and not result.report.problems
    queries, qrels = read_beir_split(SAMPLE, "test")
    with Bm25Searcher(result.index_dir) as searcher:
        assert recall_at(searcher, queries, qrels, 100) > 0.85


def test_java_heap_bounds_the_jvm_a_process_starts(planted, tmp_path):
    """set_java_heap before the JVM starts gives it that -Xmx (the service's --java-heap: without it the JVM
    may grow to a quarter of the machine's memory); a malformed size is refused; once the JVM runs, another
    size is logged and ignored, never an error for the process that already searches."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        f"""
        from aheadrank.indexer.bm25 import Bm25Searcher, set_java_heap
        set_java_heap("200m")
        s = Bm25Searcher({str(planted[1].index_dir)!r})
        from jnius import autoclass
        print(autoclass("java.lang.Runtime").getRuntime().maxMemory() // 2**20)
        set_java_heap("1g")  # too late: logged, the search goes on
        print(s.search("zebra quantum", 3)[0][0])
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    max_mb, top = out.stdout.split()
    assert 150 <= int(max_mb) <= 200 and top == "p-zebra"  # the planted document, found after the late size
    with pytest.raises(AheadrankError, match="512m or 2g"):
        bm25.set_java_heap("lots")


def test_the_jvm_gives_its_free_heap_back_when_asked():
    """release_java_memory: nothing to do before a JVM runs; once one has grown its heap, the memory of what it no
    longer holds leaves the process (what ``aheadrank build`` does after each stage)."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import time

        from aheadrank.indexer.bm25 import java_classes, release_java_memory

        def rss():
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS:"))

        print(release_java_memory())  # no JVM yet
        java_classes()
        from jnius import autoclass

        buffers = [autoclass("java.nio.ByteBuffer").allocate(64 * 2**20) for _ in range(5)]  # 320 MB, zeroed
        grown = rss()
        del buffers
        ran = release_java_memory()
        for _ in range(100):  # the JVM hands the heap back from a thread of its own, within a moment
            if grown - rss() >= 160:
                break
            time.sleep(0.1)
        print(ran, grown - rss())
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    before, after = out.stdout.split("\n")[:2]
    assert before == "False"
    ran, freed_mb = after.split()
    assert ran == "True" and int(freed_mb) >= 160, out.stdout


def test_the_jvm_leaves_sigterm_to_python():
    """A handler Python installed before Pyserini started the JVM still gets SIGTERM (``-Xrs``): a build stopped
    by SIGTERM is not exited by Java under a running torch computation, and a server's graceful shutdown runs."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import os, signal, time
        got = []
        signal.signal(signal.SIGTERM, lambda sig, frame: got.append(sig))
        from aheadrank.indexer.bm25 import java_classes
        java_classes()
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100):  # bounded: 10 s at most
            if got:
                break
            time.sleep(0.1)
        print("handled" if got else "not handled", flush=True)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "handled", (
        done.returncode,
        done.stdout,
        done.stderr,
    )
