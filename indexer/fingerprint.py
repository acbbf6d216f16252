"""What a build read of its collection, so that a build resumed or reused after the collection changed is refused.

A build's stages each read the collection (BM25, the dense field, the store, the pseudo-queries); a build stopped
and run again, or another one linking its shared stages (``--reuse``), must read the same bytes, or its BM25 index,
dense field and store would hold different documents and the service would answer from a mix without a word.
:func:`collection_fingerprint` records each file the build reads — the corpus files, and where the build trains on
judgments the queries and the qrels split — with its size, modification time and sha256; :func:`changes` says how
another fingerprint differs. A file whose size and modification time are those recorded keeps its recorded digest
rather than being read again (what make and rsync assume), so a resumed build over a large corpus does not re-hash it.
"""

from __future__ import annotations

from pathlib import Path

from aheadrank.fsfaults import sha256_file


def _entry(file: Path, known: dict | None) -> dict:
    st = file.stat()
    if known and known.get("bytes") == st.st_size and known.get("mtime_ns") == st.st_mtime_ns:
        return dict(known)
    return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256_file(file)}


def read_files(collection: str | Path, split: str | None) -> dict[str, Path | None]:
    """The files a build of ``collection`` reads, by name relative to it: the corpus files, and for a BEIR folder
    trained on the qrels ``split`` its queries and ``qrels/<split>.tsv`` (listed as None while absent, so that one
    added later is a change: ``--labels auto`` would then train on it)."""
    from aheadrank.indexer.collections import resolve_files
    from aheadrank.indexer.topics import QUERY_NAMES, qrels_file

    root = Path(collection)
    files: dict[str, Path | None] = {}
    for f in resolve_files(root):
        files[f.name if f == root else str(f.relative_to(root))] = f
    if split is not None and root.is_dir():
        for name in QUERY_NAMES:
            if (root / name).is_file():
                files[name] = root / name
                break
        qrels = qrels_file(root, split)  # qrels/<split>.tsv, or its .gz / .zst / .txt form
        files[f"qrels/{qrels.name if qrels else f'{split}.tsv'}"] = qrels
    return files


def collection_fingerprint(collection: str | Path, split: str | None, known: dict | None = None) -> dict:
    """``{name: {bytes, mtime_ns, sha256} or None}`` for :func:`read_files`; ``known``: a fingerprint recorded
    before, whose digests are kept for files unchanged in size and modification time."""
    known = known or {}
    return {
        name: None if f is None else _entry(f, known.get(name))
        for name, f in read_files(collection, split).items()
    }


def changes(old: dict, new: dict) -> list[str]:
    """How ``new`` differs from ``old`` in content (modification times alone are no change), one phrase a file."""
    said = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if (a or {}).get("sha256") == (b or {}).get("sha256"):
            continue
        if a is None:
            said.append(f"{name} is new")
        elif b is None:
            said.append(f"{name} is gone")
        elif a["bytes"] != b["bytes"]:
            said.append(f"{name} was {a['bytes']:,} bytes, now {b['bytes']:,}")
        else:
            said.append(f"{name} has other content of the same size")
    return said
