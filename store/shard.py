"""One shard file: encoding documents, writing ``shard-NNNNN.h5`` atomically, reading its layout back.

Layout of a shard (HDF5, every dataset contiguous so that a reader can memory-map it):

* root attributes: ``format``, ``format_version``, ``shard_index``, ``n_docs``, ``n_tokens``,
  ``compression``, ``dtype``, ``fingerprint``;
* ``docids``: fixed-length utf-8 strings [n_docs];
* ``offsets``: int64 [n_docs + 1] into the token axis (document i is rows offsets[i]:offsets[i+1]);
* ``fields/<name>``: ``none`` -> [n_tokens, dim] float16 (or int8); ``zstd`` -> uint8 [n_bytes], one
  zstd frame per document, with ``blob_offsets/<name>`` int64 [n_docs + 1] into it;
* ``scales/<name>``: float32 [n_tokens] (int8 stores only; never compressed);
* ``text_sha256`` (optional; root attribute ``text_digest`` names its scheme, store/texts.py): uint8
  [n_docs, 32], the digest of each document's normalised text, which the reader looks texts up by;
* codebook dtypes (``book4``, ``book2``; never compressed): ``fields/<name>`` uint8 [n_tokens, dim·bits/8], the
  packed codes (``store.quant.pack_codes``), and ``books/<name>`` float32 [dim, 2^bits], the shard's codebooks
  (Lloyd-Max on up to ``BOOK_SAMPLE_TOKENS`` of its tokens, evenly spaced), ascending per dimension.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from aheadrank.store._io import commit_file
from aheadrank.store.manifest import ShardInfo, shard_file_name
from aheadrank.store.quant import (
    all_finite_float16,
    cast,
    encode_codebooks,
    fit_codebooks,
    pack_codes,
    quantize_int8,
    sample_rows,
)
from aheadrank.store.spec import FORMAT, FORMAT_VERSION, ZSTD_LEVEL, StoreSpec
from aheadrank.store.texts import DATASET as TEXT_DATASET
from aheadrank.store.texts import DIGEST_BYTES, TEXT_DIGEST, text_digests

from aheadrank.errors import StoreError
from aheadrank.fsfaults import sha256_file, temp_name

SHARD_FORMAT = f"{FORMAT}-shard"
_WRITE_BLOCK_BYTES = 64 << 20
ALIGNMENT = 4096


def validate_docid(docid: Any) -> bytes:
    """A docid as stored: non-empty utf-8 without NUL characters."""
    if not isinstance(docid, str) or not docid:
        raise StoreError(f"docid must be a non-empty string, got {docid!r}")
    if "\x00" in docid:
        raise StoreError(f"docid {docid!r} contains a NUL character")
    return docid.encode("utf-8")


def _as_numpy(value: Any, docid: str, name: str) -> np.ndarray:
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor, without importing torch
        value = value.detach().cpu()
        if not value.dtype.is_floating_point:
            raise StoreError(f"document {docid!r}, field {name!r}: expected floats, got {value.dtype}")
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        value = value.numpy()
    array = np.asarray(value)
    if array.dtype.kind != "f":
        raise StoreError(f"document {docid!r}, field {name!r}: expected floats, got {array.dtype}")
    return array


@dataclass
class ShardBuffer:
    """Documents of one shard, already encoded (float16, or int8 + scale, zstd-compressed if asked; codebook dtypes
    keep float16 until :meth:`write`, which fits the shard's codebooks and encodes)."""

    spec: StoreSpec
    docids: list[str] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    data: dict[str, list[Any]] = field(default_factory=dict)
    scales: dict[str, list[np.ndarray]] = field(default_factory=dict)
    digests: list[bytes] = field(default_factory=list)  # text digests (store/texts.py): all or none
    _seen: set[str] = field(default_factory=set)
    _compressor: Any = None

    def __post_init__(self) -> None:
        self.data = {name: [] for name in self.spec.fields}
        self.scales = {name: [] for name in self.spec.fields} if self.spec.dtype == "int8" else {}
        if self.spec.compression == "zstd":
            import zstandard

            self._compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)

    def __len__(self) -> int:
        return len(self.docids)

    def add(self, docid: str, fields: Mapping[str, Any], text_digest: bytes | None = None) -> None:
        """Buffer one document; ``text_digest`` (``store.texts.text_digest`` of its text) is given for every
        document of a shard or for none."""
        validate_docid(docid)
        if docid in self._seen:
            raise StoreError(f"duplicate docid {docid!r}")
        if (text_digest is not None) != bool(self.digests) and self.docids:
            raise StoreError(f"document {docid!r}: a shard has a text digest for every document or for none")
        if text_digest is not None and (type(text_digest) is not bytes or len(text_digest) != DIGEST_BYTES):
            raise StoreError(f"document {docid!r}: a text digest is {DIGEST_BYTES} bytes: {text_digest!r}")
        encoded = self._encode(docid, fields)
        for name, (values, scale) in encoded.items():
            self.data[name].append(
                self._compressor.compress(values.tobytes()) if self._compressor else values
            )
            if scale is not None:
                self.scales[name].append(scale)
        self._seen.add(docid)
        if text_digest is not None:
            self.digests.append(text_digest)
        self.docids.append(docid)
        self.lengths.append(next(iter(encoded.values()))[0].shape[0])

    def _encode(
        self, docid: str, fields: Mapping[str, Any]
    ) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
        spec = self.spec
        if not isinstance(fields, Mapping):
            raise StoreError(f"document {docid!r}: fields must be a dict of name -> [doc_len, dim] array")
        if set(fields) != set(spec.fields):
            missing, extra = sorted(set(spec.fields) - set(fields)), sorted(set(fields) - set(spec.fields))
            raise StoreError(f"document {docid!r}: wrong fields (missing {missing}, unexpected {extra})")
        encoded: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        doc_len = None
        for name, dim in spec.fields.items():
            array = _as_numpy(fields[name], docid, name)
            if array.ndim != 2 or array.shape[1] != dim:
                raise StoreError(
                    f"document {docid!r}, field {name!r}: shape {array.shape}, expected [doc_len, {dim}]"
                )
            if doc_len is None:
                doc_len = array.shape[0]
                if not 1 <= doc_len <= spec.max_doc_len:
                    raise StoreError(
                        f"document {docid!r}: {doc_len} tokens, expected 1..max_doc_len={spec.max_doc_len}"
                    )
            elif array.shape[0] != doc_len:
                raise StoreError(
                    f"document {docid!r}: fields have different lengths ({doc_len} vs {array.shape[0]})"
                )
            if spec.dtype == "int8":
                values = cast(array, np.float32)
                if not np.isfinite(values).all():
                    raise StoreError(f"document {docid!r}, field {name!r}: contains NaN or inf")
                encoded[name] = quantize_int8(values)
            else:
                values = cast(array, np.float16)
                if not all_finite_float16(values):
                    raise StoreError(f"document {docid!r}, field {name!r}: NaN, inf or beyond float16 range")
                encoded[name] = (values, None)
        return encoded

    def write(self, directory: Path, index: int) -> ShardInfo:
        """Write ``shard-<index>.h5`` atomically (temp file, flush, fsync, rename, fsync dir)."""
        if not self.docids:
            raise StoreError("refusing to write an empty shard")
        final = directory / shard_file_name(index)
        tmp = temp_name(final)
        try:
            self._write_h5(tmp, index)
            size = os.path.getsize(tmp)
            digest = sha256_file(tmp)
            commit_file(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        scheme = TEXT_DIGEST if self.digests else ""
        return ShardInfo(
            final.name, index, len(self.docids), int(sum(self.lengths)), size, digest, text_digest=scheme
        )

    def _write_h5(self, file: Path, index: int) -> None:
        import h5py

        spec = self.spec
        offsets = np.zeros(len(self.lengths) + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=offsets[1:])
        ids = np.array([d.encode("utf-8") for d in self.docids], dtype=np.bytes_)
        # datasets page-aligned in the file, so that a reader can map every shard into one array
        with h5py.File(file, "w", alignment_threshold=1, alignment_interval=ALIGNMENT) as h5:
            h5.attrs.update(
                {
                    "format": SHARD_FORMAT,
                    "format_version": FORMAT_VERSION,
                    "shard_index": index,
                    "n_docs": len(self.docids),
                    "n_tokens": int(offsets[-1]),
                    "compression": spec.compression,
                    "dtype": spec.dtype,
                    "fingerprint": spec.fingerprint,
                }
            )
            string_type = h5py.string_dtype("utf-8", ids.dtype.itemsize)
            h5.create_dataset("docids", data=ids.astype(string_type), track_times=False)
            h5.create_dataset("offsets", data=offsets, track_times=False)
            if self.digests:
                h5.attrs["text_digest"] = TEXT_DIGEST
                table = np.frombuffer(b"".join(self.digests), dtype=np.uint8).reshape(-1, DIGEST_BYTES)
                h5.create_dataset(TEXT_DATASET, data=table, track_times=False)
            for name in spec.fields:
                parts = self.data[name]
                if spec.compression == "zstd":
                    blob_offsets = np.zeros(len(parts) + 1, dtype=np.int64)
                    np.cumsum([len(p) for p in parts], out=blob_offsets[1:])
                    blob = np.frombuffer(b"".join(parts), dtype=np.uint8)
                    h5.create_dataset(f"fields/{name}", data=blob, track_times=False)
                    h5.create_dataset(f"blob_offsets/{name}", data=blob_offsets, track_times=False)
                else:
                    if spec.book_bits is not None:
                        books = fit_codebooks(sample_rows(parts), spec.book_bits)
                        h5.create_dataset(f"books/{name}", data=books, track_times=False)
                        parts = [pack_codes(encode_codebooks(p, books), spec.book_bits) for p in parts]
                    dset = h5.create_dataset(
                        f"fields/{name}",
                        shape=(int(offsets[-1]), spec.stored_width(name)),
                        dtype=parts[0].dtype,
                        track_times=False,
                    )
                    _write_blocks(dset, parts)
                if spec.dtype == "int8":
                    h5.create_dataset(
                        f"scales/{name}", data=np.concatenate(self.scales[name]), track_times=False
                    )
            h5.flush()


def _write_blocks(dset: Any, parts: list[np.ndarray]) -> None:
    """Write ``parts`` (row blocks) into ``dset`` in ~64 MB slabs: no full-shard concatenated copy."""
    row = 0
    start = 0
    while start < len(parts):
        stop, size = start, 0
        while stop < len(parts) and (size == 0 or size + parts[stop].nbytes <= _WRITE_BLOCK_BYTES):
            size += parts[stop].nbytes
            stop += 1
        block = parts[start] if stop == start + 1 else np.concatenate(parts[start:stop])
        dset[row : row + len(block)] = block
        row += len(block)
        start = stop


def write_shard(
    path: str | Path,
    shard_index: int,
    spec: StoreSpec,
    docids: Sequence[str],
    field_dicts: Sequence[Mapping[str, Any]],
    texts: Sequence[str] | None = None,
) -> ShardInfo:
    """Write one complete shard (for distributed builds: one task per shard, then :func:`write_manifest`).

    Shard ``shard_index`` must hold documents [shard_index*shard_size, (shard_index+1)*shard_size) of the
    collection: ``spec.shard_size`` documents, fewer only for the last shard. ``texts`` (the documents' texts,
    as the ranker read them) adds their text digests (``text_sha256``, store/texts.py).
    """
    if len(docids) != len(field_dicts):
        raise StoreError(f"{len(docids)} docids but {len(field_dicts)} field dicts")
    if not 1 <= len(docids) <= spec.shard_size:
        raise StoreError(f"a shard holds 1..shard_size={spec.shard_size} documents, got {len(docids)}")
    if isinstance(shard_index, bool) or not isinstance(shard_index, int) or shard_index < 0:
        raise StoreError(f"shard_index must be a non-negative int, got {shard_index!r}")
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    if texts is not None and len(texts) != len(docids):
        raise StoreError(f"{len(docids)} docids but {len(texts)} texts")
    digests = text_digests(texts) if texts is not None else None
    buffer = ShardBuffer(spec)
    for i, (docid, fields) in enumerate(zip(docids, field_dicts, strict=True)):
        buffer.add(docid, fields, None if digests is None else digests[i].tobytes())
    return buffer.write(directory, shard_index)


@dataclass(frozen=True)
class DatasetLoc:
    """Where a contiguous dataset's raw bytes lie in its file."""

    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass
class ShardMeta:
    """A shard's layout, read (and checked) once with h5py; the data itself is then memory-mapped."""

    file: Path
    index: int
    n_docs: int
    n_tokens: int
    docids: np.ndarray  # bytes_ [n_docs]
    offsets: np.ndarray  # int64 [n_docs + 1]
    fields: dict[str, DatasetLoc]
    scales: dict[str, DatasetLoc]
    blob_offsets: dict[str, np.ndarray]
    books: dict[str, np.ndarray] = field(default_factory=dict)  # codebook dtypes: float32 [dim, 2^bits]
    text_digest: str = ""  # the scheme of ``text_digests`` ("" when the shard has none)
    text_digests: np.ndarray | None = None  # uint8 [n_docs, 32] (store/texts.py)


def _locate(dset: Any, file: Path, file_size: int) -> DatasetLoc:
    offset = dset.id.get_offset()
    nbytes = int(np.prod(dset.shape, dtype=np.int64)) * dset.dtype.itemsize
    if dset.chunks is not None or offset is None:
        if nbytes == 0:
            return DatasetLoc(0, tuple(dset.shape), dset.dtype)
        raise StoreError(f"{file.name}: dataset {dset.name} is not contiguous; cannot memory-map it")
    if offset + nbytes > file_size:
        raise StoreError(f"{file.name}: dataset {dset.name} runs past the end of the file (truncated shard?)")
    return DatasetLoc(int(offset), tuple(dset.shape), dset.dtype.newbyteorder("<"))


def read_shard_meta(file: Path, spec: StoreSpec, expected_index: int | None = None) -> ShardMeta:
    """Open a shard with h5py, check it against ``spec``, return its layout (docids and offsets loaded)."""
    import h5py

    try:
        file_size = os.path.getsize(file)
        with h5py.File(file, "r") as h5:
            attrs = dict(h5.attrs)
            if attrs.get("format") != SHARD_FORMAT:
                raise StoreError(f"{file.name}: not an aheadrank store shard")
            if int(attrs.get("format_version", 0)) > FORMAT_VERSION:
                raise StoreError(
                    f"{file.name}: shard format version {attrs['format_version']} is from the future"
                )
            for key in ("compression", "dtype", "fingerprint"):
                value = attrs.get(key)
                value = value.decode() if isinstance(value, bytes) else str(value)
                if value != getattr(spec, key):
                    raise StoreError(
                        f"{file.name}: {key} {value!r} differs from the manifest's {getattr(spec, key)!r}"
                    )
            index = int(attrs["shard_index"])
            if expected_index is not None and index != expected_index:
                raise StoreError(f"{file.name}: holds shard index {index}, expected {expected_index}")
            n_docs, n_tokens = int(attrs["n_docs"]), int(attrs["n_tokens"])
            docids = np.asarray(h5["docids"][()], dtype=np.bytes_)
            offsets = np.asarray(h5["offsets"][()], dtype=np.int64)
            scheme, digests = _read_digests(h5, n_docs, file)
            stored = set(h5["fields"].keys())
            if stored != set(spec.fields):
                raise StoreError(
                    f"{file.name}: fields {sorted(stored)} differ from the manifest's {sorted(spec.fields)}"
                )
            fields, scales, blob_offsets, books = {}, {}, {}, {}
            for name, dim in spec.fields.items():
                fields[name] = _locate(h5[f"fields/{name}"], file, file_size)
                if spec.book_bits is not None:
                    books[name] = _read_books(h5, name, dim, spec.book_bits, file)
                if spec.dtype == "int8":
                    scales[name] = _locate(h5[f"scales/{name}"], file, file_size)
                    if scales[name].shape != (n_tokens,):
                        raise StoreError(f"{file.name}: scales/{name} has shape {scales[name].shape}")
                if spec.compression == "zstd":
                    blob_offsets[name] = np.asarray(h5[f"blob_offsets/{name}"][()], dtype=np.int64)
                    _check_offsets(
                        blob_offsets[name], n_docs, fields[name].shape[0], file, f"blob_offsets/{name}"
                    )
                elif fields[name].shape != (n_tokens, spec.stored_width(name)):
                    raise StoreError(
                        f"{file.name}: fields/{name} has shape {fields[name].shape}, expected "
                        f"{(n_tokens, spec.stored_width(name))}"
                    )
    except StoreError:
        raise
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise StoreError(f"{file.name}: unreadable shard ({exc})") from exc
    if docids.shape != (n_docs,):
        raise StoreError(f"{file.name}: {docids.shape[0]} docids, expected {n_docs}")
    _check_offsets(offsets, n_docs, n_tokens, file, "offsets")
    lengths = np.diff(offsets)
    if n_docs and (lengths.min() < 1 or lengths.max() > spec.max_doc_len):
        raise StoreError(f"{file.name}: document lengths outside 1..{spec.max_doc_len}")
    return ShardMeta(
        file, index, n_docs, n_tokens, docids, offsets, fields, scales, blob_offsets, books, scheme, digests
    )


def _read_digests(h5: Any, n_docs: int, file: Path) -> tuple[str, np.ndarray | None]:
    """A shard's text digest scheme and ``text_sha256`` (uint8 [n_docs, 32]), checked; ("", None) without."""
    scheme = h5.attrs.get("text_digest", "")
    scheme = scheme.decode() if isinstance(scheme, bytes) else str(scheme)
    if TEXT_DATASET not in h5:
        if scheme:
            raise StoreError(f"{file.name}: text_digest {scheme!r} but no {TEXT_DATASET} dataset")
        return "", None
    digests = np.asarray(h5[TEXT_DATASET][()])
    if not scheme or digests.dtype != np.uint8 or digests.shape != (n_docs, DIGEST_BYTES):
        raise StoreError(
            f"{file.name}: {TEXT_DATASET} is {digests.dtype} {digests.shape} (scheme {scheme!r}), expected "
            f"uint8 {(n_docs, DIGEST_BYTES)} with a text_digest scheme"
        )
    return scheme, digests


def _read_books(h5: Any, name: str, dim: int, bits: int, file: Path) -> np.ndarray:
    """A codebook dtype's ``books/<name>``, checked: float32 [dim, 2^bits], finite, ascending per dimension."""
    if f"books/{name}" not in h5:
        raise StoreError(f"{file.name}: no books/{name} (a codebook store's shard without its codebooks)")
    books = np.asarray(h5[f"books/{name}"][()])
    if books.shape != (dim, 2**bits) or books.dtype != np.float32:
        raise StoreError(
            f"{file.name}: books/{name} is {books.dtype} {books.shape}, expected float32 {(dim, 2**bits)}"
        )
    if not np.isfinite(books).all() or np.any(np.diff(books, axis=1) < 0):
        raise StoreError(f"{file.name}: books/{name} is corrupt (not finite, or not ascending)")
    return books


def _check_offsets(offsets: np.ndarray, n_docs: int, total: int, file: Path, what: str) -> None:
    if (
        offsets.shape != (n_docs + 1,)
        or offsets[0] != 0
        or offsets[-1] != total
        or np.any(np.diff(offsets) < 0)
    ):
        raise StoreError(f"{file.name}: corrupt {what}")
