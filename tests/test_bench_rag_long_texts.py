"""bench/rag_long_texts.py on a tiny label-free build of a judged collection: every cell and aggregation is
measured, a long text sent ad hoc scores as the store's, and the per-passage way is computed from the same
passages' neural scores; bench/ad_hoc_windows_cost.py times the same build's cold requests both ways."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import ad_hoc_windows_cost  # noqa: E402
import rag_long_texts  # noqa: E402

from aheadrank.build import BuildPlan, build  # noqa: E402

pytestmark = pytest.mark.slow  # Java (the BM25 stage)

WORDS = (
    "wing lift drag shock flow boundary layer heat plate cone pressure supersonic laminar nozzle jet".split()
)


def test_the_bench_measures_every_cell_on_a_tiny_build(tmp_path, tiny_base):
    rng = random.Random(3)
    coll = tmp_path / "coll"
    (coll / "qrels").mkdir(parents=True)
    docs = []
    for i in range(30):  # every other document longer than the window (128 pieces)
        sentences = [" ".join(rng.choices(WORDS, k=10)) for _ in range(3 if i % 2 else 20)]
        docs.append({"_id": f"d{i}", "title": "", "text": ". ".join(sentences) + "."})
    (coll / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    queries = {f"q{i}": " ".join(rng.choices(WORDS, k=4)) for i in range(3)}
    (coll / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items())
    )
    judged = [(q, f"d{2 * k + j}") for k, q in enumerate(queries) for j in (0, 1)]
    (coll / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, d in judged)
    )
    out = tmp_path / "b"
    plan = BuildPlan(
        str(coll),
        str(out),
        ranker="tk-1l",
        steps=2,
        max_queries=20,
        base=str(tiny_base),
        progress=False,
        labels="none",
    )
    build(plan, echo=lambda _: None)
    result = tmp_path / "r.json"
    args = [
        "--build",
        str(out),
        "--collection",
        str(coll),
        "--depth",
        "12",
        "--threads",
        "1",
        "--out",
        str(result),
    ]
    assert rag_long_texts.main(args) == 0
    record = json.loads(result.read_text())
    rows = {(r["cell"], r["aggregation"]): r for r in record["rows"]}
    cells = ("stored", "ad-hoc", "ad-hoc/passage", "buried", "buried/passage")
    assert set(rows) == {(c, a) for c in cells for a in rag_long_texts.AGGREGATIONS}
    assert record["queries"] == 3 and 0 < rows[("buried", "maxp")]["relevant_texts"] <= len(judged)
    for a in rag_long_texts.AGGREGATIONS:  # the docid's way, ad hoc or stored: the same ranking here
        assert rows[("ad-hoc", a)]["per_query"] == pytest.approx(rows[("stored", a)]["per_query"], abs=1e-9)
        assert "vs_per_passage" in rows[("ad-hoc", a)] and "vs_per_passage" in rows[("buried", a)]
        assert "vs_per_passage" not in rows[("stored", a)]
    # what the window prior costs: both cells timed on texts never sent before
    cost = tmp_path / "cost.json"
    args = [
        "--build",
        str(out),
        "--collection",
        str(coll),
        "--texts",
        "5",
        "--rounds",
        "2",
        "--out",
        str(cost),
    ]
    assert ad_hoc_windows_cost.main([*args, "--threads", "1"]) == 0
    record = json.loads(cost.read_text())
    assert [r["cell"] for r in record["rows"]] == ["window", "no window"]
    assert record["window_entries"] == 2 * 5  # the window cell's texts, each cut and embedded once
    assert (
        all(len(r["seconds"]) == 2 and min(r["seconds"]) > 0 for r in record["rows"]) and record["ratio"] > 0
    )
    with pytest.raises(SystemExit, match="30 documents, 40 needed"):
        ad_hoc_windows_cost.main([*args[:4], "--texts", "10", "--rounds", "2", "--out", str(cost)])
