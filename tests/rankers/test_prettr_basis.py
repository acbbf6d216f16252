"""PreTTR's stored basis: r stored as r·V, V the right singular vectors of the centred decompressor, so that the
decompression's Gram matrix is diagonal and the folded path computes each token's LayerNorm σ in O(e). The same
scores in any basis; new rankers and saved checkpoints canonical; checkpoints from before it load as the identity."""

from __future__ import annotations

import json
import random

import pytest
import torch
from aheadrank.rankers import init_ranker, load_ranker, save_checkpoint
from aheadrank.rankers.checkpoint import compute_fingerprint
from aheadrank.rankers.prettr import gram_is_diagonal
from conftest import random_text
from safetensors.torch import load_file, save_file


@pytest.fixture(scope="module")
def texts():
    rng = random.Random(5)
    return [random_text(rng, 1, 24) for _ in range(2)], [random_text(rng, 1, 60) for _ in range(40)]


def rotate(ranker, seed: int = 0) -> None:
    """A random orthogonal change of the stored basis: the same function, a Gram matrix far from diagonal."""
    e = ranker.config.compress
    q, _ = torch.linalg.qr(
        torch.randn(e, e, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    )
    with torch.no_grad():
        ranker.stored_basis.copy_((ranker.stored_basis.double() @ q).float())
        ranker.decompressor.weight.copy_((ranker.decompressor.weight.double() @ q).float())


def scores(ranker, queries, docs) -> torch.Tensor:
    stored = ranker.encode_documents(docs)
    return torch.stack([ranker.score(ranker.encode_query(q), stored) for q in queries])


@pytest.mark.parametrize("sim", [False, True])
def test_any_basis_gives_the_same_scores_and_the_canonical_one_a_diagonal_gram(tiny_base, texts, sim):
    queries, docs = texts
    ranker = init_ranker("prettr", base=tiny_base, layer=3, compress=8, sim=sim, max_doc_len=48)
    if sim:  # the head starts at zero: give it weights so both parts of the score are compared
        torch.manual_seed(3)
        torch.nn.init.normal_(ranker.head.weight, std=0.2)
    assert gram_is_diagonal(ranker.decompression_gram())  # new rankers are canonical
    assert not ranker.canonicalize()  # and canonicalising again changes nothing
    canonical = scores(ranker, queries, docs)
    with torch.no_grad():
        unsplit = torch.stack([ranker.score_pairs(q, docs) for q in queries])
    rotate(ranker)
    assert not gram_is_diagonal(ranker.decompression_gram())
    general = scores(ranker, queries, docs)  # the folded path's GEMM for G's quadratic form
    assert ranker.canonicalize() and gram_is_diagonal(ranker.decompression_gram())
    again = scores(ranker, queries, docs)
    scale = unsplit.abs().max()
    for got in (canonical, general, again):
        assert (got - unsplit).abs().max() <= 1e-4 * scale


def test_saved_checkpoints_are_canonical_and_the_model_in_memory_stays(tiny_base, texts, tmp_path):
    queries, docs = texts
    ranker = init_ranker("prettr", base=tiny_base, layer=3, compress=8, sim=False, max_doc_len=48)
    rotate(ranker, seed=1)
    before = ranker.decompressor.weight.clone()
    want = scores(ranker, queries, docs)
    save_checkpoint(ranker, tmp_path / "ckpt")
    assert torch.equal(ranker.decompressor.weight, before)  # a copy was canonicalised, not this model
    loaded = load_ranker(tmp_path / "ckpt")
    assert gram_is_diagonal(loaded.decompression_gram())
    assert not torch.equal(loaded.stored_basis, torch.eye(8))
    got = scores(loaded, queries, docs)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()


def test_a_checkpoint_from_before_the_stored_basis_loads_as_the_identity(tiny_base, texts, tmp_path):
    """Weights without ``stored_basis`` (written before it existed) load with the identity: r as stored then, so
    its stores keep their meaning."""
    queries, docs = texts
    ranker = init_ranker("prettr", base=tiny_base, layer=3, compress=8, sim=False, max_doc_len=48)
    rotate(ranker, seed=2)
    with torch.no_grad():  # an old checkpoint: the decompressor as trained, r in its own basis
        ranker.decompressor.weight.copy_(
            (ranker.decompressor.weight.double() @ ranker.stored_basis.double().T).float()
        )
        ranker.stored_basis.copy_(torch.eye(8))
    want = scores(ranker, queries, docs)
    path = tmp_path / "old"
    save_checkpoint(ranker, path)
    weights = load_file(path / "model.safetensors")
    old = {k: v for k, v in weights.items() if k != "stored_basis"}
    # as the old version wrote it: its own (non-canonical) decompressor, no basis
    old["decompressor.weight"] = ranker.decompressor.weight.detach().clone()
    save_file(old, path / "model.safetensors")
    record = json.loads((path / "fingerprint.json").read_text())
    record["sha256"] = compute_fingerprint(path)
    (path / "fingerprint.json").write_text(json.dumps(record))
    loaded = load_ranker(path)
    assert torch.equal(loaded.stored_basis, torch.eye(8))
    assert not gram_is_diagonal(loaded.decompression_gram())
    got = scores(loaded, queries, docs)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
