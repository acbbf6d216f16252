"""bench/label_free_shares.py, bench/label_free_window.py and bench/label_free_hybrid.py read the builds of bench/label_free.py under the same
folder names, and the shares rule is the one their docs state; bench/label_free_prettr_init.py scores as the service
does."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import label_free as lf  # noqa: E402
import label_free_hybrid as hybrid  # noqa: E402
import label_free_sentence_windows as sentence_windows  # noqa: E402
import label_free_shares as shares  # noqa: E402
import label_free_window as window  # noqa: E402


@pytest.mark.parametrize("module", [shares, window, hybrid])
def test_the_probes_find_the_builds_label_free_made_with_the_same_settings(module):
    argv = ["--collections", "scifact", "--steps", "0"]
    made = lf.build_name(lf.parse_args(argv), "scifact", "mores-2ib-s2")
    assert made == "mores-2ib-s2-steps0-positive-teacher-passages"
    assert lf.build_name(module.parse_args(argv), "scifact", "mores-2ib-s2") == made
    src = ["--positive", "source", "--collections", "scifact"]
    assert lf.build_name(module.parse_args(src), "scifact", "mores-2ib-s2") == lf.build_name(
        lf.parse_args(src), "scifact", "mores-2ib-s2"
    )


def test_hybrid_candidates_add_the_bi_encoders_missing_documents_with_their_exact_bm25_score():
    top = {"q": [("a", 9.0), ("b", 7.0)]}
    every = {"q": [("a", 9.0), ("b", 7.0), ("c", 2.5)]}
    dense = {"q": ["c", "a", "d"]}
    got = hybrid.hybrid(top, every, dense)
    assert got == {"q": [("a", 9.0), ("b", 7.0), ("c", 2.5), ("d", 0.0)]}
    qrels = {"q": {"d": 1, "e": 2, "b": 0}}
    assert hybrid.recall(top, qrels, ["q"]) == 0.0
    assert hybrid.recall(got, qrels, ["q"]) == pytest.approx(0.5)


def test_the_shares_rule_takes_the_best_held_out_share_and_the_larger_on_a_tie():
    scores = {0.0: 0.90, 1 / 6: 0.91, 1 / 3: 0.89}
    assert shares.rule_choice(scores) == 1 / 6
    assert shares.rule_choice({0.0: 0.9, 1 / 6: 0.8, 1 / 3: 0.9}) == 1 / 3
    assert shares.rule_choice({0.0: 0.95, 1 / 6: 0.94, 1 / 3: 0.93}) == 0.0
    for w in shares.SHARES:
        got = shares.weights(w)
        assert got["neural"] == w and got["bm25"] == got["dense"]
        assert sum(got.values()) == pytest.approx(1.0)
    assert set(shares.RULE_SHARES) <= set(shares.SHARES)


def test_the_window_probe_refuses_a_window_too_small_to_hold_a_word(capsys):
    with pytest.raises(SystemExit):
        window.parse_args(["--windows", "128", "4"])
    assert "--windows must be at least 8 word pieces" in capsys.readouterr().err
    assert window.parse_args(["--windows", "64"]).windows == [64]


def test_a_probe_run_writes_each_collections_result_and_its_extra_records(tmp_path):
    import argparse
    import json

    args = argparse.Namespace(collections=["a", "b"], out=tmp_path)
    rc = lf.run_probe(
        ["--x"],
        lambda argv: args,
        lambda a, name: {"collection": name},
        lambda rs: "| t |",
        "probe",
        rule={"k": 1},
    )
    data = json.loads((tmp_path / "probe.json").read_text())
    assert rc == 0 and (tmp_path / "probe.md").read_text() == "| t |\n"
    assert data["rule"] == {"k": 1} and data["results"] == [{"collection": "a"}, {"collection": "b"}]
    assert data["command"] == ["python", "bench/probe.py", "--x"]


def test_the_prettr_init_probe_scores_as_the_service_and_measures_r2_as_the_fit(tiny_base):
    """bench/label_free_prettr_init.py: its scores of a query's candidates (float16 fields, as a store holds them)
    are the ranker's own scores of the same documents, and its R² of P on the fitted documents is the fit's."""
    import label_free_prettr_init as probe
    import numpy as np
    import torch
    from aheadrank.rankers import init_ranker

    words = "insulin liver yeast protein fold bank rate heart".split()
    texts = {f"d{i}": " ".join(words[(i + k) % len(words)] for k in range(3 + i % 9)) for i in range(40)}
    model = init_ranker("prettr", base=tiny_base, layer=3, compress=8, max_doc_len=32).eval()
    fit = model.fit_pool_map(list(texts.values()))
    assert probe.pool_r2(model, list(texts.values())) == pytest.approx(fit["r2"], abs=1e-3)
    cands = {"q": [(d, 0.0) for d in sorted(texts)[:12]]}
    got = probe.stored_scores(model, {"q": "liver insulin"}, cands, ["q"], texts)["q"]
    with torch.no_grad():
        want = model.score(
            model.encode_query("liver insulin"), model.encode_documents([texts[d] for d, _ in cands["q"]])
        )
    np.testing.assert_allclose(got, want.double().numpy(), rtol=2e-2, atol=2e-2)


def test_the_equal_share_row_is_added_only_where_the_served_share_is_not_one_third():
    from fractions import Fraction

    from aheadrank.build import label_free_weights

    mores = label_free_weights("mores", window=True)["neural+bm25+dense+window"]
    assert lf.equal_share_weights(mores) is None
    for has_window, key in ((True, "neural+bm25+dense+window"), (False, "neural+bm25+dense")):
        tk = label_free_weights("tk", window=has_window)[key]
        assert tk["neural"] < 0.2  # the share LABEL_FREE_NEURAL_SHARE gives it
        got = lf.equal_share_weights(tk)
        assert set(got) == set(tk) and sum(got.values()) == pytest.approx(1.0)
        others = [w for f, w in got.items() if f != "neural"]
        assert got["neural"] == pytest.approx(0.25 if has_window else float(Fraction(1, 3)))
        assert max(others) == pytest.approx(min(others))


def test_titled_passages_put_the_title_in_front_of_every_passage_within_the_window(minilm_dir):
    from transformers import AutoTokenizer

    from aheadrank.passages import PassageOptions, split_passages

    tok = AutoTokenizer.from_pretrained(str(minilm_dir))
    opts = PassageOptions(32, 8, 10)
    title = "Vitamin D and bone density"
    body = " ".join(
        f"sentence {i} says that calcium intake changes fracture risk in older adults." for i in range(12)
    )
    got = sentence_windows.titled_passages(tok, title, body, opts)
    plain = split_passages(tok, [f"{title}. {body}"], opts)[0]
    assert len(got) > 2 and all(p.startswith(f"{title}. ") for p in got)
    assert (
        sum(p.startswith(title) for p in plain) == 1
    )  # the plain split has the title in its first passage only
    for (
        p
    ) in got:  # each passage still fits the ranker's window (a piece of slack where "title. " meets the body)
        assert len(tok(p, add_special_tokens=False)["input_ids"]) <= opts.window + 1
    bodies = [p[len(title) + 2 :] for p in got]
    assert body.startswith(bodies[0]) and body.endswith(bodies[-1])  # the whole body is covered, in order
    assert all(b in body for b in bodies)
    # a document that fits, or has no title, is split as before
    assert sentence_windows.titled_passages(tok, title, "Short.", opts) == [f"{title}. Short."]
    assert sentence_windows.titled_passages(tok, "", body, opts) == split_passages(tok, [body], opts)[0]
    # a title longer than half the window is cut to half of it, leaving room for the body
    long_title = " ".join(["osteoporosis"] * 40)
    for p in sentence_windows.titled_passages(tok, long_title, body, opts):
        assert len(tok(p, add_special_tokens=False)["input_ids"]) <= opts.window + 1
