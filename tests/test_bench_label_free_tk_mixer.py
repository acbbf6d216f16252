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
    # undone on leaving
    assert lf.build_name(args, "vaswani", tm.TK) == "tk-6l-base-positive-teacher-passages"
    build = tmp_path / "build"
    save_checkpoint(r, build / "checkpoint")
    # loaded outside: what it saved
    assert load_ranker(build / "checkpoint").mixer.item() == pytest.approx(0.25)
    tm.checkpoint_alpha(build, 0.25)
    with pytest.raises(SystemExit, match="mixer is 0.25, not 0"):
        tm.checkpoint_alpha(build, 0.0)
    with pytest.raises(SystemExit, match="tk_specials is not True"):
        tm.checkpoint_alpha(build, 0.25, specials=True)
    # a build made with specials passes the check that asks for them (the MaxSim rows of 0+specials)
    with tm.started_at(0.0, specials=True):
        r = init_ranker("tk", base=tiny_base, tk_layers=2, tk_base=True)
    save_checkpoint(r, tmp_path / "sp" / "checkpoint")
    tm.checkpoint_alpha(tmp_path / "sp", 0.0, specials=True)


def test_only_the_first_settings_build_writes_the_baselines_runs(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(lf, "main", lambda argv: seen.append(argv))
    monkeypatch.setattr(tm, "checkpoint_alpha", lambda *a: None)
    args = tm.parse_args(["--out", str(tmp_path), "--workdir", str(tmp_path / "w"), "--specials"])
    tm.build_at(args, "vaswani", 0.0, False, True)
    tm.build_at(args, "vaswani", 0.5, True, False)
    assert "--no-baseline-runs" not in seen[0] and "--no-baseline-runs" in seen[1]
    assert lf.parse_args(["--no-baseline-runs"]).baseline_runs is False
    assert lf.parse_args([]).baseline_runs is True


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


def test_specials_within_turn_tks_option_on_for_rankers_from_the_base_only(tiny_base):
    # the math of the option is TK's own (tests/rankers/test_init_and_math.py); the bench only turns it on
    with tm.started_at(0.5, specials=True):
        assert init_ranker("tk", base=tiny_base, tk_layers=2, tk_base=True).config.tk_specials
        assert not init_ranker("tk", base=tiny_base, tk_heads=4).config.tk_specials  # scratch TK
    with tm.started_at(0.5):
        assert not init_ranker("tk", base=tiny_base, tk_layers=2, tk_base=True).config.tk_specials


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
