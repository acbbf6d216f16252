"""``aheadrank bm25-index`` and ``aheadrank bm25-search`` (heavy imports live inside the commands)."""

from __future__ import annotations

from pathlib import Path

import typer

from aheadrank.app import app
from aheadrank.cliutil import env, user_errors
from indexer.collections import CollectionFormat


def _default_threads() -> int:
    from indexer.bm25 import default_threads

    return default_threads()


@app.command("bm25-index")
@user_errors
def bm25_index(
    collection: Path = typer.Option(
        ...,
        "--collection",
        envvar=env("collection"),
        help="Collection file (BEIR/Pyserini JSONL or TSV, plain/.gz/.zst) or BEIR directory (corpus.jsonl).",
    ),
    index: Path = typer.Option(..., "--index", envvar=env("index"), help="Lucene index directory to write."),
    threads: int | None = typer.Option(
        None,
        "--threads",
        min=1,
        envvar=env("threads"),
        help="Indexing threads (default: the number of usable CPUs).",
    ),
    fmt: CollectionFormat = typer.Option(
        CollectionFormat.AUTO, "--format", envvar=env("collection-format"), help="Collection format."
    ),
    strict: bool = typer.Option(
        False,
        "--strict/--no-strict",
        envvar=env("strict"),
        help="Fail at the first malformed line, duplicate docid or empty document (default: skip and count).",
    ),
    k1: float = typer.Option(0.9, "--k1", min=0.0, envvar=env("k1"), help="BM25 k1 recorded as default."),
    b: float = typer.Option(
        0.4, "--b", min=0.0, max=1.0, envvar=env("b"), help="BM25 b recorded as default."
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress", envvar=env("progress")),
    tmp_dir: Path | None = typer.Option(
        None,
        "--tmp-dir",
        envvar=env("tmp-dir"),
        help="Where the temporary JsonCollection copy goes (default: the system temp folder).",
    ),
) -> None:
    """Build the BM25 Lucene index (positions, document vectors and raw text stored) of a collection."""
    from indexer.bm25 import build_bm25_index

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
    index: Path = typer.Option(..., "--index", envvar=env("index"), help="Lucene index directory."),
    query: str = typer.Option(..., "--query", "-q", envvar=env("query"), help="Query text."),
    k: int = typer.Option(10, "-k", "--k", min=1, envvar=env("k"), help="Number of hits."),
    k1: float | None = typer.Option(
        None, "--k1", min=0.0, envvar=env("k1"), help="BM25 k1 (default: the index's)."
    ),
    b: float | None = typer.Option(
        None, "--b", min=0.0, max=1.0, envvar=env("b"), help="BM25 b (default: the index's)."
    ),
    width: int = typer.Option(
        100, "--width", min=0, envvar=env("width"), help="Characters of each document's text to show."
    ),
) -> None:
    """Debug: print the BM25 top-k of one query (rank, docid, score, start of the text)."""
    from indexer.bm25 import Bm25Searcher

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
