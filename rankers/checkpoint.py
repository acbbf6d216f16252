"""Checkpoints: a directory with ``config.json``, ``model.safetensors``, the tokenizer files and
``fingerprint.json``. Written into a temporary sibling and renamed, so a checkpoint directory is either
complete or absent; loading verifies the fingerprint.

``fingerprint.json`` records ``sha256`` (config + weights: the model fingerprint a store is bound to) and
``tokenizer_sha256`` (every tokenizer file, :data:`TOKENIZER_FINGERPRINT_FILES`): a vocabulary with two ids
swapped changes every score with the same weights, so loading refuses a tokenizer that is not the recorded
one. The model fingerprint does not cover the tokenizer, so every store built before stays valid; a
checkpoint written before ``tokenizer_sha256`` existed loads with a warning until
``aheadrank fingerprint-tokenizer CKPT`` records it. ``priors.json`` is covered by ``priors_sha256``,
written in two steps so that a kill at any point leaves a checkpoint that loads (:func:`write_priors`)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
from aheadrank.rankers.base import Ranker
from aheadrank.rankers.base_model import TOKENIZER_FILES, base_config, load_base, resolve_base
from aheadrank.rankers.config import RankerConfig, check_options, resolve_options
from aheadrank.rankers.registry import RANKERS
from aheadrank.rankers.text import TextEncoder
from safetensors.torch import load_model, save_model

from aheadrank.errors import CheckpointError
from aheadrank.fsfaults import atomic_write_text, describe, sha256_file

REQUIRED = ("config.json", "model.safetensors", "fingerprint.json", "tokenizer_config.json")
PRIORS_FILE = "priors.json"  # optional: the fitted score combination (aheadrank/priors.py), opaque here
# every file the tokenizer reads from a checkpoint (AutoTokenizer: tokenizer.json first, else vocab.txt)
TOKENIZER_FINGERPRINT_FILES = (*TOKENIZER_FILES, "added_tokens.json")
log = logging.getLogger("aheadrank.rankers")


def fingerprint_record(path: str | os.PathLike) -> dict:
    """A checkpoint's ``fingerprint.json`` as a dict; a CheckpointError naming the checkpoint where it is missing,
    not JSON or not an object."""
    fp = Path(path) / "fingerprint.json"
    if not fp.is_file():
        raise CheckpointError(f"{path} is not a checkpoint: fingerprint.json is missing")
    try:
        record = json.loads(fp.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(
            f"checkpoint {path}: fingerprint.json cannot be read ({exc}): restore it"
        ) from exc
    if not isinstance(record, dict) or not isinstance(record.get("sha256"), str):
        raise CheckpointError(f"checkpoint {path}: fingerprint.json is not a fingerprint record: restore it")
    return record


def _write_record(path: Path, record: dict) -> None:
    """``fingerprint.json`` replaced atomically; a CheckpointError where the checkpoint cannot be written."""
    try:
        atomic_write_text(path / "fingerprint.json", json.dumps(record, indent=2))
    except OSError as exc:
        raise CheckpointError(f"cannot write the checkpoint {path}: {describe(exc)}") from exc


def write_priors(path: str | os.PathLike, priors: dict) -> str:
    """Write ``priors.json`` into a checkpoint and record its sha256 in ``fingerprint.json``.

    The model fingerprint (``sha256``: config + weights, what a store is bound to) does not change, so
    refitting the priors keeps every store of the checkpoint valid; ``priors_sha256`` makes a modified
    ``priors.json`` fail the load like modified weights do. Three atomic renames, each leaving a checkpoint
    that loads with one consistent ``priors.json``: (1) the new digest is recorded as pending beside the
    old one, (2) ``priors.json`` is replaced, (3) the new digest becomes the only one. Returns it."""
    path = Path(path)
    record = fingerprint_record(path)
    text = json.dumps(priors, indent=2, sort_keys=True) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()
    _write_record(path, {**record, "priors_pending_sha256": digest})
    try:
        atomic_write_text(path / PRIORS_FILE, text)
    except OSError as exc:
        raise CheckpointError(f"cannot write the checkpoint {path}: {describe(exc)}") from exc
    record.pop("priors_pending_sha256", None)
    _write_record(path, {**record, "priors_sha256": digest})
    return digest


def read_priors_json(path: str | os.PathLike, verify: bool = True) -> dict | None:
    """The checkpoint's ``priors.json`` (verified against ``fingerprint.json``), or None without one."""
    path = Path(path)
    file = path / PRIORS_FILE
    record = fingerprint_record(path)
    expected = record.get("priors_sha256")
    pending = record.get("priors_pending_sha256")  # write_priors stopped between its steps
    if not file.is_file():
        if expected and not pending:
            raise CheckpointError(
                f"checkpoint {path}: priors.json is recorded in fingerprint.json but missing"
            )
        return None
    if verify and sha256_file(file) not in {d for d in (expected, pending) if d}:
        raise CheckpointError(
            f"checkpoint {path}: priors.json is corrupt, was modified, or is not recorded in fingerprint.json "
            "(refit it with `aheadrank fit-priors`)"
        )
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"checkpoint {path}: priors.json is not valid JSON ({exc})") from exc


def tokenizer_fingerprint(path: str | os.PathLike) -> tuple[str, list[str]]:
    """(sha256 over every tokenizer file present, by name and content; their names)."""
    h = hashlib.sha256()
    names = [n for n in TOKENIZER_FINGERPRINT_FILES if (Path(path) / n).is_file()]
    for name in names:
        h.update(f"{name}\0{sha256_file(Path(path) / name)}\0".encode())
    return h.hexdigest(), names


def check_tokenizer(path: str | os.PathLike) -> str | None:
    """Refuse a checkpoint whose tokenizer files are not the recorded ones (CheckpointError); a warning
    (returned, and logged) for a checkpoint written before they were recorded."""
    path = Path(path)
    record = fingerprint_record(path)
    expected = record.get("tokenizer_sha256")
    if expected is None:
        notice = (
            f"checkpoint {path.name}: its tokenizer files are not fingerprinted (written before aheadrank "
            "recorded them), so a changed vocabulary would go unnoticed; record them with "
            f"`aheadrank fingerprint-tokenizer {path}` (stores built by it stay valid)"
        )
        log.warning(notice)
        return notice
    actual, names = tokenizer_fingerprint(path)
    if actual != expected:
        raise CheckpointError(
            f"checkpoint {path}: its tokenizer files ({', '.join(names)}) are not the ones recorded in "
            f"fingerprint.json (were {', '.join(record.get('tokenizer_files', []))}): a changed vocabulary "
            "changes every score. Restore the checkpoint's own tokenizer files"
        )
    return None


def record_tokenizer(path: str | os.PathLike, replace: bool = False) -> str:
    """Record the tokenizer files' fingerprint in a checkpoint written before it existed. One already
    recorded and different is refused unless ``replace`` (then stores built with the old tokenizer no longer
    match what the checkpoint reads: rebuild them). Returns the fingerprint."""
    path = Path(path)
    record = fingerprint_record(path)
    digest, names = tokenizer_fingerprint(path)
    if not {"tokenizer.json", "vocab.txt"} & set(names):  # the vocabulary itself: what a tokenizer loads from
        raise CheckpointError(
            f"checkpoint {path}: no tokenizer.json or vocab.txt, so there is no vocabulary to record; restore them"
        )
    old = record.get("tokenizer_sha256")
    if old is not None and old != digest and not replace:
        raise CheckpointError(
            f"checkpoint {path}: its tokenizer files differ from the recorded ones; restore them, or pass "
            "--replace to record these (and rebuild every store built by this checkpoint)"
        )
    _write_record(path, {**record, "tokenizer_sha256": digest, "tokenizer_files": names})
    return digest


def compute_fingerprint(path: str | os.PathLike) -> str:
    """sha256 over config.json then model.safetensors, hex."""
    h = hashlib.sha256()
    for name in ("config.json", "model.safetensors"):
        with open(Path(path) / name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def read_fingerprint(path: str | os.PathLike) -> str:
    """The recorded fingerprint of a checkpoint (not recomputed)."""
    return fingerprint_record(path)["sha256"]


def build_ranker(
    config: RankerConfig, tokenizer_dir: str | os.PathLike | None, strategy: str | None = None
) -> Ranker:
    text = (
        TextEncoder(tokenizer_dir, config.max_query_len, config.max_doc_len)
        if tokenizer_dir is not None
        else None
    )
    return RANKERS[config.kind](config, text, strategy)


def new_config(kind: str, base: str | os.PathLike | None, bert_cfg: dict, **options) -> RankerConfig:
    """The config of a new ranker of ``kind`` on the base model whose shape config is ``bert_cfg``."""
    if kind not in RANKERS:
        raise CheckpointError(f"unknown ranker kind {kind!r}; expected one of {', '.join(RANKERS)}")
    check_options(kind, options)
    opts = resolve_options(kind, options, bert_cfg)
    return RankerConfig.create(kind, bert_cfg, base=str(resolve_base(base)), **opts).validate()


def new_field_dims(
    kind: str, base: str | os.PathLike | None = None, strategy: str | None = None, **options
) -> dict:
    """The stored fields (name -> dim) of a new ranker of ``kind``: what a store of it keeps a word piece, from
    the base's config alone (no weights are read)."""
    return config_field_dims(new_config(kind, base, base_config(base), **options), strategy)


def config_field_dims(config: RankerConfig, strategy: str | None = None) -> dict:
    """The stored fields (name -> dim) of a ranker of ``config`` (``strategy``: MORES's S1 or S2), from the config
    alone (no weights are read): what a store of it keeps a word piece."""
    return build_ranker(config, None, strategy).field_dims()


def init_ranker(kind: str, base: str | os.PathLike | None = None, seed: int = 0, **options) -> Ranker:
    """A new ranker of ``kind`` with BERT-weight-assisted initialisation from the base model."""
    base_dir = resolve_base(base)
    config = new_config(
        kind, base_dir, base_config(base_dir), **options
    )  # bad options fail before the weights load
    _, sd = load_base(base_dir)
    torch.manual_seed(seed)
    ranker = build_ranker(config, base_dir)
    ranker.init_from_base(sd)
    ranker.canonicalize()
    return ranker.eval()


OPTIONAL_WEIGHTS = ("stored_basis",)


def check_replaceable(out: Path, overwrite: bool) -> None:
    """Refuse to write a checkpoint over ``out`` unless it is free, or ``overwrite`` and it holds a checkpoint (a
    ``config.json`` beside ``model.safetensors`` or ``fingerprint.json``) or nothing: never delete a file or a folder
    of other files."""
    if not out.exists() and not out.is_symlink():
        return
    if not overwrite:
        raise CheckpointError(f"{out} already exists (pass --overwrite to replace it)")
    if not out.is_dir():
        raise CheckpointError(f"--overwrite refused: {out} is a file, not a checkpoint directory")
    names = {p.name for p in out.iterdir()}
    if names and not ("config.json" in names and names & {"model.safetensors", "fingerprint.json"}):
        raise CheckpointError(
            f"--overwrite refused: {out} holds files that are not a checkpoint's ({sorted(names)[:3]})"
        )


def save_checkpoint(
    ranker: Ranker, out: str | os.PathLike, overwrite: bool = False, extra: dict | None = None
) -> str:
    """Write the checkpoint directory atomically; returns its fingerprint. A ranker that is not canonical
    (:meth:`Ranker.canonicalize`: PreTTR's stored basis after training moved its decompressor) is written in its
    canonical form, from a copy: the same scores, and the model in memory stays as it is."""
    out = Path(out)
    check_replaceable(out, overwrite)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as exc:
        raise CheckpointError(f"cannot write the checkpoint {out}: {describe(exc)}") from exc
    try:
        config = ranker.config
        if extra:
            config.extra = {**config.extra, **extra}
        ranker = ranker.canonical_copy() or ranker  # after extra: the copy carries it
        (tmp / "config.json").write_text(ranker.config.to_json())
        state = {k: v for k, v in ranker.state_dict().items()}
        cpu_model = ranker if all(v.device.type == "cpu" for v in state.values()) else None
        if cpu_model is None:
            import copy

            cpu_model = copy.deepcopy(ranker).cpu()
        save_model(cpu_model, str(tmp / "model.safetensors"))
        src = ranker._text().path
        copied = [n for n in TOKENIZER_FILES if (src / n).is_file() and shutil.copyfile(src / n, tmp / n)]
        if "vocab.txt" not in copied:
            ranker._text().tokenizer.save_pretrained(str(tmp))
        fp = compute_fingerprint(tmp)
        tokenizer, names = tokenizer_fingerprint(tmp)
        record = {"sha256": fp, "over": ["config.json", "model.safetensors"], "kind": config.kind}
        record.update(tokenizer_sha256=tokenizer, tokenizer_files=names)
        (tmp / "fingerprint.json").write_text(json.dumps(record, indent=2))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return fp


def load_config(path: str | os.PathLike) -> RankerConfig:
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist or is not a directory")
    missing = [n for n in REQUIRED if not (path / n).is_file()]
    if missing:
        raise CheckpointError(f"checkpoint {path} is incomplete: missing {', '.join(missing)}")
    try:
        data = json.loads((path / "config.json").read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"checkpoint {path}: config.json is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"checkpoint {path}: config.json is not a ranker config (a JSON object)")
    try:
        return RankerConfig.from_dict(data)
    except CheckpointError as exc:  # which checkpoint, where the config alone cannot say
        raise CheckpointError(f"checkpoint {path}: {exc}") from exc


def load_ranker(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    strategy: str | None = None,
    verify: bool = True,
) -> Ranker:
    """Load a checkpoint directory (fingerprint verified) onto ``device`` in eval mode."""
    path = Path(path)
    config = load_config(path)
    recorded = read_fingerprint(path)
    if verify:
        actual = compute_fingerprint(path)
        if actual != recorded:
            raise CheckpointError(
                f"checkpoint {path} is corrupt or was modified: fingerprint {actual[:12]} != recorded {recorded[:12]}"
            )
    notice = check_tokenizer(path) if verify else None
    ranker = build_ranker(config, path, strategy)
    try:
        missing, unexpected = load_model(ranker, str(path / "model.safetensors"), strict=False)
    except Exception as exc:  # safetensors raises various errors for shape mismatches
        raise CheckpointError(f"checkpoint {path}: weights do not match its config.json ({exc})") from exc
    # weights a checkpoint of an earlier version lacks and whose default keeps its meaning (PreTTR's stored
    # basis: the identity, r as it was stored then)
    missing = [k for k in missing if k not in OPTIONAL_WEIGHTS]
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {path}: weights do not match a {config.kind} ranker "
            f"(missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]})"
        )
    ranker.fingerprint = recorded
    ranker.fingerprint_notice = notice  # an unfingerprinted tokenizer: the service lists it in its warnings
    ranker.priors = read_priors_json(path, verify=verify)
    return ranker.to(device).eval()
