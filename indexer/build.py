"""Representation-store builds: a ranker's document side over a collection, written shard by shard.

One shard is the unit of work everywhere: documents are assigned to shards in collection order
(shard i holds documents ``[i·S, (i+1)·S)``), each shard is tokenised, sorted by length into batches (little
padding), encoded with ``document_fields`` and written atomically by ``store.write_shard``; the manifest is
rewritten after every finished shard (``complete: false``) and once more at the end (``complete: true``).
So an interrupted build resumes by skipping the shards the manifest lists, and a local build, a resumed
build and a Dask build write the same shards.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aheadrank.errors import AheadrankError, StoreError
from aheadrank.fsfaults import check_writable, describe, exclusive_lock

log = logging.getLogger("aheadrank.indexer")
DENSE_DIR = "dense"  # a store's sub-store holding the dense prior's field (one row per document)
PASSAGES_DIR = "passages"  # a store's sub-store holding its long documents' passages (store/passages.py)
WINDOWS_DIR = "windows"  # a store's sub-store holding the bi-encoder's sentence windows (store/windows.py)
# documents a shard holds unless told (--shard-size): a build holds up to two shards' fields in memory (one being
# encoded, one being written) and redoes at most one when resumed, so this bounds both its memory and what a stop
# costs (MORES 2×IB S2: about 0.4 GB a shard; bench/results/build-memory/). A store being resumed keeps its own.
DEFAULT_SHARD_SIZE = 1_024


@dataclass
class BuildOptions:
    checkpoint: str
    collection: str
    store: str
    strategy: str | None = None
    shard_size: int | None = None  # None: the existing store's (a build resumed), else DEFAULT_SHARD_SIZE
    batch_size: int = 64
    max_doc_len: int | None = None
    device: str = "cpu"
    dtype: str = "float16"
    compression: str = "none"
    strict: bool = False
    overwrite: bool = False
    scheduler: str | None = None
    workers: int | None = None
    progress: bool = True
    # "dense": the base bi-encoder's field for the dense prior (rankers/dense.py); "windows": the same bi-encoder
    # over each document's sentence windows (store/windows.py, built by ensure_window_field)
    encoder: str = "ranker"
    # recorded in the store's manifest: True: the dense field (dense/) is part of the store, so it is served
    # only once dense/ is complete; False: --no-dense; None: not recorded (build_dense records True)
    dense: bool | None = None
    # --passages: documents longer than the ranker's window are also stored as passages (<store>/passages,
    # build_passages); the overlap in word pieces (None: a quarter of the window) and the cap per document
    passages: bool = False
    passage_overlap: int | None = None
    max_chunks_per_doc: int | None = None  # None: aheadrank.passages.DEFAULT_MAX_PASSAGES
    # set by build_passages for the passages/ build (encoder "passages"), by ensure_window_field for a window
    # field (encoder "windows": {"sentences", "collection"})
    split_record: dict | None = None
    # the collection's documents where already counted (aheadrank build's collection stage, index's room check):
    # the progress bar's total, so it shows the time left (entries per document: the ranker's and dense field)
    documents: int | None = None


@dataclass
class BuildSummary:
    store: str
    documents: int
    tokens: int
    shards: int
    shards_reused: int
    seconds: float  # from the loaded checkpoint to the final manifest (documents/s is measured on this)
    skipped: int = 0
    documents_reused: int = 0  # in the shards a resumed build found finished (not encoded by this run)
    load_seconds: float = 0.0  # loading (and fingerprint-checking) the checkpoint, once per build
    collection_report: dict[str, Any] = field(default_factory=dict)

    @property
    def docs_per_s(self) -> float:
        """The documents this run encoded a second: a resumed build's finished shards are not counted."""
        return (self.documents - self.documents_reused) / self.seconds if self.seconds else 0.0


# ---- the ranker, once per process ---------------------------------------------------------------
_RANKERS: dict[tuple, Any] = {}
_RANKER_LOCK = threading.Lock()


def get_ranker(
    checkpoint: str, strategy: str | None, device: str, max_doc_len: int | None, encoder: str = "ranker"
):
    """Load a checkpoint once per process (Dask workers reuse it across shard tasks). ``encoder="dense"``
    gives the dense prior's encoder (the base the checkpoint was initialised from) instead."""
    from aheadrank.rankers import load_ranker

    encoder = "ranker" if encoder == "passages" else encoder  # the passages are the ranker's documents
    encoder = "dense" if encoder == "windows" else encoder  # the windows are the bi-encoder's documents
    key = (str(Path(checkpoint).resolve()) if checkpoint else "", strategy, device, max_doc_len, encoder)
    with _RANKER_LOCK:
        if key not in _RANKERS and encoder == "dense":
            from aheadrank.rankers.dense import dense_encoder

            _RANKERS[key] = dense_encoder(_dense_base(checkpoint), device=device)
        if key not in _RANKERS:
            ranker = load_ranker(checkpoint, device=device, strategy=strategy)
            if max_doc_len is not None:
                ranker.limit_doc_len(max_doc_len)
            _RANKERS[key] = ranker
        return _RANKERS[key]


def release_rankers() -> None:
    """Forget the rankers :func:`get_ranker` keeps for later shards (a caller that builds one store per
    ranker frees each when its build is done)."""
    with _RANKER_LOCK:
        _RANKERS.clear()


def _dense_base(source: str) -> str | None:
    """The base model of the dense encoder: a ranker checkpoint's base, a base model folder itself, or
    ``""`` for the packaged all-MiniLM-L6-v2."""
    from aheadrank.rankers import load_config
    from aheadrank.rankers.dense import base_of

    if not source:
        return None
    if (Path(source) / "fingerprint.json").is_file():
        return base_of(load_config(source))
    return source


def make_spec(ranker, opts: BuildOptions):
    from aheadrank.store import StoreSpec

    return StoreSpec(
        fields=ranker.field_dims(),
        fingerprint=ranker.fingerprint,
        ranker_kind=ranker.kind,
        strategy=ranker.strategy,
        max_doc_len=ranker.max_doc_tokens(),
        compression=opts.compression,
        dtype=opts.dtype,
        shard_size=opts.shard_size,
        config={
            "ranker": ranker.describe(),
            "checkpoint": str(opts.checkpoint),
            **({"passages": opts.split_record} if opts.encoder == "passages" else {}),
            **({"windows": opts.split_record} if opts.encoder == "windows" else {}),
        },
    )


# ---- encoding one shard ---------------------------------------------------------------------------
def length_batches(lengths: Sequence[int], batch_size: int) -> list[np.ndarray]:
    """Indices sorted by length (longest first), cut into batches: little padding, stable order."""
    order = np.argsort(-np.asarray(lengths), kind="stable")
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def encode_token_ids(
    ranker,
    seqs: list[list[int]],
    batch_size: int,
    on_batch: Callable[[int, int], None] | None = None,
    half: bool = True,
) -> list[dict[str, np.ndarray]]:
    """Fields ([len, dim] numpy; float16 with ``half``, the store's type, rounded by torch on the device,
    else float32 for int8 quantisation) for tokenised documents, in input order.
    ``on_batch(docs, tokens)`` is called after every batch (progress)."""
    from aheadrank.rankers.text import pad

    out: list[dict[str, np.ndarray] | None] = [None] * len(seqs)
    device = ranker.device
    autocast = (
        torch.autocast("cuda", dtype=torch.float16)
        if device.type == "cuda"
        else torch.autocast("cpu", enabled=False)
    )
    with torch.inference_mode(), autocast:
        for idx in length_batches([len(s) for s in seqs], batch_size):
            ids, mask = pad([seqs[i] for i in idx], device, ranker._text().pad)
            encoded = ranker.document_fields(ids, mask)
            fields = {k: (v.half() if half else v.float()).cpu().numpy() for k, v in encoded.items()}
            for row, i in enumerate(idx):
                n = len(seqs[i])
                out[i] = {k: v[row, :n] for k, v in fields.items()}
            if on_batch is not None:
                on_batch(len(idx), int(mask.sum()))
    return out  # type: ignore[return-value]


def encode_shard_texts(ranker, texts: list[str], batch_size: int, half: bool) -> list[dict[str, np.ndarray]]:
    return encode_token_ids(ranker, ranker.tokenize_documents(texts), batch_size, half=half)


def shard_task(
    checkpoint: str,
    strategy: str | None,
    device: str,
    max_doc_len: int | None,
    store_dir: str,
    spec_dict: dict,
    shard_index: int,
    docids: list[str],
    texts: list[str],
    batch_size: int,
    threads: int | None = None,
    encoder: str = "ranker",
):
    """One Dask task: encode one shard's documents and write its file atomically; returns its ShardInfo."""
    from aheadrank.store import StoreSpec, write_shard

    if threads:
        torch.set_num_threads(threads)
    ranker = get_ranker(checkpoint, strategy, device, max_doc_len, encoder)
    spec = StoreSpec(**spec_dict)
    fields = encode_shard_texts(ranker, texts, batch_size, half=spec.dtype != "int8")
    digested = texts if encoder == "ranker" else None  # the service looks texts up in the ranker's store
    return write_shard(store_dir, shard_index, spec, docids, fields, digested)


# ---- reading the collection in shards -------------------------------------------------------------
def iter_shards(collection, shard_size: int) -> Iterator[tuple[int, list[str], list[str]]]:
    docids: list[str] = []
    texts: list[str] = []
    index = 0
    for doc in collection:
        docids.append(doc.docid)
        texts.append(doc.text)
        if len(docids) == shard_size:
            yield index, docids, texts
            index, docids, texts = index + 1, [], []
    if docids:
        yield index, docids, texts


def source_digest(docids: Sequence[str], texts: Sequence[str]) -> str:
    """sha256 of a shard's (docid, text) pairs in order: what the manifest records as the shard's ``source``,
    so that a rerun on a changed collection is refused, never silently mixed with the old shards."""
    digest = hashlib.sha256()
    for docid, text in zip(docids, texts, strict=True):
        for part in (docid.encode("utf-8"), text.encode("utf-8", "surrogatepass")):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
    return digest.hexdigest()


def check_same_source(path: Path, info, spec, docids: list[str], digest: str) -> None:
    """A kept shard must hold what the collection has at its position (its recorded source digest; for a
    store written before sources were recorded, its docids)."""
    from aheadrank.store.shard import read_shard_meta

    if info.source:
        if info.source == digest:
            return
        stored = None
    else:
        meta = read_shard_meta(path / info.file, spec, expected_index=info.index)
        stored = [d.decode("utf-8") for d in meta.docids.tolist()]
        if stored == docids:
            return
    first, last = info.index * spec.shard_size, info.index * spec.shard_size + len(docids) - 1
    detail = "their docids or texts differ"
    if stored is not None:
        at = next((i for i, (a, b) in enumerate(zip(stored, docids, strict=False)) if a != b), None)
        detail = (
            f"the store holds {stored[at]!r} where the collection has {docids[at]!r}"
            if at is not None
            else f"the store holds {len(stored)} documents there, the collection {len(docids)}"
        )
    raise StoreError(
        f"store {path} was built from a different collection: {info.file} (documents {first:,}..{last:,}) does "
        f"not match this collection ({detail}). Refusing to mix them: pass --overwrite to rebuild the store "
        "from this collection, or use another --store"
    )


def prefetch(it: Iterator, depth: int = 2) -> Iterator:
    """Run an iterator in a background thread (collection reading and tokenisation hide behind compute)."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()

    def work() -> None:
        try:
            for item in it:
                q.put(item)
        except BaseException as exc:  # re-raised in the consumer
            q.put(exc)
        q.put(done)

    threading.Thread(target=work, daemon=True, name="aheadrank-prefetch").start()
    while True:
        item = q.get()
        if item is done:
            return
        if isinstance(item, BaseException):
            raise item
        yield item


# ---- the build ------------------------------------------------------------------------------------
LOCK_NAME = ".aheadrank-build.lock"


def existing_shard_size(path: str | Path) -> int | None:
    """The shard size of the store at ``path``, complete or not; None where there is none (or its manifest does
    not read: the build then says why)."""
    from aheadrank.store import read_manifest

    if not (Path(path) / "manifest.json").is_file():
        return None
    try:
        return read_manifest(path).spec.shard_size
    except (StoreError, OSError, ValueError):
        return None


def resolve_shard_size(opts: BuildOptions) -> int:
    """``--shard-size`` when given; else the size of the store being resumed (a build begun with another default
    goes on as it began, instead of being refused); else :data:`DEFAULT_SHARD_SIZE`."""
    if opts.shard_size is not None:
        return opts.shard_size
    if opts.overwrite:
        return DEFAULT_SHARD_SIZE
    return existing_shard_size(opts.store) or DEFAULT_SHARD_SIZE


def build_store(opts: BuildOptions) -> BuildSummary:
    """Build (or resume) a representation store from a collection with a checkpoint's document side."""

    path = Path(opts.store)
    check_writable(path, "the store", StoreError)  # before the model loads: a read-only target fails fast
    with exclusive_lock(path / LOCK_NAME, f"the store {path}"):
        try:
            return _build_store_locked(opts, path)
        except OSError as exc:  # disk full, read-only, ...: one line with the cause; finished shards stay
            raise StoreError(
                f"the build of {path} failed: {describe(exc)}. Shards finished so far are kept (the store "
                "stays incomplete and resumable; nothing half-written is listed): fix the cause and re-run"
            ) from exc


def _build_store_locked(opts: BuildOptions, path: Path) -> BuildSummary:
    from aheadrank.indexer.collections import Collection
    from aheadrank.store import prepare_build, write_manifest

    opts = replace(opts, shard_size=resolve_shard_size(opts))
    t_load = time.perf_counter()
    ranker = get_ranker(
        opts.checkpoint,
        opts.strategy,
        opts.device,
        None if opts.encoder in ("dense", "windows") else opts.max_doc_len,
        opts.encoder,
    )
    start = time.perf_counter()
    spec = make_spec(ranker, opts)
    done = prepare_build(
        path, spec, opts.overwrite, keep=(LOCK_NAME,), owned=(DENSE_DIR, PASSAGES_DIR, WINDOWS_DIR)
    )
    collection = Collection(opts.collection, strict=opts.strict)
    if opts.encoder == "passages":  # the entries are the long documents' passages
        check_split_record(path, opts.split_record)
        collection = PassageCollection(collection, ranker, passage_options(ranker, opts))
    if opts.encoder == "windows":  # the entries are the multi-window documents' windows
        check_window_record(path, opts.split_record)
        collection = WindowCollection(collection, int(opts.split_record["sentences"]))
    infos: dict[int, Any] = dict(done)
    sources: dict[int, str] = {}
    counters = {"docs": 0, "tokens": 0}
    per_document = opts.documents is not None and opts.encoder in ("ranker", "dense")
    bar = _progress(
        opts.progress, max(opts.documents - sum(i.n_docs for i in done.values()), 0) if per_document else None
    )

    def encoded(docs: int, tokens: int) -> None:
        counters["docs"] += docs
        counters["tokens"] += tokens
        bar.update(docs)
        elapsed = max(time.perf_counter() - start, 1e-9)
        bar.set_postfix(
            docs_s=f"{counters['docs'] / elapsed:.0f}", tok_s=f"{counters['tokens'] / elapsed:.0f}"
        )

    def finished(info) -> None:
        info = replace(info, source=sources[info.index])
        infos[info.index] = info
        write_manifest(path, spec, [infos[i] for i in sorted(infos)], complete=False)
        if opts.scheduler or opts.workers:  # remote workers report per shard, not per batch
            encoded(info.n_docs, info.n_tokens)

    def shards_to_build() -> Iterator[tuple[int, list[str], list[str]]]:
        for index, docids, texts in iter_shards(collection, opts.shard_size):
            sources[index] = source_digest(docids, texts)
            if index in done:
                check_same_source(path, done[index], spec, docids, sources[index])
            else:
                yield index, docids, texts

    todo = shards_to_build()
    if opts.scheduler or opts.workers:
        _build_dask(opts, spec, todo, finished)
    else:
        from concurrent.futures import ThreadPoolExecutor

        from aheadrank.store import write_shard

        digests = opts.encoder == "ranker"  # text digests (store/texts.py): the service looks texts up
        tokenized = (
            (i, ids, texts if digests else None, ranker.tokenize_documents(texts)) for i, ids, texts in todo
        )
        half = spec.dtype != "int8"  # codebook dtypes fit and code the float16 values
        # shard i is written (HDF5, fsync, sha256) in the background while shard i+1 is encoded
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="aheadrank-writer") as writer:
            pending = None
            for index, docids, texts, seqs in prefetch(tokenized):
                fields = encode_token_ids(ranker, seqs, opts.batch_size, encoded, half=half)
                if pending is not None:
                    finished(pending.result())
                pending = writer.submit(write_shard, path, index, spec, docids, fields, texts)
            if pending is not None:
                finished(pending.result())
    bar.close()
    n_shards = (collection.report.documents + opts.shard_size - 1) // opts.shard_size
    extra = [i for i in sorted(infos) if i >= n_shards]
    if extra:
        raise StoreError(
            f"store {path} was built from a different collection: it holds {len(infos)} shards, this collection "
            f"({collection.report.documents:,} documents) fills {n_shards}. Refusing to mix them: pass "
            "--overwrite to rebuild the store from this collection, or use another --store"
        )
    if sorted(infos) != list(range(n_shards)):
        raise StoreError(f"build of {path} finished with shards {sorted(infos)}, expected 0..{n_shards - 1}")
    ordered = [infos[i] for i in sorted(infos)]
    whole = hashlib.sha256("".join(info.source for info in ordered).encode("ascii")).hexdigest()
    fingerprint = {
        "name": Path(opts.collection).name,
        "documents": collection.report.documents,
        "sha256": whole,
    }
    dense = opts.dense if opts.encoder not in ("dense", "windows") else None
    write_manifest(path, spec, ordered, complete=True, collection=fingerprint, dense=dense)
    return BuildSummary(
        store=str(path),
        documents=sum(s.n_docs for s in infos.values()),
        tokens=sum(s.n_tokens for s in infos.values()),
        shards=len(infos),
        shards_reused=len(done),
        documents_reused=sum(info.n_docs for info in done.values()),
        seconds=time.perf_counter() - start,
        load_seconds=start - t_load,
        skipped=collection.report.skipped,
        collection_report=collection.report.to_dict(),
    )


def _progress(enabled: bool, total: int | None = None):
    from aheadrank.logs import progress_bar

    return progress_bar(desc="index", unit="doc", total=total, disable=not enabled)


def free_bytes(path: str | Path) -> int:
    """Bytes free on the file system that holds ``path`` (its nearest existing folder: a store not yet made)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def store_disk_bytes(store: str | Path) -> dict[str, int]:
    """The store's size on disk in bytes, in all and that of its passages (``passages/``; stored passages can
    take several times the documents' own: bench/results/label-free/README.md) and windows (``windows/``)."""

    def size(d: Path) -> int:
        return sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) if d.is_dir() else 0

    store = Path(store)
    return {"all": size(store), "passages": size(store / PASSAGES_DIR), "windows": size(store / WINDOWS_DIR)}


def collection_size(collection: str | Path, strict: bool = False) -> tuple[int, float]:
    """(documents, mean words a document) of a collection, in one pass over it (a strict one fails on the first
    bad record, as the build would)."""
    from aheadrank.indexer.collections import Collection

    docs = words = 0
    for _, title, body in Collection(collection, strict=strict).titled():
        docs += 1
        words += len(title.split()) + len(body.split())
    return docs, words / max(docs, 1)


def index_room(opts: BuildOptions) -> tuple[str | None, int]:
    """The room check of ``aheadrank index`` before it writes: (the line :func:`aheadrank.buildtime.check_room`
    gives for the ranker's fields at the store's dtype, less what a resumed store holds; the collection's
    documents). The line is None where the store (and its passages) were written before, or where the checkpoint
    or the store cannot tell (the build then reports its own error). An AheadrankError where the store cannot fit;
    with ``--compression zstd`` the estimate is an upper bound and only said."""
    from aheadrank.rankers.checkpoint import config_field_dims, load_config
    from aheadrank.store import read_manifest

    from aheadrank.buildtime import VALUE_BYTES, Workload, check_room, store_bytes

    docs, mean_words = collection_size(opts.collection, opts.strict)
    store = Path(opts.store)
    # a store (and its passages) written before: nothing to estimate (the build checks it is this collection's)
    parts = [store, *([store / PASSAGES_DIR] if opts.passages else [])]
    try:
        if not opts.overwrite and all(
            (d / "manifest.json").is_file() and read_manifest(d).complete for d in parts
        ):
            return None, docs
        config = load_config(opts.checkpoint)
        dims = config_field_dims(config, opts.strategy)
        work = Workload(  # store_bytes reads the documents, their length, the window and passages only
            documents=docs,
            mean_words=mean_words,
            queries=0,
            steps=0,
            cost="",
            window=int(opts.max_doc_len or config.max_doc_len),
            passages=opts.passages,
        )
        estimate = store_bytes(work, sum(dims.values()) * VALUE_BYTES[opts.dtype])
        need = max(estimate - (0 if opts.overwrite else store_disk_bytes(opts.store)["all"]), 0.0)
        free = free_bytes(opts.store)
    except (AheadrankError, OSError, KeyError, TypeError, ValueError) as exc:
        log.debug("no store estimate: %s", exc)
        return None, docs
    line = check_room(
        need,
        free,
        opts.dtype,
        opts.store,
        kept="the shards finished are kept",
        elsewhere="--store",
        refuse=opts.compression == "none",
    )
    return line, docs


def check_dask(scheduler: str | None, workers: int | None) -> None:
    """Refuse both a Dask scheduler and a local cluster's size: the shards are encoded on one or the other."""
    if scheduler and workers:
        raise AheadrankError("give --scheduler or --workers, not both")


@contextmanager
def quiet_dask() -> Iterator[None]:
    """Dask's own INFO lines (a local cluster's start and stop: about a hundred a build, in Dask's format) only where
    aheadrank logs at DEBUG; its warnings and errors always."""
    import distributed  # noqa: F401 -- it sets its logger's level when first imported: before the change below

    logger = logging.getLogger("distributed")
    before = logger.level
    if not logging.getLogger("aheadrank").isEnabledFor(logging.DEBUG):
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(before)


def _build_dask(opts: BuildOptions, spec, todo: Iterator, finished) -> None:
    """One Dask task per shard on an existing cluster (``--scheduler``) or a local one (``--workers``)."""
    with quiet_dask():
        _run_dask(opts, spec, todo, finished)


def _run_dask(opts: BuildOptions, spec, todo: Iterator, finished) -> None:
    from dask.distributed import Client, LocalCluster, as_completed

    cluster = None
    if opts.scheduler:
        client = Client(opts.scheduler)
        threads = None
    else:
        n = int(opts.workers or 1)
        # the scheduler's HTTP routes (health, metrics; no dashboard without bokeh) on a free loopback port, not
        # on 8787, which a second build at the same time would find taken
        cluster = LocalCluster(
            n_workers=n,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
        )
        client = Client(cluster)
        threads = max(1, (os.cpu_count() or 1) // n)
    try:
        spec_dict = asdict(spec)
        futures = [
            client.submit(
                shard_task,
                str(Path(opts.checkpoint).resolve()) if opts.checkpoint else "",  # "": the packaged base
                opts.strategy,
                opts.device,
                opts.max_doc_len,
                str(Path(opts.store).resolve()),
                spec_dict,
                index,
                docids,
                texts,
                opts.batch_size,
                threads,
                opts.encoder,
                key=f"aheadrank-shard-{index}-{spec.fingerprint[:8]}",
                retries=2,
                pure=False,
            )
            for index, docids, texts in todo
        ]
        for fut in as_completed(futures):
            finished(fut.result())
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def ensure_dense_field(
    collection: str | Path,
    path: str | Path,
    base: str | None,
    device: str = "cpu",
    progress: bool = True,
    documents: int | None = None,
    scheduler: str | None = None,
    workers: int | None = None,
) -> BuildSummary | None:
    """The collection's dense field (the base bi-encoder's document embeddings, ``base`` None or "" for the
    packaged one) as a store of its own at ``path``, built once: None when a complete one is there already.
    ``documents``: the collection's, where counted (the progress bar's total); ``scheduler`` / ``workers``: its
    shards encoded by Dask (:class:`BuildOptions`)."""
    from aheadrank.store import read_manifest

    if (Path(path) / "manifest.json").is_file() and read_manifest(path).complete:
        return None
    return build_store(
        BuildOptions(
            str(base or ""),
            str(collection),
            str(path),
            device=device,
            progress=progress,
            encoder="dense",
            documents=documents,
            scheduler=scheduler,
            workers=workers,
        )
    )


def require_dense(store: str | Path) -> None:
    """Record in the store's manifest that its dense field is part of it (before the dense phase starts: a
    build killed in it leaves a store that is refused, not served without the dense prior)."""
    from aheadrank.store import read_manifest
    from aheadrank.store.manifest import write_manifest_file

    if not (Path(store) / "manifest.json").is_file():  # a dense field alone (no main store to bind it to)
        return
    manifest = read_manifest(store)
    if manifest.dense is not True:
        write_manifest_file(Path(store), replace(manifest, dense=True))


def build_dense(opts: BuildOptions, reuse: str | Path | None = None) -> BuildSummary | None:
    """The dense prior's field for ``opts.store``, written as the sub-store ``<store>/dense``.

    ``reuse``: an existing complete dense store of the same encoder and documents (e.g. built for another
    ranker over the same collection) is copied instead of encoding the collection again."""
    from aheadrank.store import read_manifest

    target = Path(opts.store) / DENSE_DIR
    require_dense(opts.store)
    if reuse is not None:
        src = read_manifest(reuse)
        main = read_manifest(opts.store)
        encoder = get_ranker(opts.checkpoint, None, opts.device, None, "dense")
        if src.spec.fingerprint != encoder.fingerprint:
            raise StoreError(
                f"--dense-from {reuse} was written by another dense encoder ({src.spec.fingerprint[:12]}, "
                f"this checkpoint's base gives {encoder.fingerprint[:12]})"
            )
        if not src.complete or src.n_docs != main.n_docs:
            raise StoreError(f"--dense-from {reuse} is incomplete or holds other documents than {opts.store}")
        if [s.n_docs for s in src.shards] != [s.n_docs for s in main.shards]:
            raise StoreError(
                f"--dense-from {reuse} was written in shards of {src.spec.shard_size:,} documents, the store "
                f"{opts.store} in shards of {main.spec.shard_size:,}: a store and its dense field share their "
                f"shards, so build the store with --shard-size {src.spec.shard_size} (or drop --dense-from)"
            )
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(reuse, target)
        from aheadrank.store import StoreReader

        with StoreReader(opts.store) as a, StoreReader(target) as b:
            if a.docids() != b.docids():
                shutil.rmtree(target)
                raise StoreError(f"--dense-from {reuse} holds other docids than {opts.store}")
        return None
    from dataclasses import replace

    # the dense field shares the store's shards (its collection fingerprint is the store's: rerank.open_dense_field)
    size = opts.shard_size or existing_shard_size(opts.store)
    return build_store(
        replace(
            opts,
            store=str(target),
            encoder="dense",
            strategy=None,
            dtype="float16",
            compression="none",
            shard_size=size,
        )
    )


# ---- long documents as passages (store/passages.py) ----------------------------------------------------------
def passage_options(ranker, opts: BuildOptions):
    """How ``aheadrank index --passages`` splits a long document: exactly as the service splits an ad-hoc text
    (services/backend.py ``passage_options``): the ranker's window, the overlap (a quarter of the window
    unless given, at most half of it), at most ``--max-chunks-per-doc`` passages."""
    from aheadrank.passages import DEFAULT_MAX_PASSAGES, PassageOptions, effective_overlap

    window = int(ranker._text().max_doc_len)
    return PassageOptions(
        window,
        effective_overlap(window, opts.passage_overlap),
        opts.max_chunks_per_doc or DEFAULT_MAX_PASSAGES,
    )


class PassageCollection:
    """The passages of a collection's documents longer than the ranker's window, as documents of their own
    (docids ``<docid>#p<k>``, store/passages.py), in collection order; shorter documents have none."""

    GROUP = 256  # documents tokenized at once

    def __init__(self, collection, ranker, opts) -> None:
        self.collection = collection
        self.tokenizer = ranker._text().tokenizer
        self.opts = opts
        self.report = _PassageReport(collection)

    def __iter__(self):
        from aheadrank.indexer.collections import Document
        from aheadrank.store.passages import passage_docid

        from aheadrank.passages import split_passages

        self.report.documents = 0
        group: list = []

        def flush():
            for doc, parts in zip(
                group, split_passages(self.tokenizer, [d.text for d in group], self.opts), strict=True
            ):
                if parts != [doc.text]:  # longer than the window: stored as passages too
                    for k, text in enumerate(parts):
                        self.report.documents += 1
                        yield Document(passage_docid(doc.docid, k), text)
            group.clear()

        for doc in self.collection:
            group.append(doc)
            if len(group) == self.GROUP:
                yield from flush()
        yield from flush()


class _PassageReport:
    """A passage collection's report: its entries, and the skipped records of the collection beneath."""

    def __init__(self, collection) -> None:
        self.collection = collection
        self.documents = 0

    @property
    def skipped(self) -> int:
        return self.collection.report.skipped

    def to_dict(self) -> dict[str, Any]:
        return {**self.collection.report.to_dict(), "passages": self.documents}


class WindowCollection:
    """The bi-encoder's sentence windows (store/windows.py) of a collection's documents of more than
    ``sentences`` sentences, as documents of their own (docids ``<docid>#p<k>``), in collection order; a
    document that is one window has none (its window is the whole document: the dense field's row)."""

    def __init__(self, collection, sentences: int) -> None:
        self.collection = collection
        self.sentences = sentences
        self.report = _PassageReport(collection)

    def __iter__(self):
        from aheadrank.indexer.collections import Document
        from aheadrank.indexer.pseudo_queries import stored_windows
        from aheadrank.store.passages import passage_docid

        self.report.documents = 0
        for docid, title, body in self.collection.titled():
            for k, text in enumerate(stored_windows(title, body, self.sentences)):
                self.report.documents += 1
                yield Document(passage_docid(docid, k), text)


def check_window_record(path: Path, record: dict) -> None:
    """A window field is continued only when it was cut as requested, from the same collection."""
    from aheadrank.store import read_manifest

    if (path / "manifest.json").is_file() and read_manifest(path).spec.config.get("windows") != record:
        raise StoreError(
            f"the windows in {path} were cut with {read_manifest(path).spec.config.get('windows')}, not "
            f"{record}: delete it (or pass --overwrite) to rebuild it"
        )


def ensure_window_field(
    collection: str | Path,
    path: str | Path,
    dense_field: str | Path,
    base: str | None,
    sentences: int,
    device: str = "cpu",
    progress: bool = True,
    scheduler: str | None = None,
    workers: int | None = None,
) -> BuildSummary | None:
    """The collection's sentence windows (store/windows.py) embedded by the dense prior's bi-encoder, as a store
    of its own at ``path``, bound to the collection of the complete dense field ``dense_field`` (built from the
    same collection: its fingerprint is the store's); built once: None when a complete one is there already.
    ``scheduler`` / ``workers``: its shards encoded by Dask (:class:`BuildOptions`)."""
    from aheadrank.store import read_manifest
    from aheadrank.store.windows import window_record

    if (Path(path) / "manifest.json").is_file() and read_manifest(path).complete:
        return None
    if not (Path(dense_field) / "manifest.json").is_file() or not read_manifest(dense_field).complete:
        raise StoreError(
            f"the dense field {dense_field} is missing or incomplete: build it before its windows"
        )
    dense = read_manifest(dense_field)
    fingerprint = {k: dense.collection.get(k) for k in ("documents", "sha256")}
    record = {**window_record(sentences), "collection": fingerprint}
    return build_store(
        BuildOptions(
            str(base or ""),
            str(collection),
            str(path),
            device=device,
            progress=progress,
            encoder="windows",
            split_record=record,
            scheduler=scheduler,
            workers=workers,
        )
    )


def build_windows(opts: BuildOptions, source: str | Path) -> None:
    """Copy the complete window field ``source`` (:func:`ensure_window_field`) into ``<store>/windows``, after
    checking that it belongs to the store (the same collection; embedded by the checkpoint's dense encoder). The
    cut is recorded in the store's manifest first: a build killed while copying leaves a store that is refused
    until it is resumed, never one served without its windows."""
    from aheadrank.store import read_manifest
    from aheadrank.store.manifest import write_manifest_file
    from aheadrank.store.windows import binding_problem, window_record

    src = read_manifest(source)
    if not src.complete:
        raise StoreError(f"the window field {source} is incomplete: resume its build first")
    record = window_record(int((src.spec.config.get("windows") or {}).get("sentences", 0)))
    main = replace(read_manifest(opts.store), windows=record)
    encoder = get_ranker(opts.checkpoint, None, opts.device, None, "dense")
    why = binding_problem(main, src, encoder.fingerprint)
    if why:
        raise StoreError(f"the window field {source} does not belong to the store {opts.store}: {why}")
    write_manifest_file(Path(opts.store), main)
    target = Path(opts.store) / WINDOWS_DIR
    if target.exists():
        shutil.rmtree(target)
    tmp = target.with_name(f".{WINDOWS_DIR}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(source, tmp)
    tmp.rename(target)


def index_windows(opts: BuildOptions, sentences: int) -> BuildSummary | None:
    """``aheadrank index --windows``: the store's collection cut into windows of ``sentences`` sentences and
    embedded by the checkpoint's dense encoder (:func:`ensure_window_field`, resumable, in the store's hidden
    ``.window-field``), then moved in as ``<store>/windows`` (:func:`build_windows`). Needs the store's complete
    dense field. None when the store holds these windows already (a finished build run again)."""
    from aheadrank.store import read_manifest
    from aheadrank.store.windows import window_record

    store = Path(opts.store)
    target = store / WINDOWS_DIR
    if (
        read_manifest(store).windows == window_record(sentences)
        and (target / "manifest.json").is_file()
        and read_manifest(target).complete
    ):
        return None
    field = store / ".window-field"
    summary = ensure_window_field(
        opts.collection, field, store / DENSE_DIR, opts.checkpoint, sentences, opts.device, opts.progress
    )
    build_windows(opts, field)
    shutil.rmtree(field)
    return summary


def check_split_record(path: Path, record: dict) -> None:
    """A passage sub-store is continued only when it was split as requested (the store's spec ignores its
    ``config``, where the split is recorded)."""
    from aheadrank.store import read_manifest
    from aheadrank.store.passages import RECORD_KEYS

    if not (path / "manifest.json").is_file():
        return
    old = read_manifest(path).spec.config.get("passages") or {}
    if {k: old.get(k) for k in (*RECORD_KEYS, "collection")} != record:
        raise StoreError(
            f"the passages in {path} were split with {old}, not {record}: pass --overwrite to rebuild the store"
        )


def build_passages(opts: BuildOptions) -> BuildSummary:
    """``aheadrank index --passages``: each document longer than the ranker's window, split as the service
    splits an ad-hoc text, stored as passages in ``<store>/passages`` (store/passages.py). The split is recorded
    in the store's manifest first: a build killed in this phase leaves a store that is refused until resumed."""
    from aheadrank.store import read_manifest
    from aheadrank.store.manifest import write_manifest_file
    from aheadrank.store.passages import passage_record

    ranker = get_ranker(opts.checkpoint, opts.strategy, opts.device, opts.max_doc_len)
    popts = passage_options(ranker, opts)
    record = passage_record(popts.window, popts.window - popts.stride, popts.max_passages)
    main = read_manifest(opts.store)
    if main.passages is not None and main.passages != record:
        raise StoreError(
            f"the store {opts.store} holds passages split with {main.passages}, not {record}: pass --overwrite "
            "to rebuild it"
        )
    if main.passages is None:
        write_manifest_file(Path(opts.store), replace(main, passages=record))
    sub = {**record, "collection": (main.collection or {}).get("sha256")}
    return build_store(
        replace(opts, store=str(Path(opts.store) / PASSAGES_DIR), encoder="passages", split_record=sub)
    )
