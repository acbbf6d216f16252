"""Evaluation harness: measures by hand, trec_eval conventions (and the trec_eval binary itself), run
files, the paired t-test and the MORES non-inferiority test, and ``aheadrank evaluate``."""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import platform
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from typer.testing import CliRunner

from aheadrank.cli import app
from aheadrank.errors import AheadrankError
from aheadrank.evaluation import (
    EvaluationError,
    Measure,
    RunFileError,
    compare,
    coverage,
    detectable_difference,
    evaluate,
    paired_test,
    parse_metric,
    per_query,
    queries_needed,
    ranking,
    read_run,
    write_run,
)

L3 = math.log2(3)

# qA: 4 judged (a1 rel 1, a2 rel 0, a3 rel 1, a4 rel 1 -> R = 3); the run ranks a1, a2, a3, u1 (u1 is
#     unjudged, a4 is not retrieved), so the relevant documents stand at ranks 1 and 3.
# qB: graded (b1 rel 2, b2 rel 1, b3 rel 0 -> R = 2); the run ranks b3, b2, b1: relevant at ranks 2, 3.
QRELS = {
    "qA": {"a1": 1, "a2": 0, "a3": 1, "a4": 1},
    "qB": {"b1": 2, "b2": 1, "b3": 0},
}
RUN = {
    "qA": {"a1": 0.9, "a2": 0.8, "a3": 0.7, "u1": 0.6},
    "qB": {"b3": 3.0, "b2": 2.0, "b1": 1.0},
}
# qA  P@10   = 2 relevant in the top 10 / 10                  = 0.2
#     R@100  = 2 of the 3 relevant retrieved                   = 2/3
#     MRR@10 = first relevant at rank 1                        = 1
#     MAP    = (P at rank 1 = 1/1  +  P at rank 3 = 2/3) / R=3 = 5/9
#     nDCG@10: DCG = 1/log2(2) + 1/log2(4) = 1.5;
#              IDCG (grades 1, 1, 1) = 1/log2(2) + 1/log2(3) + 1/log2(4) = 1.5 + 1/log2(3)
# qB  P@10   = 0.2;  R@100 = 2/2 = 1;  MRR@10 = 1/2
#     MAP    = (1/2 + 2/3) / 2 = 7/12
#     nDCG@10: DCG = 1/log2(3) + 2/log2(4) = 1 + 1/log2(3);  IDCG (grades 2, 1) = 2/log2(2) + 1/log2(3)
HAND = {
    "P@10": {"qA": 0.2, "qB": 0.2},
    "R@100": {"qA": 2 / 3, "qB": 1.0},
    "MRR@10": {"qA": 1.0, "qB": 0.5},
    "MAP": {"qA": 5 / 9, "qB": 7 / 12},
    "nDCG@10": {"qA": 1.5 / (1.5 + 1 / L3), "qB": (1 + 1 / L3) / (2 + 1 / L3)},
}


def test_measures_match_the_hand_computation():
    values = per_query(RUN, QRELS)
    assert set(values) == set(HAND)
    for name, expected in HAND.items():
        assert values[name] == pytest.approx(expected, abs=1e-12), name
    means = evaluate(RUN, QRELS)
    assert list(means) == ["nDCG@10", "MRR@10", "R@100", "MAP", "P@10"]  # the default order
    assert means["MAP"] == pytest.approx((5 / 9 + 7 / 12) / 2)  # = 41/72
    assert means["MRR@10"] == pytest.approx(0.75)
    assert means["R@100"] == pytest.approx(5 / 6)
    assert means["nDCG@10"] == pytest.approx(np.mean(list(HAND["nDCG@10"].values())))
    assert all(type(v) is float for vs in values.values() for v in vs.values())


def test_trec_eval_names_are_accepted_and_kept_as_keys():
    means = evaluate(RUN, QRELS, metrics=("ndcg_cut_10", "recip_rank", "recall_100", "P_10", "map"))
    assert list(means) == ["ndcg_cut_10", "recip_rank", "recall_100", "P_10", "map"]
    assert means["ndcg_cut_10"] == pytest.approx(evaluate(RUN, QRELS, "nDCG@10")["nDCG@10"])
    assert means["recip_rank"] == pytest.approx(0.75)
    assert parse_metric("ndcg_cut.10") == Measure("ndcg", 10) == parse_metric("NDCG@10")
    assert parse_metric("MRR") == Measure("rr", None) and parse_metric("map_cut_10") == Measure("ap", 10)
    assert [parse_metric(n).name for n in ("recall.100", "p_5", "map", "ndcg")] == [
        "R@100",
        "P@5",
        "MAP",
        "nDCG",
    ]
    for bad in ("bleu", "recall", "P", "ndcg_cut", "nDCG@0", "nDCG@x"):
        with pytest.raises(EvaluationError):
            parse_metric(bad)


def test_cutoffs_rank_11_and_101():
    # one relevant document at rank 11, another at rank 101 (R = 2), all other documents unjudged
    docs = {f"x{i:03d}": 1000.0 - i for i in range(1, 121)}
    qrels = {"q": {"x011": 1, "x101": 1}}
    v = {
        k: d["q"]
        for k, d in per_query(
            {"q": docs}, qrels, ("MRR@10", "MRR", "nDCG@10", "R@100", "R@101", "MAP")
        ).items()
    }
    assert v["MRR@10"] == 0.0 and v["MRR"] == pytest.approx(1 / 11)
    assert v["nDCG@10"] == 0.0
    assert v["R@100"] == 0.5 and v["R@101"] == 1.0
    assert v["MAP"] == pytest.approx((1 / 11 + 2 / 101) / 2)


def test_ties_are_broken_by_docid_descending_like_trec_eval():
    assert ranking({"a": 1.0, "b": 1.0, "c": 2.0, "B": 1.0}) == ["c", "b", "a", "B"]
    # equal scores: "z" is ranked before "a", so the relevant "a" sits at rank 2
    assert evaluate({"q": {"a": 1.0, "z": 1.0}}, {"q": {"a": 1}}, "MRR@10")["MRR@10"] == 0.5
    assert evaluate({"q": {"a": 1.0, "z": 1.0}}, {"q": {"z": 1}}, "MRR@10")["MRR@10"] == 1.0
    # the run file's rank column is ignored: scores decide
    assert ranking({"d1": -3.0, "d2": 5.0}) == ["d2", "d1"]


def test_missing_unjudged_and_relevance_free_queries():
    qrels = {
        "q1": {"d1": 1},
        "q2": {"d2": 1},  # missing from the run: counts as 0
        "q3": {"d3": 0, "d4": 0},  # no relevant document: skipped
        "q4": {"d5": -1, "d6": 1},  # a negative grade is non-relevant and adds no gain
    }
    run = {
        "q1": {"u": 2.0, "d1": 1.0},  # unjudged "u" is non-relevant: d1 at rank 2
        "q3": {"d3": 1.0},
        "q4": {"d5": 2.0, "d6": 1.0},
        "q9": {"d1": 1.0},  # not in the qrels: ignored
    }
    values = per_query(run, qrels, ("MRR@10", "nDCG@10", "P@10"))
    assert set(values["MRR@10"]) == {"q1", "q2", "q4"}
    assert values["MRR@10"] == {"q1": 0.5, "q2": 0.0, "q4": 0.5}
    assert values["nDCG@10"]["q4"] == pytest.approx(1 / L3)  # the -1 at rank 1 contributes nothing
    assert evaluate(run, qrels, "MRR@10")["MRR@10"] == pytest.approx(1 / 3)
    assert (
        coverage(run, qrels).__dict__
        == {
            "evaluated": 3,
            "retrieved": 2,
            "missing": 1,
            "no_relevant": 1,
            "unjudged": 1,
            "judged_at_10": 0.75,  # of the retrieved evaluated queries' top 10s: d1 of (u, d1), d5 and d6 of (d5, d6)
        }
    )
    assert evaluate({}, qrels, "MAP")["MAP"] == 0.0  # an empty run scores 0, it is not an error
    with pytest.raises(EvaluationError, match="no query in the qrels has a relevant document"):
        evaluate(run, {"q3": qrels["q3"]})


# ----------------------------------------------------------------------------------------------- run files


def test_run_file_round_trip(tmp_path):
    run = {
        "10": {"d1": 0.1 + 0.2, "d2": -1e-300, "d3": float(np.float32(0.7)), "d4": 3},
        "9": {"x": 1.0, "y": 1.0, "z": 2.0},
        "q-b": {"only": 0.0},
    }
    path = tmp_path / "runs" / "a.trec"
    assert write_run(path, run, tag="mytag") == 8
    assert read_run(path) == run  # exact floats
    lines = path.read_text().splitlines()
    # numeric qids in numeric order, others after; within a query trec_eval's order, ranks from 1
    assert [line.split()[0] for line in lines] == ["9"] * 3 + ["10"] * 4 + ["q-b"]
    assert lines[:3] == ["9 Q0 z 1 2.0 mytag", "9 Q0 y 2 1.0 mytag", "9 Q0 x 3 1.0 mytag"]
    assert lines[3].split()[2:4] == ["d4", "1"]
    assert not list(tmp_path.glob("runs/.*"))  # no temporary file left behind
    gz = tmp_path / "a.trec.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert read_run(gz) == run


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("q1 Q0 d2 2 0.5", "5 columns, expected 6 (qid Q0 docid rank score tag)"),
        ("q1 Q0 d2 2 0.5 tag extra", "7 columns, expected 6 (qid Q0 docid rank score tag)"),
        ("q1 Q0 d2 two 0.5 tag", "rank 'two' is not an integer"),
        ("q1 Q0 d2 2 high tag", "score 'high' is not a number"),
        ("q1 Q0 d2 2 nan tag", "score 'nan' is not finite"),
        ("q1 Q0 d1 2 0.5 tag", "document 'd1' listed again for query 'q1' (first on line 1)"),
    ],
)
def test_malformed_run_lines_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.trec"
    path.write_text(f"q1 Q0 d1 1 1.0 tag\n\n{line}\n")
    with pytest.raises(RunFileError) as info:
        read_run(path)
    assert str(info.value) == f"{path}:3: {message}"
    assert isinstance(info.value, AheadrankError)


def test_run_file_errors(tmp_path):
    with pytest.raises(RunFileError, match="cannot read run file"):
        read_run(tmp_path / "absent.trec")
    (tmp_path / "latin1.trec").write_bytes(b"q1 Q0 d\xe9 1 1.0 t\n")
    with pytest.raises(RunFileError, match=r"latin1.trec:1: invalid UTF-8"):
        read_run(tmp_path / "latin1.trec")
    with pytest.raises(RunFileError, match="contains whitespace"):
        write_run(tmp_path / "w.trec", {"q": {"a b": 1.0}})
    with pytest.raises(RunFileError, match="contains whitespace"):
        write_run(tmp_path / "w.trec", {"q": {"a": 1.0}}, tag="my tag")
    with pytest.raises(RunFileError, match="not a finite number"):
        write_run(tmp_path / "w.trec", {"q": {"a": float("-inf")}})
    assert not (tmp_path / "w.trec").exists()


# ------------------------------------------------------------------------------ against trec_eval itself


def _trec_eval_binary(tmp_path: Path) -> Path:
    """trec_eval 9.0.4 as shipped (for Linux x86-64) inside Pyserini's Anserini jar."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the bundled trec_eval binary is for Linux x86-64")
    spec = importlib.util.find_spec("pyserini")
    jars = sorted(Path(spec.submodule_search_locations[0]).glob("resources/jars/*.jar")) if spec else []
    if not jars:
        pytest.skip("no Pyserini jar with trec_eval")
    with zipfile.ZipFile(jars[0]) as jar:
        try:
            data = jar.read("trec_eval/trec_eval-linux-amd64")
        except KeyError:
            pytest.skip("the jar has no trec_eval binary")
    binary = tmp_path / "trec_eval"
    binary.write_bytes(data)
    binary.chmod(0o755)
    return binary


def _trec_eval(binary: Path, qrels_path: Path, run_path: Path, measures: list[str]) -> dict:
    args = [str(binary), "-q", "-c", *(f"-m{m}" for m in measures), str(qrels_path), str(run_path)]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    table: dict = {}
    for line in out.splitlines():
        name, qid, value = line.split()
        table.setdefault(name, {})[qid] = float(value)
    return table


def test_measures_equal_trec_eval_on_random_runs_with_ties(tmp_path):
    binary = _trec_eval_binary(tmp_path)
    rng = np.random.default_rng(7)
    pool = [f"d{i:03d}" for i in range(220)]
    qrels, run = {}, {}
    for q in range(40):
        qid = str(q + 1)
        judged = rng.choice(pool, size=int(rng.integers(3, 25)), replace=False)
        qrels[qid] = {
            str(d): int(g) for d, g in zip(judged, rng.choice([0, 0, 1, 2, 3], size=judged.size), strict=True)
        }
        if q % 9 == 0:
            continue  # missing from the run
        docs = rng.choice(pool, size=int(rng.integers(5, 150)), replace=False)
        scores = rng.integers(0, 12, size=docs.size) / 4.0  # many ties
        run[qid] = {str(d): float(s) for d, s in zip(docs, scores, strict=True)}
    run["999"] = {"d001": 1.0}  # unjudged query
    qrels["500"], run["500"] = {"d001": 0}, {"d001": 1.0}  # no relevant document
    # relevance-free queries are skipped here (trec_eval -c would average them in as 0): not given to it
    evaluated = {q: j for q, j in qrels.items() if any(g >= 1 for g in j.values())}
    assert "500" not in evaluated and len(evaluated) < len(qrels)
    qrels_path = tmp_path / "qrels.txt"
    qrels_path.write_text("".join(f"{q} 0 {d} {g}\n" for q, j in evaluated.items() for d, g in j.items()))
    run_path = tmp_path / "run.trec"
    write_run(run_path, run)
    top10_path = tmp_path / "top10.trec"
    write_run(top10_path, {q: {d: docs[d] for d in ranking(docs)[:10]} for q, docs in run.items()})

    pairs = {
        "map": "MAP",
        "map_cut.10": "MAP@10",
        "ndcg_cut.10": "nDCG@10",
        "ndcg": "nDCG",
        "recip_rank": "MRR",
        "P.10": "P@10",
        "P.5": "P@5",
        "recall.100": "R@100",
        "recall.10": "R@10",
    }
    # one -m per measure (a second "-m P.5" would replace "-m P.10")
    measures = ["map", "map_cut.10", "ndcg_cut.10", "ndcg", "recip_rank", "P.5,10", "recall.10,100"]
    reference = _trec_eval(binary, qrels_path, run_path, measures)
    reference["MRR@10"] = _trec_eval(binary, qrels_path, top10_path, ["recip_rank"])["recip_rank"]
    ours = per_query(run, qrels, [*pairs.values(), "MRR@10"])
    means = evaluate(run, qrels, [*pairs.values(), "MRR@10"])
    for te_name, name in [*pairs.items(), ("MRR@10", "MRR@10")]:
        te_name = te_name.replace(".", "_")
        expected = reference[te_name]
        assert set(expected) - {"all"} == set(run) & set(evaluated), name  # trec_eval -q: run ∩ qrels
        for qid, value in expected.items():
            got = means[name] if qid == "all" else ours[name][qid]
            assert got == pytest.approx(value, abs=5.1e-5), (name, qid)


# ------------------------------------------------------------------------------------ paired comparison


def _per_query(values) -> dict[str, float]:
    return {str(i): float(v) for i, v in enumerate(values)}


def test_paired_t_test_and_non_inferiority_equal_scipy():
    rng = np.random.default_rng(0)
    a = rng.uniform(0.0, 1.0, 50)
    b = np.clip(a + rng.normal(0.0, 0.1, 50), 0, 1)
    cmp = paired_test(_per_query(a), _per_query(b), metric="nDCG@10")
    ref = stats.ttest_rel(b, a)
    assert cmp.t == pytest.approx(ref.statistic) and cmp.p == pytest.approx(ref.pvalue)
    assert cmp.n == 50 and cmp.mean_a == pytest.approx(a.mean()) and cmp.mean_b == pytest.approx(b.mean())
    assert cmp.mean_diff == pytest.approx((b - a).mean()) and cmp.ratio == pytest.approx(b.mean() / a.mean())
    assert cmp.diffs["3"] == pytest.approx(b[3] - a[3])
    for delta in (0.02, 0.05):
        ni = cmp.at(delta)
        d = b - (1 - delta) * a
        # one-sided one-sample t-test of d by hand: t = mean / (sd / sqrt(n)), p = P(T_49 > t)
        t = d.mean() / (d.std(ddof=1) / math.sqrt(d.size))
        assert ni.t == pytest.approx(t) and ni.p == pytest.approx(stats.t.sf(t, d.size - 1))
        assert ni.p == pytest.approx(stats.ttest_rel(b, (1 - delta) * a, alternative="greater").pvalue)
        assert ni.mean_d == pytest.approx(b.mean() - (1 - delta) * a.mean())
        assert ni.threshold == pytest.approx((1 - delta) * a.mean())
        assert ni.non_inferior == (ni.p < 0.05)
        fixed = stats.ttest_1samp(b - a + delta * a.mean(), 0.0, alternative="greater").pvalue
        assert ni.p_fixed_margin == pytest.approx(fixed)


def test_non_inferiority_clearly_holds_and_clearly_fails():
    rng = np.random.default_rng(1)
    a = rng.uniform(0.3, 0.9, 300)
    # B loses nothing on average (noise 0.01): non-inferior at 2% and 5% (and not different from A)
    same = paired_test(_per_query(a), _per_query(a + rng.normal(0, 0.01, 300)))
    assert same.at(0.02).non_inferior and same.at(0.05).non_inferior
    assert same.at(0.02).p < 1e-10 and not same.significant
    # B loses 10% on every query: inferior at both margins, and significantly different
    worse = paired_test(_per_query(a), _per_query(0.9 * a + rng.normal(0, 0.01, 300)))
    assert not worse.at(0.02).non_inferior and not worse.at(0.05).non_inferior
    assert worse.at(0.05).p > 0.999 and worse.significant and worse.mean_diff < 0
    # B loses 3.5%: within the 5% margin, outside the 2% one
    between = paired_test(_per_query(a), _per_query(0.965 * a + rng.normal(0, 0.01, 300)))
    assert between.at(0.05).non_inferior and not between.at(0.02).non_inferior


def test_paired_test_edge_cases():
    a = {"1": 0.25, "2": 0.5, "3": 0.75}  # exact binary fractions: differences below are exactly equal
    identical = paired_test(a, dict(a))
    assert math.isnan(identical.t) and identical.p == 1.0 and not identical.significant
    assert identical.at(0.02).non_inferior  # d_i = 0.02 * a_i > 0 with spread: t > 0
    shifted = paired_test(a, {q: v + 0.125 for q, v in a.items()})  # constant difference: the t-test's limit
    assert shifted.t == math.inf and shifted.p == 0.0
    single = paired_test({"1": 0.5}, {"1": 0.6})
    assert math.isnan(single.p) and not single.at(0.05).non_inferior
    assert single.to_dict()["p"] is None  # JSON-safe
    with pytest.raises(EvaluationError, match="same queries"):
        paired_test(a, {"1": 0.2})
    with pytest.raises(EvaluationError, match="margin"):
        paired_test(a, a, margins=(1.5,))
    with pytest.raises(KeyError):
        identical.at(0.1)


def test_the_interval_of_the_difference_equals_scipys():
    rng = np.random.default_rng(2)
    a = rng.uniform(0.0, 1.0, 40)
    b = np.clip(a + rng.normal(0.02, 0.1, 40), 0, 1)
    cmp = paired_test(_per_query(a), _per_query(b))
    ref = stats.ttest_rel(b, a).confidence_interval(0.95)
    assert (cmp.ci_low, cmp.ci_high) == pytest.approx((ref.low, ref.high))
    assert (cmp.ci_low > 0) == (cmp.p < 0.05 and cmp.mean_diff > 0)  # the interval and the test agree
    wide = paired_test(_per_query(a), _per_query(b), alpha=0.01)
    assert wide.ci_low < cmp.ci_low < cmp.ci_high < wide.ci_high


def test_detectable_difference_and_queries_needed_agree_with_the_textbook_and_a_simulation():
    # Cohen's d = 0.5 at alpha 0.05, two-sided, power 0.8: 34 pairs (G*Power and every power table)
    assert queries_needed(0.05, 0.1) == 34 and queries_needed(-0.05, 0.1) == 34
    assert detectable_difference(0.1, 34) <= 0.05 < detectable_difference(0.1, 33)
    # large samples: the normal approximation (z_0.975 + z_0.8) * sd / sqrt(n)
    assert detectable_difference(0.2, 5000) == pytest.approx(2.8016 * 0.2 / math.sqrt(5000), rel=1e-3)
    # at the detectable difference the t-test rejects 80 % of simulated samples (4,000 of them: +- 0.02 at 3 SD)
    rng = np.random.default_rng(3)
    n, sd = 25, 0.15
    d = detectable_difference(sd, n)
    samples = rng.normal(d, sd, (4000, n))
    rejected = stats.ttest_1samp(samples, 0.0, axis=1).pvalue < 0.05
    assert rejected.mean() == pytest.approx(0.8, abs=0.02)
    assert queries_needed(0.0, 0.1) is None and queries_needed(1e-6, 1.0, most=1000) is None
    assert math.isnan(detectable_difference(0.1, 1)) and detectable_difference(0.0, 10) == 0.0
    assert queries_needed(0.01, 0.0) == 2  # no spread: two queries tell


def test_a_comparison_says_what_it_could_have_detected():
    rng = np.random.default_rng(4)
    a = rng.uniform(0.2, 0.9, 300)
    b = a + rng.normal(0.0, 0.05, 300)
    cmp = paired_test(_per_query(a), _per_query(b))
    assert cmp.detectable == pytest.approx(detectable_difference(float(np.std(b - a, ddof=1)), 300))
    few = paired_test(_per_query(a[:30]), _per_query(b[:30]))
    assert few.detectable > 2.5 * cmp.detectable  # ten times fewer queries: about sqrt(10) times coarser
    single = paired_test({"1": 0.5}, {"1": 0.6})
    assert math.isnan(single.ci_low) and math.isnan(single.detectable)
    assert single.to_dict()["ci_low"] is None and single.to_dict()["detectable"] is None


def test_compare_runs_counts_a_query_missing_from_one_run_as_zero():
    qrels = {"1": {"a": 1}, "2": {"b": 1}, "3": {"c": 1}}
    run_a = {"1": {"a": 1.0}, "2": {"b": 1.0}, "3": {"x": 1.0, "c": 0.5}}
    run_b = {"1": {"a": 1.0}, "3": {"c": 1.0}}
    cmp = compare(run_a, run_b, qrels, metric="MRR@10")
    assert cmp.metric == "MRR@10" and cmp.qids == ("1", "2", "3")
    assert cmp.a == (1.0, 1.0, 0.5) and cmp.b == (1.0, 0.0, 1.0)
    assert cmp.diffs == {"1": 0.0, "2": -1.0, "3": 0.5}
    data = json.loads(json.dumps(cmp.to_dict()))
    assert data["per_query"]["2"] == {"a": 1.0, "b": 0.0, "diff": -1.0}
    assert [t["margin"] for t in data["non_inferiority"]] == [0.02, 0.05]


# ----------------------------------------------------------------------------------------------------- CLI

runner = CliRunner()
_ENV = ("RUN", "QRELS", "QRELS_SPLIT", "COMPARE", "METRICS", "MARGINS", "ALPHA", "JSON")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in _ENV:
        monkeypatch.delenv(f"AHEADRANK_{name}", raising=False)


@pytest.fixture
def files(tmp_path):
    """TREC qrels for qA/qB, the hand-computed run as A, and a perfect run as B."""
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("".join(f"{q} 0 {d} {g}\n" for q, j in QRELS.items() for d, g in j.items()))
    write_run(tmp_path / "a.trec", RUN)
    write_run(tmp_path / "b.trec", {q: {d: float(g) for d, g in j.items()} for q, j in QRELS.items()})
    return tmp_path


def test_cli_prints_the_measures_of_one_run(files):
    result = runner.invoke(
        app, ["evaluate", "--run", str(files / "a.trec"), "--qrels", str(files / "qrels.txt")]
    )
    assert result.exit_code == 0, result.output
    for name in ("nDCG@10", "MRR@10", "R@100", "MAP", "P@10"):
        assert name in result.stdout
    assert f"{41 / 72:.4f}" in result.stdout and "0.7500" in result.stdout and "0.8333" in result.stdout
    assert "2 queries evaluated, 0 missing from the run" in result.stdout


def test_cli_warns_when_the_qrels_judge_nothing_the_run_ranks(files):
    """Qrels of another collection whose query ids happen to match the run's (numbered queries): every run query
    counts as retrieved and scores 0, which used to be all it said. The judged share of the top 10 is printed, and
    a warning when it is 0."""
    result = runner.invoke(
        app, ["evaluate", "--run", str(files / "a.trec"), "--qrels", str(files / "qrels.txt")]
    )
    assert "judged@10" in result.stdout and "warning" not in result.stdout
    other = files / "other-qrels.txt"
    other.write_text("".join(f"{q} 0 other-{d} 1\n" for q, j in QRELS.items() for d in j))
    result = runner.invoke(app, ["evaluate", "--run", str(files / "a.trec"), "--qrels", str(other)])
    assert result.exit_code == 0, result.output
    flat = " ".join(result.stdout.split())
    assert (
        "judged@10 0.0%" in flat
        and "warning: no document in the run's top 10 of its 2 judged queries" in flat
    )


def test_cli_compare_with_json_and_env_vars(files, monkeypatch):
    monkeypatch.setenv("AHEADRANK_RUN", str(files / "a.trec"))
    monkeypatch.setenv("AHEADRANK_QRELS", str(files / "qrels.txt"))
    monkeypatch.setenv("AHEADRANK_COMPARE", str(files / "b.trec"))
    monkeypatch.setenv("AHEADRANK_METRICS", "nDCG@10, map")
    monkeypatch.setenv("AHEADRANK_JSON_OUT", str(files / "out" / "eval.json"))
    result = runner.invoke(app, ["evaluate", "--margins", "2%,5%"])
    assert result.exit_code == 0, result.output
    assert "NI 2%" in result.stdout and "NI 5%" in result.stdout and "t-test p" in result.stdout
    assert "map" in result.stdout and "R@100" not in result.stdout
    data = json.loads((files / "out" / "eval.json").read_text())
    assert data["metrics"]["map"] == pytest.approx(41 / 72)
    assert data["per_query"]["nDCG@10"]["qA"] == pytest.approx(HAND["nDCG@10"]["qA"])
    assert data["compare"]["metrics"] == {"nDCG@10": 1.0, "map": 1.0}
    paired = data["compare"]["paired"]["map"]
    assert paired["mean_a"] == pytest.approx(41 / 72) and paired["mean_b"] == 1.0 and paired["n"] == 2
    assert [t["margin"] for t in paired["non_inferiority"]] == [0.02, 0.05]
    a = np.array([5 / 9, 7 / 12])
    assert paired["p"] == pytest.approx(stats.ttest_rel(np.ones(2), a).pvalue)
    ci = stats.ttest_rel(np.ones(2), a).confidence_interval(0.95)
    assert (paired["ci_low"], paired["ci_high"]) == pytest.approx((ci.low, ci.high))
    assert paired["detectable"] > 0 and "95% CI" in result.stdout and "detects" in result.stdout


def test_cli_reads_beir_qrels_tsv_and_directories(files):
    beir = files / "beir"
    (beir / "qrels").mkdir(parents=True)
    tsv = "query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t{g}\n" for q, j in QRELS.items() for d, g in j.items()
    )
    (beir / "qrels" / "dev.tsv").write_text(tsv)
    out = files / "e.json"
    for qrels_args in (
        ["--qrels", str(beir / "qrels" / "dev.tsv")],
        ["--qrels", str(beir), "--split", "dev"],
        ["--qrels", str(beir / "qrels"), "--split", "dev"],  # its qrels/ folder itself
    ):
        result = runner.invoke(
            app, ["evaluate", "--run", str(files / "a.trec"), *qrels_args, "--json", str(out)]
        )
        assert result.exit_code == 0, result.output
        assert json.loads(out.read_text())["metrics"]["MRR@10"] == pytest.approx(0.75)
    run = (files / "a.trec").read_bytes()
    for onto in (files / "a.trec", beir / "qrels" / "dev.tsv"):  # --json never overwrites an input
        args = [
            "evaluate",
            "--run",
            str(files / "a.trec"),
            "--qrels",
            str(beir),
            "--split",
            "dev",
            "--json",
            str(onto),
        ]
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and "is one of the inputs" in result.output
    assert (files / "a.trec").read_bytes() == run and (beir / "qrels" / "dev.tsv").read_text() == tsv


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--metrics", "bleu"], "error: unknown metric 'bleu'"),
        (["--compare", "{tmp}/b.trec", "--margins", "two"], "error: --margins 'two'"),
        (["--compare", "{tmp}/b.trec", "--alpha", "2"], "error: alpha must be in (0, 1)"),
        (["--compare", "{tmp}/absent.trec"], "error: cannot read run file"),
    ],
)
def test_cli_bad_options_are_clean_errors(files, extra, message):
    args = ["evaluate", "--run", str(files / "a.trec"), "--qrels", str(files / "qrels.txt")]
    result = runner.invoke(app, args + [e.format(tmp=files) for e in extra])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output


def test_cli_malformed_run_and_mismatched_qrels(files):
    bad = files / "bad.trec"
    bad.write_text("qA Q0 a1 1 0.9 t\nqA Q0 a2 0.8 t\n")
    result = runner.invoke(app, ["evaluate", "--run", str(bad), "--qrels", str(files / "qrels.txt")])
    assert result.exit_code == 2 and f"error: {bad}:2: 5 columns, expected 6" in result.stderr
    other = files / "other.trec"
    write_run(other, {"zz": {"a1": 1.0}})
    result = runner.invoke(app, ["evaluate", "--run", str(other), "--qrels", str(files / "qrels.txt")])
    assert result.exit_code == 2 and "has no query with judgements" in result.stderr
    result = runner.invoke(
        app, ["evaluate", "--run", str(files / "a.trec"), "--qrels", str(files / "a.trec")]
    )
    assert result.exit_code == 2 and "error: " in result.stderr and "Traceback" not in result.output


def test_evaluate_is_registered_in_the_console_script():
    from aheadrank.cli import COMMAND_MODULES

    assert "aheadrank.cli.evaluate" in COMMAND_MODULES
    assert "evaluate" in {c.name for c in app.registered_commands}


# --------------------------------------------------------------------------------------------- real data

SCIFACT_QRELS = Path("/work/shared/data/scifact/qrels/test.tsv")


@pytest.mark.skipif(not SCIFACT_QRELS.is_file(), reason="SciFact test qrels not present")
def test_perfect_scifact_run_scores_one(tmp_path):
    from aheadrank.indexer.topics import read_qrels

    qrels = read_qrels(SCIFACT_QRELS)
    run = {q: {d: float(g) for d, g in judged.items()} for q, judged in qrels.items()}
    path = tmp_path / "perfect.trec"
    write_run(path, run)
    means = evaluate(read_run(path), qrels)
    assert len(per_query(run, qrels)["MAP"]) == len(qrels) == 300
    assert means["nDCG@10"] == pytest.approx(1.0) and means["MAP"] == pytest.approx(1.0)
    assert means["MRR@10"] == pytest.approx(1.0) and means["R@100"] == pytest.approx(1.0)
