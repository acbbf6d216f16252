"""bench/label_free_tk_mixer.py: a TK ranker made inside ``started_at`` starts at the asked α and its checkpoint keeps
it, a checkpoint at another α is refused, the build folders are named for α, and each collection's α is chosen on
the others (the default unless another beats it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from aheadrank.rankers import init_ranker
from aheadrank.rankers.checkpoint import load_ranker, save_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import label_free as lf  # noqa: E402
import label_free_tk_mixer as tm  # noqa: E402


def test_a_ranker_made_within_starts_at_alpha_and_its_checkpoint_keeps_it(tiny_base, tmp_path):
    assert init_ranker("tk", base=tiny_base, tk_heads=4).mixer.item() == pytest.approx(0.5)
    args = tm.recipe_args()
    with tm.started_at(0.25):
        r = init_ranker("tk", base=tiny_base, tk_heads=4)
        assert lf.build_name(args, "vaswani", tm.TK) == "tk-6l-base-positive-teacher-passages-mixer0.25"
    assert r.mixer.item() == pytest.approx(0.25)
    assert (
        lf.build_name(args, "vaswani", tm.TK) == "tk-6l-base-positive-teacher-passages"
    )  # undone on leaving
    build = tmp_path / "build"
    save_checkpoint(r, build / "checkpoint")
    assert load_ranker(build / "checkpoint").mixer.item() == pytest.approx(
        0.25
    )  # loaded outside: what it saved
    tm.checkpoint_alpha(build, 0.25)
    with pytest.raises(SystemExit, match="mixer is 0.25, not 0"):
        tm.checkpoint_alpha(build, 0.0)


def test_each_collections_alpha_is_chosen_on_the_others():
    served = {
        "a": {"0.5": 0.50, "0": 0.60, "0.25": 0.55},
        "b": {"0.5": 0.50, "0": 0.44, "0.25": 0.52},
        "c": {"0.5": 0.10, "0": 0.90, "0.25": 0.10},
    }
    assert tm.chosen(served, "c") == "0.25"  # a, b: 0.5 -> 0.50, 0 -> 0.52, 0.25 -> 0.535
    assert tm.chosen(served, "a") == "0"  # b, c: 0.5 -> 0.30, 0 -> 0.67
    # a tie with the default keeps the default; its own collection's numbers never count
    tie = {"a": {"0.5": 0.5, "0": 0.5}, "b": {"0.5": 0.5, "0": 0.5}, "c": {"0.5": 0.0, "0": 1.0}}
    assert tm.chosen(tie, "c") == "0.5"
    assert tm.label(0.5, True) == "0.5+specials" and tm.mixer_name(0.5, True) == "mixer0.5-specials"


def test_with_specials_encodes_a_text_between_cls_and_sep_and_returns_its_own_pieces(tiny_base):
    import torch
    from aheadrank.rankers.text import pad

    r = init_ranker("tk", base=tiny_base, tk_layers=2, tk_base=True)
    text = r._text()
    seqs = [[2000, 2001, 2002, 2003], [2004, 2005]]
    ids, mask = pad(seqs, "cpu", text.pad)
    plain = r.contextualize(ids, mask)
    with tm.started_at(0.5, specials=True):
        got = r.contextualize(ids, mask)
        assert (
            init_ranker("tk", base=tiny_base, tk_heads=4).contextualize(ids, mask).shape == plain.shape
        )  # scratch TK
    assert got.shape == plain.shape and not torch.allclose(got, plain)
    assert torch.all(got[1, 2:] == 0)  # padding stays zero
    for row, seq in enumerate(
        seqs
    ):  # each row as the plain pass over [CLS] + text + [SEP], those two cut off
        wide, wide_mask = pad([[text.cls, *seq, text.sep]], "cpu", text.pad)
        want = r.contextualize(wide, wide_mask)[0, 1:-1]
        torch.testing.assert_close(got[row, : len(seq)], want, rtol=1e-5, atol=1e-6)


def test_maxsim_in_the_kernels_place_is_the_mean_best_cosine_and_ignores_padding():
    import label_free_maxsim as lm
    import numpy as np
    import torch

    g = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(1, 3, 8, generator=g), dim=-1)
    d = torch.nn.functional.normalize(torch.randn(2, 5, 8, generator=g), dim=-1)
    q_mask = torch.tensor([[1, 1, 0]])
    d_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    got = tm.maxsim_score(q, q_mask, d.half(), d_mask)
    want = [
        lm.maxsim(q[0, :2].numpy(), d[b, : int(d_mask[b].sum())].half().float().numpy()) for b in range(2)
    ]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5)
