"""A new ranker is one module plus one registration: a toy ranker defined here, registered with
``rankers.registry.register``, gets its CLI flags (``--ranker toy``, ``--width``), its variants, its options'
rule and its checkpoints from its spec alone — no other file knows it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from aheadrank.rankers.base import QueryState, Ranker, masked_mean
from aheadrank.rankers.spec import RankerSpec, Variant, option
from torch import Tensor, nn

from aheadrank.errors import CheckpointError

HERE = Path(__file__).resolve().parent


class ToyRanker(Ranker):
    """Score = scale · <mean query vector, mean document vector>, vectors = a projection of the base's word
    embeddings: the smallest split ranker (the document side is stored, the query side computed online)."""

    kind = "toy"
    fresh_modules = ("proj",)

    def __init__(self, config, text=None, strategy=None):
        super().__init__(config, text, strategy)
        self.emb = nn.Embedding(int(config.bert["vocab_size"]), config.hidden)
        self.proj = nn.Linear(config.hidden, config.width)

    def field_dims(self) -> dict[str, int]:
        return {"vec": self.config.width}

    def doc_ids(self, pieces: list[int]) -> list[int]:
        return [*pieces, self._text().sep]

    def vectors(self, ids: Tensor) -> Tensor:
        return self.proj(self.emb(ids))

    def document_fields(self, ids: Tensor, mask: Tensor) -> dict[str, Tensor]:
        return {"vec": self.vectors(ids)}

    def query_state(self, ids: Tensor, mask: Tensor) -> QueryState:
        return QueryState({"vec": self.vectors(ids)}, mask)

    def score_batch(self, qs: QueryState, fields: dict[str, Tensor], mask: Tensor) -> Tensor:
        q = masked_mean(qs["vec"], qs.mask)
        return self.config.scale * (masked_mean(fields["vec"].float(), mask) @ q[0])

    def forward_pairs(self, q_ids: Tensor, q_mask: Tensor, d_ids: Tensor, d_mask: Tensor) -> Tensor:
        q, d = masked_mean(self.vectors(q_ids), q_mask), masked_mean(self.vectors(d_ids), d_mask)
        return self.config.scale * (q * d).sum(-1)

    def init_from_base(self, sd: dict[str, Tensor]) -> None:
        self.emb.weight.data.copy_(sd["embeddings.word_embeddings.weight"])


@dataclass
class ToyOptions:
    width: int = option(16, "dims of the projected word vectors")
    scale: float = option(1.0, "the score's scale")


def parse_toy(name: str) -> Variant | None:
    """``toy`` or ``toy-w<width>``."""
    if name == "toy":
        return Variant(name, name, "toy")
    if name.startswith("toy-w") and name[5:].isdigit():
        return Variant(name, name, "toy", {"width": int(name[5:])})
    return None


SPEC = RankerSpec(
    "toy", ToyRanker, ToyOptions, variants=("toy", "toy-w8"), parse=parse_toy, grammar="toy[-w<n>]"
)


@pytest.fixture
def toy():
    from aheadrank.rankers.registry import register, unregister

    register(SPEC)
    yield SPEC
    unregister("toy")


def test_a_registered_ranker_gets_variants_options_and_checkpoints(toy, tiny_base, tmp_path):
    from aheadrank.rankers import init_ranker, load_ranker, save_checkpoint
    from aheadrank.rankers.config import default_options, foreign_options
    from aheadrank.rankers.variants import CATALOGUE, DEFAULTS, match_variants, parse_variant

    assert parse_variant("toy-w8") == Variant("toy-w8", "toy-w8", "toy", {"width": 8})
    assert CATALOGUE[-2:] == ("toy", "toy-w8") and DEFAULTS["toy"] == "toy"
    assert match_variants(["toy*"]) == ["toy", "toy-w8"]
    assert default_options("toy") == {"width": 16, "scale": 1.0}
    assert foreign_options("mores", {"width": 8}) == ["width"] and foreign_options("toy", {"ibs": 2}) == [
        "ibs"
    ]
    with pytest.raises(CheckpointError, match="width does not apply to a mores ranker"):
        init_ranker("mores", base=tiny_base, width=8)

    ranker = parse_variant("toy-w8").init(base=tiny_base, scale=2.0)
    assert (ranker.config.width, ranker.config.scale) == (8, 2.0)
    save_checkpoint(ranker, tmp_path / "toy")
    config = json.loads((tmp_path / "toy" / "config.json").read_text())
    assert config["kind"] == "toy" and config["options"] == {"width": 8, "scale": 2.0}
    loaded = load_ranker(tmp_path / "toy")
    assert isinstance(loaded, ToyRanker) and loaded.config.width == 8
    docs = ["a first document about cells", "another one, about proteins and cells"]
    pairs = loaded.score_pairs("cells", docs)
    stored = loaded.score(loaded.encode_query("cells"), loaded.encode_documents(docs))
    torch.testing.assert_close(stored, pairs.detach(), rtol=1e-5, atol=1e-5)


def test_built_in_checkpoints_keep_their_config_json(tiny_base, tmp_path):
    """A kind whose options are RankerConfig fields writes config.json as before (no empty ``options``), so
    a checkpoint's fingerprint is what it was."""
    from aheadrank.rankers import init_ranker, save_checkpoint

    save_checkpoint(init_ranker("tk", base=tiny_base, tk_layers=1), tmp_path / "tk")
    assert "options" not in json.loads((tmp_path / "tk" / "config.json").read_text())


def cli_with_toy(*args: str) -> subprocess.CompletedProcess:
    """The CLI in a fresh process where this module's SPEC is registered first (as registry.BUILTIN's one line
    would), so that the commands are built with it."""
    code = (
        f"import sys; sys.path.insert(0, {str(HERE)!r}); import test_registry as t; "
        "from aheadrank.rankers.registry import register; register(t.SPEC); "
        f"from aheadrank.cli import app; app({list(args)!r})"
    )
    env = {**os.environ, "COLUMNS": "200", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)


def test_the_cli_offers_a_registered_ranker_and_its_flags(tiny_base, tmp_path, toy):
    from aheadrank.rankers import load_ranker

    help_text = cli_with_toy("train", "--help").stdout
    assert (
        "toy" in help_text
        and "--width" in help_text
        and "toy: dims of the projected word vectors" in help_text
    )
    assert "--scale" in help_text
    made = cli_with_toy(
        "init-ranker", "toy", "--out", str(tmp_path / "t"), "--base", str(tiny_base), "--width", "4"
    )
    assert made.returncode == 0, made.stderr
    assert load_ranker(tmp_path / "t").config.width == 4
    refused = cli_with_toy(
        "init-ranker", "mores", "--out", str(tmp_path / "m"), "--base", str(tiny_base), "--width", "4"
    )
    assert refused.returncode == 2 and "--width does not apply to a mores ranker" in refused.stderr
    assert not (tmp_path / "m").exists()
