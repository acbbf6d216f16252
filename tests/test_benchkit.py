"""The importable code under the benchmark scripts: the variant registry, the shared helpers, the recipe."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from aheadrank.errors import CheckpointError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # benchkit, beside the scripts


def test_every_catalogued_variant_parses_to_its_own_kind_options():
    from aheadrank.rankers.config import default_options, kind_options
    from aheadrank.rankers.variants import CATALOGUE, DEFAULTS, default_variant, parse_variant

    for name in CATALOGUE:
        v = parse_variant(name)
        assert v.name == name and set(v.options) <= set(kind_options()[v.kind])
        assert (v.strategy is not None) == (v.kind == "mores")
    # the default variant of a kind is exactly init-ranker's defaults for it
    for kind, name in DEFAULTS.items():
        v = default_variant(kind)
        assert v.name == name
        assert v.options == {k: x for k, x in default_options(kind).items() if k in v.options}
    assert parse_variant("mores-2ib-s1").model == parse_variant("mores-2ib-s2").model == "mores-2ib"
    with pytest.raises(CheckpointError, match="unknown ranker variant"):
        parse_variant("tk-2")  # one naming scheme: tk-<n>l


def test_match_variants_globs_keeps_order_and_refuses_unknown():
    from aheadrank.rankers.variants import match_variants

    assert match_variants(["tk-*", "bert", "tk-2l"]) == ["tk-1l", "tk-2l", "bert"]
    assert match_variants(["mores-3ib-s2"]) == ["mores-3ib-s2"]  # outside the catalogue, still a name
    with pytest.raises(CheckpointError):
        match_variants(["nope-*"])
    with pytest.raises(CheckpointError):
        match_variants(["tk-2"])


def test_options_of_another_kind_are_refused_everywhere(tiny_base):
    from aheadrank.rankers import init_ranker
    from aheadrank.rankers.config import foreign_options

    assert foreign_options("bert", {"ibs": 2, "max_doc_len": 32, "layer": None}) == ["ibs"]
    assert foreign_options("mores", {"ibs": 2, "pooling": "cls"}) == []
    with pytest.raises(CheckpointError, match="tk_layers does not apply to a mores ranker"):
        init_ranker("mores", base=tiny_base, tk_layers=2)


def test_json_helpers_round_trip_and_clean(tmp_path):
    from benchkit import clean, digest, read_json, write_json

    data = {"a": (1, 2.5), "b": math.nan, 3: [math.inf, {"c": -math.inf}]}
    assert clean(data) == {"a": [1, 2.5], "b": None, "3": [None, {"c": None}]}
    write_json(tmp_path / "x" / "r.json", data)
    assert read_json(tmp_path / "x" / "r.json") == clean(data)
    assert json.loads((tmp_path / "x" / "r.json").read_text()) == clean(data)
    assert read_json(tmp_path / "missing.json") is None
    assert digest({"b": 1, "a": 2}) == digest({"a": 2, "b": 1}) and len(digest("x")) == 12


def test_eval_topics_keeps_the_first_queries_by_qid(tmp_path):
    from benchkit import SAMPLE, eval_topics

    queries, qrels = eval_topics(SAMPLE, "test", 5)
    assert len(queries) == 5 and set(qrels) <= set(queries)
    all_queries, _ = eval_topics(SAMPLE, "test", None)
    assert set(queries) <= set(all_queries)


def test_machine_record():
    from benchkit import cpu_sample, machine

    info = machine("cpu")
    assert info["device"] == "cpu" and info["threads"] >= 1 and "torch" in info
    import torch

    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()  # which vector units timed it
    t, busy, own = cpu_sample()
    assert t > 0 and busy >= 0 and own >= 0


def test_proc_status_and_least_squares_slope():
    """The memory record the serve and memory benches share: this process's /proc status in kB (None for a
    process that is gone), and the least-squares slope of a series."""
    from benchkit import least_squares_slope, proc_status

    own = proc_status()
    assert own is not None and own["VmRSS"] > 0 and own["RssAnon"] > 0
    assert proc_status(2**31) is None
    assert least_squares_slope([0, 1, 2, 3], [1.0, 3.0, 5.0, 7.0]) == pytest.approx(2.0)
    assert least_squares_slope([0, 1, 2], [5.0, 4.0, 6.0]) == pytest.approx(0.5)
    assert least_squares_slope([1], [1.0]) is None and least_squares_slope([2, 2], [1.0, 3.0]) is None


def test_lower_envelope_keeps_each_windows_minimum():
    from benchkit import least_squares_slope, lower_envelope

    # a sawtooth (growth, then a trim back to a flat floor) every 10 s over 60 s
    t = [float(x) for x in range(60)]
    saw = [100.0 + 5.0 * (x % 10) for x in range(60)]
    ft, fy = lower_envelope(t, saw, 10.0)
    assert ft == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0] and fy == [100.0] * 6
    assert least_squares_slope(ft, fy) == 0.0 and least_squares_slope(t, saw) > 0  # the raw slope misleads
    rising = [y + 2.0 * x for x, y in zip(t, saw, strict=True)]  # a floor that does rise, 2 MB/s
    assert least_squares_slope(*lower_envelope(t, rising, 10.0)) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="window"):
        lower_envelope(t, saw, 0)
