"""bench/label_free_center.py: centring on a zero mean gives the build's features back, centring on the corpus
mean takes the common component out of every cosine, whitening makes the value space the states' space, and the
corpus statistics count every document once."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import label_free_center as lc  # noqa: E402
from label_free_passages import Candidates  # noqa: E402


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def fake_candidates(tmp_path: Path) -> Candidates:
    rng = np.random.default_rng(0)
    docs = {d: unit(rng.normal(size=6)).astype(np.float32) for d in ("a", "b", "c")}
    passages = unit(rng.normal(size=(5, 6))).astype(np.float32)
    owner = np.array([0, 0, 1, 2, 2])
    rows_of = [[0, 1], [2], [3, 4]]
    return Candidates(
        collection=tmp_path / "toy",
        qrels={"q": {"a": 1}},
        cands={"q": [("b", 3.0), ("a", 2.0), ("c", 1.0)]},
        qids=["q"],
        docs=docs,
        passages=passages,
        owner=owner,
        row_of={"a": 0, "b": 1, "c": 2},
        rows_of=rows_of,
        qv={"q": unit(rng.normal(size=6)).astype(np.float32)},
    )


def test_a_zero_mean_gives_the_build_s_dense_and_window_features(tmp_path):
    c = fake_candidates(tmp_path)
    got = lc.mapped_bi_encoder(c, lc.vector_map("centre", np.zeros(6), np.eye(6)), window=True)["q"]
    want = c.features("q")
    assert got["dense"] == pytest.approx(want["dense"], abs=1e-6)
    assert got["window"] == pytest.approx(want["window"], abs=1e-6)
    assert (
        "window"
        not in lc.mapped_bi_encoder(c, lc.vector_map(None, np.zeros(6), np.eye(6)), window=False)["q"]
    )


def test_centring_takes_the_common_component_out():
    # two documents that differ only along one axis, beside a large shared offset: uncentred they look alike to
    # any query; centred on their mean they point in opposite directions
    mu = np.array([10.0, 0.0, 0.0])
    d = np.array([[10.0, 1.0, 0.0], [10.0, -1.0, 0.0]])
    q = np.array([10.0, 1.0, 0.0])
    from label_free_sim_space import cosines

    raw = cosines(q, d)
    assert raw[0] - raw[1] < 0.03
    cen = cosines(lc.centred(q, mu), lc.centred(d, mu))
    assert cen == pytest.approx([1.0, -1.0])


def test_whitened_the_value_space_is_the_states_space():
    from label_free_sim_space import cosines

    rng = np.random.default_rng(1)
    x = (
        rng.normal(size=(200, 5)) * np.array([5.0, 1.0, 0.5, 0.1, 0.01]) + 3.0
    )  # states: anisotropic, off-centre
    v = rng.normal(size=(5, 5)) + np.diag([0.0, 0.0, 0.0, 0.0, 1e-3])  # a value map, near singular
    b = rng.normal(size=5)
    y = x @ v.T + b
    wx, wy = lc.vector_map("whiten", *lc.moments(x)), lc.vector_map("whiten", *lc.moments(y))
    assert np.cov(wx(x), rowvar=False) == pytest.approx(np.eye(5), abs=1e-8)
    q = rng.normal(size=5)
    assert cosines(wy(q @ v.T + b), wy(y)) == pytest.approx(cosines(wx(q), wx(x)), abs=1e-6)
    assert not np.allclose(cosines(q @ v.T + b, y), cosines(q, x), atol=1e-3)


def test_each_option_serves_the_pure_score_of_its_residual_map():
    assert lc.RUN_OF == {
        "none": "none",
        "neural": "neural",
        "all": "neural",
        "neural-whiten": "neural-whiten",
        "all-whiten": "neural-whiten",
    }
    with pytest.raises(ValueError, match="unknown map"):
        lc.vector_map("rotate", np.zeros(2), np.eye(2))


def test_the_bi_encoder_vectors_are_every_document_s_once(tmp_path, monkeypatch):
    c = fake_candidates(tmp_path)
    # every corpus document is a candidate: nothing more is embedded, the mean is the candidates'
    args = SimpleNamespace(base=None, workdir=tmp_path / "work")

    class Enc:
        fingerprint = "toy"

        def encode_documents(self, texts):
            raise AssertionError("nothing to embed")

    import aheadrank.rankers.dense as dense

    monkeypatch.setattr(dense, "dense_encoder", lambda base: Enc())
    got = lc.bi_encoder_vectors(args, c, ["a", "b", "c"])
    assert got.shape == (3, 6)
    assert got.mean(axis=0) == pytest.approx(np.mean(np.stack(list(c.docs.values())), axis=0), abs=1e-7)


def test_the_query_at_the_documents_depth_is_the_query_encoder_s_mean():
    import torch
    from aheadrank.rankers.base import masked_mean
    from aheadrank.rankers.text import pad
    from label_free_sim_space import query_vectors, start_ranker

    ranker, _ = start_ranker(None)
    text = "cell growth in mice"
    with torch.inference_mode():
        ids, mask = pad(ranker.tokenize_queries([text]), ranker.device, ranker._text().pad)
        want = masked_mean(ranker.query_states(ids, mask), mask)[0].numpy()
        value = ranker.ibs[-1].cross.self.value(torch.tensor(want)[None])[0].numpy()
    states, values = query_vectors(ranker, [text], through_blocks=False)
    assert states[0] == pytest.approx(want, abs=1e-5)
    assert values[0] == pytest.approx(value, abs=1e-5)
    blocks, _ = query_vectors(ranker, [text])
    assert not np.allclose(blocks[0], want, atol=1e-3)  # the build's query is read two layers deeper


def test_the_query_options_serve_their_own_pure_scores():
    import label_free_sim_query as sq

    assert lc.pure_of(sq.OPTIONS) == {o: o for o in sq.OPTIONS}
    assert sq.OPTIONS["blocks"] == lc.OPTIONS["none"]  # the build's residual
