"""``aheadrank bm25-index`` and ``aheadrank bm25-search`` (heavy imports live inside the commands)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import typer

from aheadrank.cli.app import app
from aheadrank.cli.options import device_opt, env, opt, scheduler_opt, user_errors, workers_opt
from aheadrank.errors import AheadrankError
from aheadrank.indexer.collections import CollectionFormat


def _default_threads() -> int:
    from aheadrank.indexer.bm25 import default_threads

    return default_threads()


@app.command("bm25-index")
@user_errors
def bm25_index(
    collection: Path = opt(
        ...,
        "--collection",
        help="Collection file (BEIR/Pyserini JSONL or TSV, plain/.gz/.zst) or BEIR directory (corpus.jsonl).",
    ),
    index: Path = opt(..., "--index", help="Lucene index directory to write."),
    threads: int | None = opt(
        None,
        "--threads",
        min=1,
        help="Indexing threads (default: the number of usable CPUs).",
    ),
    fmt: CollectionFormat = typer.Option(
        CollectionFormat.AUTO, "--format", envvar=env("collection-format"), help="Collection format."
    ),
    strict: bool = opt(
        False,
        "--strict/--no-strict",
        help="Fail at the first malformed line, duplicate docid or empty document (default: skip and count).",
    ),
    k1: float = opt(0.9, "--k1", min=0.0, help="BM25 k1 recorded as default."),
    b: float = opt(0.4, "--b", min=0.0, max=1.0, help="BM25 b recorded as default."),
    progress: bool = opt(
        True,
        "--progress/--no-progress",
    ),
    tmp_dir: Path | None = opt(
        None,
        "--tmp-dir",
        help="Where the temporary JsonCollection copy goes (default: next to the index; removed after).",
    ),
    java_heap: str | None = opt(
        None,
        "--java-heap",
        help="Maximum heap of the JVM that runs Lucene's indexer, as -Xmx (e.g. 1g; default: Java's, a quarter "
        "of the machine's or the container's memory).",
    ),
    language: str = opt(
        "en",
        "--language",
        help="The analyzer: en (Porter stemmer, English stopwords), fr, de, es, it, pt or nl (Lucene's for that "
        "language); recorded in the index, so searches analyse queries the same way.",
    ),
    overwrite: bool = opt(
        False,
        "--overwrite",
        help="Replace an index at --index that was built from another collection (or by another tool); an "
        "index of the same collection is rebuilt without it.",
    ),
) -> None:
    """Build the BM25 Lucene index (positions, document vectors and raw text stored) of a collection; an index of
    the same collection at --index is rebuilt, one of another collection is replaced only with --overwrite."""
    from aheadrank.indexer.bm25 import build_bm25_index, set_java_heap

    set_java_heap(java_heap)

    result = build_bm25_index(
        collection,
        index,
        threads=threads or _default_threads(),
        fmt=fmt,
        strict=strict,
        k1=k1,
        b=b,
        progress=progress,
        tmp_dir=tmp_dir,
        language=language,
        overwrite=overwrite,
    )
    skipped = result.report.skipped
    typer.echo(
        f"indexed {result.documents:,} documents into {result.index_dir} in {result.seconds:.1f} s "
        f"(convert {result.convert_seconds:.1f} s, Lucene {result.index_seconds:.1f} s)"
        + (f"; skipped {skipped:,} records, see the warning above" if skipped else "")
    )


@app.command("bm25-search")
@user_errors
def bm25_search(
    index: Path = opt(..., "--index", help="Lucene index directory."),
    query: str = opt(..., "--query", "-q", help="Query text."),
    k: int = opt(10, "-k", "--k", min=1, help="Number of hits."),
    k1: float | None = opt(None, "--k1", min=0.0, help="BM25 k1 (default: the index's)."),
    b: float | None = opt(None, "--b", min=0.0, max=1.0, help="BM25 b (default: the index's)."),
    width: int = opt(100, "--width", min=0, help="Characters of each document's text to show."),
) -> None:
    """Debug: print the BM25 top-k of one query (rank, docid, score, start of the text)."""
    from aheadrank.indexer.bm25 import Bm25Searcher

    with Bm25Searcher(index, k1=k1, b=b) as searcher:
        hits = searcher.search(query, k)
        for rank, (docid, score) in enumerate(hits, start=1):
            text = " ".join((searcher.doc_text(docid) or "").split())
            snippet = text[:width] + ("…" if len(text) > width else "")
            typer.echo(
                f"{rank:>4}  {docid:<20} {score:9.4f}  {snippet}"
                if width
                else f"{rank}\t{docid}\t{score:.4f}"
            )
    if not hits:
        typer.echo("no hits", err=True)


@app.command("index")
@user_errors
def index_cmd(
    checkpoint: Path = opt(..., "--checkpoint", help="Ranker checkpoint."),
    collection: Path = opt(..., "--collection", help="Collection path."),
    store: Path = opt(..., "--store", help="Representation store directory."),
    strategy: str | None = opt(None, "--strategy", help="MORES: s1 or s2."),
    shard_size: int | None = opt(
        None,
        "--shard-size",
        min=1,
        help="Documents a shard holds (default: the store's own when resuming, else 1,024). A build holds up to "
        "two shards in memory and a resumed one redoes at most one.",
    ),
    batch_size: int = opt(
        64,
        "--batch-size",
        min=1,
        envvar="AHEADRANK_DOC_BATCH_SIZE",  # documents a forward pass, as serve's --doc-batch-size
        help="documents a forward pass",
    ),
    max_doc_len: int | None = opt(
        None,
        "--max-doc-len",
        min=1,
    ),
    device: str = device_opt(),
    dtype: str = opt(
        "float16",
        "--dtype",
        help="float16, int8 (a float32 scale per token), book4 or book2 (4 / 2 bits a value: per shard and dimension "
        "a codebook fitted to the shard's values).",
    ),
    compression: str = opt("none", "--compression", help="none or zstd."),
    scheduler: str | None = scheduler_opt(),
    workers: int | None = workers_opt(),
    strict: bool = opt(
        False,
        "--strict/--no-strict",
    ),
    overwrite: bool = opt(False, "--overwrite", help="Start over: delete an existing store first."),
    progress: bool = opt(True, "--progress/--no-progress"),
    dense: bool = opt(
        True,
        "--dense/--no-dense",
        help="Also write the dense prior's field (the base bi-encoder's document embedding, <store>/dense).",
    ),
    dense_from: Path | None = opt(
        None,
        "--dense-from",
        help="Copy the dense field from this dense store (same base, same documents) instead of encoding.",
    ),
    passages: bool = opt(
        False,
        "--passages/--no-passages",
        help="Also store each document longer than the ranker's window as passages (<store>/passages), split as "
        "the service splits an ad-hoc text, so its stored score is the one /rerank gives its text.",
    ),
    passage_overlap: int | None = opt(
        None,
        "--passage-overlap",
        min=0,
        help="With --passages: word pieces consecutive passages share "
        "(default: a quarter of the window; at most half of it). Serve with the same.",
    ),
    max_chunks_per_doc: int | None = opt(
        None,
        "--max-chunks-per-doc",
        min=1,
        help="With --passages: at most this many passages a document "
        "(default 10, the service's default); the service may read fewer, not more.",
    ),
    windows: bool = opt(
        False,
        "--windows/--no-windows",
        help="Also store the bi-encoder's 2-sentence windows (title in front) of each document of two or more "
        "(<store>/windows): the window prior, weighed where the checkpoint's priors weigh it (aheadrank "
        "fit-priors on this store fits it; aheadrank build stores them by itself where label-free).",
    ),
) -> None:
    """Build (or resume) the representation store: the checkpoint's document side over the collection,
    plus the dense prior's field (one embedding per document). It first counts the collection and prints
    the store's size and the free space, and stops before writing where the disk has too little room."""
    from aheadrank.build import WINDOW_SENTENCES
    from aheadrank.indexer.build import (
        BuildOptions,
        build_dense,
        build_passages,
        build_store,
        check_dask,
        index_room,
        index_windows,
    )

    check_dask(scheduler, workers)
    opts = BuildOptions(
        checkpoint=str(checkpoint),
        collection=str(collection),
        store=str(store),
        strategy=strategy,
        shard_size=shard_size,
        batch_size=batch_size,
        max_doc_len=max_doc_len,
        device=device,
        dtype=dtype,
        compression=compression,
        strict=strict,
        overwrite=overwrite,
        scheduler=scheduler,
        workers=workers,
        progress=progress,
        dense=dense or dense_from is not None,  # recorded in the manifest: dense/ is then part of the store
        passages=passages,
        passage_overlap=passage_overlap,
        max_chunks_per_doc=max_chunks_per_doc,
    )
    if not passages and (passage_overlap is not None or max_chunks_per_doc is not None):
        raise AheadrankError("--passage-overlap and --max-chunks-per-doc need --passages")
    if windows and not (dense or dense_from is not None):
        raise AheadrankError("--windows needs the dense field: drop --no-dense (or give --dense-from)")
    room, documents = index_room(opts)  # refuses a store that cannot fit, before the model loads
    if room:
        typer.echo(room)
    opts = replace(opts, documents=documents)
    summary = build_store(opts)
    split = build_passages(opts) if passages else None
    dense_summary = build_dense(opts, dense_from) if dense or dense_from else None
    cut = index_windows(opts, WINDOW_SENTENCES) if windows else None
    typer.echo(
        f"stored {summary.documents:,} documents ({summary.tokens:,} tokens) in {summary.shards} shards "
        f"({summary.shards_reused} reused) at {summary.store} in {summary.seconds:.1f} s "
        f"({summary.docs_per_s:.0f} docs/s)"
        + (f"; skipped {summary.skipped:,} records" if summary.skipped else "")
        + (
            f"; dense field: {dense_summary.documents:,} documents in {dense_summary.seconds:.1f} s"
            if dense_summary
            else "; dense field copied from " + str(dense_from)
            if dense_from
            else "; no dense field (--no-dense): served without the dense prior"
        )
        + (f"; {split.documents:,} passages of long documents ({split.tokens:,} tokens)" if split else "")
        + (f"; {cut.documents:,} sentence windows in {cut.seconds:.1f} s" if cut else "")
    )
