"""``aheadrank store-info DIR`` and ``aheadrank verify-store DIR`` (heavy imports live inside the commands)."""

from __future__ import annotations

from pathlib import Path

import typer

from aheadrank.cli.app import app
from aheadrank.cli.options import opt, user_errors

DTYPE_NOTES = {
    "int8": " (per-token float32 scale)",
    "book4": " (4-bit codes, 2 a byte; per shard a float32 codebook of 16 levels per dimension)",
    "book2": " (2-bit codes, 4 a byte; per shard a float32 codebook of 4 levels per dimension)",
}


def _summary(path: Path) -> dict:
    from aheadrank.store.manifest import read_manifest
    from aheadrank.store.reader import shard_file_problems

    manifest = read_manifest(path)
    spec = manifest.spec
    tokens = manifest.n_tokens
    missing, sizes = shard_file_problems(Path(path), manifest.shards)
    return {
        "path": str(path),
        "complete": manifest.complete,
        # the shard files as the manifest lists them (sizes only; verify-store checks their sha256)
        "file_problems": [f"{name}: missing" for name in missing] + sizes,
        "format_version": manifest.format_version,
        "documents": manifest.n_docs,
        "tokens": tokens,
        "mean_doc_len": round(tokens / manifest.n_docs, 2) if manifest.n_docs else 0.0,
        "bytes": manifest.n_bytes,
        "bytes_per_token": round(manifest.n_bytes / tokens, 2) if tokens else 0.0,
        "fields": spec.fields,
        "compression": spec.compression,
        "dtype": spec.dtype,
        "max_doc_len": spec.max_doc_len,
        "shard_size": spec.shard_size,
        "shards": len(manifest.shards),
        "ranker_kind": spec.ranker_kind,
        "strategy": spec.strategy,
        "fingerprint": spec.fingerprint,
        "created": manifest.created,
        "dense_field": _dense_state(path, manifest),
        "passages": _passages_state(path, manifest),
        "windows": _windows_state(path, manifest),
        "text_digest": manifest.text_digest or None,
    }


def _dense_state(path: Path, manifest) -> str:
    """What the store's dense field (dense/) is: complete, incomplete, missing, or none."""
    from aheadrank.store.manifest import DENSE_DIR, MANIFEST_NAME, read_manifest

    sub = Path(path) / DENSE_DIR
    if (sub / MANIFEST_NAME).is_file():
        dense = read_manifest(sub)
        if dense.complete:
            return f"complete ({dense.n_docs:,} documents, {DENSE_DIR}/)"
        return f"INCOMPLETE ({dense.n_docs:,} documents so far: resume the build)"
    if manifest.dense:
        return f"MISSING ({DENSE_DIR}/ was requested: resume the build)"
    return "none (--no-dense)" if manifest.dense is False else "none"


def _passages_state(path: Path, manifest) -> str:
    """What the store's long documents as passages (passages/) are: the split and how many, or none."""
    from aheadrank.store.passages import PASSAGES_DIR

    p = manifest.passages
    if p is None:
        return "none (long documents: their first window)"
    split = f"window {p['window']}, overlap {p['overlap']}, at most {p['max_passages']} a document"
    return _parts_state(Path(path) / PASSAGES_DIR, split, "passages")


def _windows_state(path: Path, manifest) -> str:
    """What the store's sentence windows (windows/, the window prior) are: the cut and how many, or none."""
    from aheadrank.store.windows import WINDOWS_DIR

    w = manifest.windows
    if w is None:
        return "none (no window prior)"
    return _parts_state(Path(path) / WINDOWS_DIR, f"{w['sentences']} sentences", "windows")


def _parts_state(sub: Path, how: str, parts: str) -> str:
    """``how`` and how many documents and ``parts`` a sub-store of documents' parts holds, or that it is not whole."""
    from aheadrank.store import StoreReader
    from aheadrank.store.manifest import MANIFEST_NAME, read_manifest
    from aheadrank.store.passages import passage_counts

    if not (sub / MANIFEST_NAME).is_file() or not read_manifest(sub).complete:
        return f"{how}: INCOMPLETE or MISSING ({sub.name}/: resume the build)"
    with StoreReader(sub) as reader:
        counts = passage_counts(reader.docids())
    return f"{how}: {len(counts):,} documents, {sum(counts.values()):,} {parts} ({sub.name}/)"


@app.command("store-info")
@user_errors
def store_info(
    path: Path = typer.Argument(..., help="Store directory (holds manifest.json and shard-NNNNN.h5)."),
    as_json: bool = opt(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Summarise a representation store: documents, tokens, bytes per token, fields, format; exit 1 where a
    shard file is missing or not the size its manifest says (verify-store checks their checksums too)."""
    import json

    info = _summary(path)
    if as_json:
        typer.echo(json.dumps(info, indent=2))
    else:
        _print_summary(info)
    if info["file_problems"]:  # never "complete" over files that are not what the manifest lists
        raise typer.Exit(1)


def _print_summary(info: dict) -> None:
    status = "complete" if info["complete"] else "INCOMPLETE (build interrupted: resume it)"
    if info["file_problems"]:
        status = (
            "DAMAGED: " + "; ".join(info["file_problems"][:3]) + " (aheadrank verify-store checks it all)"
        )
    fields = ", ".join(f"{name}[{dim}]" for name, dim in info["fields"].items())
    rows = [
        ("store", f"{info['path']} ({status})"),
        ("documents", f"{info['documents']:,}"),
        (
            "tokens",
            f"{info['tokens']:,} (mean {info['mean_doc_len']} per document, max {info['max_doc_len']})",
        ),
        ("bytes", f"{info['bytes']:,} ({info['bytes'] / 2**30:.3f} GiB)"),
        ("bytes per token", f"{info['bytes_per_token']}"),
        ("fields", fields),
        ("dtype", info["dtype"] + DTYPE_NOTES.get(info["dtype"], "")),
        ("compression", info["compression"]),
        ("shards", f"{info['shards']} (up to {info['shard_size']:,} documents each)"),
        ("ranker", f"{info['ranker_kind']}" + (f", strategy {info['strategy']}" if info["strategy"] else "")),
        ("fingerprint", info["fingerprint"]),
        ("dense field", info["dense_field"]),
        ("passages", info["passages"]),
        ("windows", info["windows"]),
        ("text digests", info["text_digest"] or "none (texts sent to /rerank are encoded online)"),
        ("format version", str(info["format_version"])),
    ]
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        typer.echo(f"{key:<{width}}  {value}")


@app.command("verify-store")
@user_errors
def verify_store_cmd(
    path: Path = typer.Argument(..., help="Store directory to check."),
    collection: Path | None = opt(
        None,
        "--collection",
        help="the collection the store was built from: also check each document's docid and text digest "
        "(what /rerank looks texts up by) against its text",
    ),
) -> None:
    """Check the manifest and every shard's size, sha256 and layout, the sub-stores' too (dense/, passages/,
    windows/), and that each is complete when the store was built with it and of the same collection; exit 1
    naming each problem."""
    from aheadrank.store.verify import verify_store

    texts = None
    if collection is not None:
        from aheadrank.indexer.collections import Collection

        texts = ((doc.docid, doc.text) for doc in Collection(collection))
    problems = verify_store(path, texts=texts)
    if problems:
        for problem in problems:
            typer.echo(f"FAILED {problem}", err=True)
        raise typer.Exit(1)
    typer.echo(f"OK {path}")
