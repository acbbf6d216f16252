"""The bi-encoder's sentence windows of each document: the sub-store ``windows/`` (the ``window`` prior).

A document of more than ``sentences`` sentences is cut into overlapping windows of that many consecutive
sentences, its title in front of each (:func:`aheadrank.indexer.pseudo_queries.sentence_passages`), and each
window is embedded by the dense prior's bi-encoder (rankers/dense.py) into an entry of its own in
``<store>/windows/``, named as passages are (``<docid>#p<k>``, :func:`aheadrank.store.passages.passage_docid`).
A document that is one window has no entry: its best window is the whole document, the dense field's row.
The served ``window`` feature is a candidate's best window's cosine with the query
(:func:`aheadrank.rerank.window_cosines`); bench/results/label-free/window-rule/ measured it.

What the windows were cut with is recorded twice, as for passages: in the store's manifest (``"windows":
{"sentences"}``, written before ``windows/`` is copied in: a store whose ``windows/`` is then missing or
incomplete is refused, never served without it) and in ``windows/``'s own ``config`` (the same, plus
``collection``: the store's collection fingerprint, ``{"documents", "sha256"}``, which binds it to the store).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aheadrank.errors import StoreError

WINDOWS_DIR = "windows"
RECORD_KEYS = ("sentences",)


def window_record(sentences: int) -> dict[str, Any]:
    """What the windows were cut with (recorded in the manifests)."""
    if sentences < 1:
        raise ValueError(f"a window needs at least 1 sentence, got {sentences}")
    return {"sentences": int(sentences)}


def binding_problem(main, sub, fingerprint: str | None = None) -> str | None:
    """Why ``windows/`` (manifest ``sub``) does not belong to its store (manifest ``main``), or None; with
    ``fingerprint``, also when another dense encoder wrote it."""
    recorded = sub.spec.config.get("windows") or {}
    if fingerprint is not None and sub.spec.fingerprint != fingerprint:
        return (
            f"{WINDOWS_DIR}/ was written by dense encoder {sub.spec.fingerprint[:12]}, the priors were fitted "
            f"with {fingerprint[:12]}"
        )
    want = {k: (main.windows or {}).get(k) for k in RECORD_KEYS}
    got = {k: recorded.get(k) for k in RECORD_KEYS}
    if got != want:
        return f"{WINDOWS_DIR}/ was cut with {got}, the store records {want}"
    ours, theirs = main.collection or {}, recorded.get("collection") or {}
    if ours.get("sha256") and (ours.get("sha256"), ours.get("documents")) != (
        theirs.get("sha256"),
        theirs.get("documents"),
    ):
        return f"{WINDOWS_DIR}/ was built from another collection than the store"
    return None


def open_windows(store: str | Path, fingerprint: str, main_reader=None):
    """The store's windows (``<store>/windows``) as :class:`~aheadrank.store.passages.StoredPassages` (its
    reader, each multi-window document's number of windows, the record): None when the store records none; a
    StoreError, never a silent serve without them, when it records them and ``windows/`` is missing or
    incomplete, written by another dense encoder than ``fingerprint``, cut otherwise than recorded, built from
    another collection or holding windows of documents the store does not."""
    from aheadrank.store.manifest import read_manifest
    from aheadrank.store.passages import StoredPassages, open_parts, whole_sub

    main = main_reader.manifest if main_reader is not None else read_manifest(store)
    if main.windows is None:
        return None
    sub_dir = Path(store) / WINDOWS_DIR
    sub = whole_sub(store, sub_dir, "sentence windows", "aheadrank build` or `aheadrank index --windows")
    why = binding_problem(main, sub, fingerprint)
    if why:
        raise StoreError(
            f"refusing the store {store}: {why}. Rebuild it (`aheadrank build` into a new --out, or `aheadrank "
            "index --overwrite --windows`)"
        )
    reader, counts = open_parts(
        store,
        sub_dir,
        main_reader,
        "windows",
        "Rebuild it (`aheadrank build`, or `aheadrank index --overwrite --windows`)",
    )
    return StoredPassages(reader, counts, dict(main.windows))
