"""The query side replayed from CUDA graphs (rankers/graphs.py): the same states as query_state, where it applies."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
from aheadrank.rankers import init_ranker
from aheadrank.rankers.text import pad

KINDS = [
    ("bert", {}),
    ("mores", {"ibs": 2, "sim": True}),
    ("prettr", {"layer": 3, "compress": 16, "sim": True}),
    ("tk", {}),
]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def test_off_the_gpu_the_graphs_change_nothing(tiny_base):
    """On the CPU (or with gradients on, or in training) encode_query runs query_state as before."""
    ranker = init_ranker("mores", base=tiny_base, ibs=1).eval()
    want = ranker.encode_query("graphs on the cpu")
    graphs = ranker.use_cuda_graphs()
    got = ranker.encode_query("graphs on the cpu")
    assert graphs.replays == 0 and not graphs.graphs
    for name, value in want.tensors.items():
        assert torch.equal(got[name], value)
    assert copy.deepcopy(ranker).query_graphs is None  # copies and pickles carry no graphs
    assert pickle.loads(pickle.dumps(ranker)).query_graphs is None
    assert ranker.use_cuda_graphs(False) is None and ranker.query_graphs is None


def assert_same_state(ranker, text: str) -> None:
    got = ranker.encode_query(text)
    with torch.inference_mode():
        want = ranker.query_state(*pad(ranker.tokenize_queries([text]), ranker.device, ranker.text.pad))
    assert got.tensors.keys() == want.tensors.keys()
    for name, value in want.tensors.items():
        torch.testing.assert_close(got[name], value, rtol=1e-6, atol=1e-6)


@needs_cuda
@pytest.mark.parametrize(("kind", "opts"), KINDS, ids=[k for k, _ in KINDS])
def test_replayed_query_states_equal_query_state(tiny_base, kind, opts):
    """Every query length gets its graph; replays give query_state's values (the same kernels) in fresh tensors,
    follow in-place weight changes, drop the graphs when a parameter is replaced, and stand aside in training."""
    ranker = init_ranker(kind, base=tiny_base, max_doc_len=48, **opts).to("cuda").eval()
    graphs = ranker.use_cuda_graphs()
    queries = ["a", "two words", "a somewhat longer query about graphs", "a" * 40]
    for q in queries * 2:
        assert_same_state(ranker, q)
    lengths = {len(ranker.tokenize_queries([q])[0]) for q in queries}
    assert len(graphs.graphs) == len(lengths) and graphs.replays == 2 * len(queries)
    new = [t for t in range(1, 20) if t not in lengths][:2]
    # ahead of time (a service's warm-up), gradients on or off
    assert graphs.capture_all(new) == len(lengths) + 2
    # copies, not the graph's memory
    first = ranker.encode_query(queries[2])["q" if kind != "bert" else "emb"]
    assert first.data_ptr() != ranker.encode_query(queries[2])["q" if kind != "bert" else "emb"].data_ptr()
    with torch.no_grad():
        for p in ranker.parameters():
            p.mul_(1.5)  # in place: the graphs read the new values
    assert_same_state(ranker, queries[2])
    ranker.to("cpu").to("cuda")  # parameters replaced (where the allocator hands out other addresses)
    assert_same_state(ranker, queries[0])
    assert_same_state(ranker, queries[1])
    ranker.train()
    before = graphs.replays
    ranker.encode_query(queries[0])
    assert graphs.replays == before


def test_dense_query_graphs_stand_aside_on_the_cpu(tiny_base):
    """The dense prior's encoder with graphs asked for, on the CPU: the same embeddings, no replay."""
    from aheadrank.rankers.dense import DenseEncoder

    enc = DenseEncoder(tiny_base)
    one = enc.encode_queries(["dense graphs"])
    graphs = enc.use_cuda_graphs()
    assert np.array_equal(enc.encode_queries(["dense graphs"]), one) and graphs.replays == 0


@needs_cuda
def test_dense_query_embeddings_from_graphs(tiny_base):
    """The dense prior's encoder on a GPU: one query at a time from its graphs (equal to ``embed``), several
    texts as usual."""
    from aheadrank.rankers.dense import DenseEncoder

    enc = DenseEncoder(tiny_base)
    want = enc.encode_queries(["dense graphs", "two queries at once"])
    graphs = enc.use_cuda_graphs()
    enc.to("cuda")
    for q in ["dense graphs", "a somewhat longer query about dense graphs", "dense graphs"]:
        with torch.inference_mode():
            direct = enc.embed(*pad(enc.tokenize_queries([q]), "cuda", enc.text.pad))[0].cpu().numpy()
        np.testing.assert_allclose(enc.encode_queries([q])[0], direct, rtol=1e-6, atol=1e-6)
    assert graphs.replays == 3 and len(graphs.graphs) == 2
    np.testing.assert_allclose(enc.encode_queries(["dense graphs", "two queries at once"]), want, atol=1e-5)
    assert graphs.replays == 3  # a batch of texts is not graphed
    assert graphs.capture_all([5, 6], enc.text.pad) == 4
