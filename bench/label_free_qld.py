"""A second lexical prior, chosen on other collections: query likelihood with Dirichlet smoothing beside BM25.

Every label-free signal the served score has comes from BM25 and the base model (the bi-encoder is the base model, the
rankers' label-free starts its weights). Query likelihood (Zhai & Lafferty 2001, Dirichlet smoothing) ranks by
another model of the same postings: it rewards a document's share of the query's words against the collection's,
where BM25 saturates term frequency and normalises by length. The Lucene index a build makes answers it
(Anserini's ``set_qld``); this probe measures whether it earns a place in the served score.

- ``none`` (the build's): the served score as built;
- ``qld``: the candidates' query-likelihood scores (mu = 1000, Anserini's default, fixed before the run) as a fifth
  feature, z-scored over the candidates as every feature is, taking half of BM25's weight (the lexical share stays
  what it is). A candidate outside query likelihood's top 1,000 gets the lowest score found for the query.

The rule, fixed in the commit that added this file before any of it was run, is the window probes'
(``label_free_window_size.py``): each collection's option chosen on the other collections' mean served nDCG@10 over
the three rankers (``none`` unless ``qld`` beats it by more than rounding); the product adds the prior only if the
choice over all collections is ``qld`` and no collection serves worse with its held-out option than with ``none``.
Beside it, deciding nothing: query likelihood alone and BM25 alone over the same candidates.

Nothing is built or trained; the neural scores come from committed label-free builds' pure runs.

    .venv/bin/python bench/label_free_qld.py --collections cranfield scifact vaswani \\
        --neural bench/results/label-free/maxp-cranfield-vaswani:mores-2ib-s2 \\
                 bench/results/label-free/maxp-cranfield-vaswani:prettr-l5-e128 \\
                 bench/results/label-free/maxp-cranfield-vaswani:tk-6l-base \\
        --runs-of scifact=bench/results/label-free/maxp-scifact

Writes ``--out`` (``bench/results/label-free/qld``): ``label_free_qld.{json,md}`` and
``<collection>/runs/VARIANT+priors+window-heldout.trec.zst`` (the served run with the held-out option).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from label_free_window_size import WindowProbe  # noqa: E402
from label_free_window_size import main as probe_main  # noqa: E402

OPTIONS = ("none", "qld")
CURRENT = "none"
MU = 1000.0  # Anserini's default Dirichlet prior
DEPTH = 1000  # query likelihood's hits read to score BM25's candidates


def lexical_probe(bench: str, option: str) -> WindowProbe:
    """The probe of a second lexical prior: options ``none`` (the build's, kept on ties) and ``option``."""
    return WindowProbe(
        bench, "lexical", ("none", option), "none", lambda o: (2, "max"), lambda o: f"lexical {o}"
    )


QLD_PROBE = lexical_probe("label_free_qld", "qld")


def with_qld(weights: dict[str, float], feature: str = "qld", share: float = 0.5) -> dict[str, float]:
    """The served weights with the second lexical prior (query likelihood) taking ``share`` of BM25's weight (half;
    all of it puts the prior in BM25's place)."""
    moved = weights["bm25"] * share
    return {**weights, "bm25": weights["bm25"] - moved, feature: moved}


def candidate_scores(hits: list[tuple[str, float]], docids: list[str]) -> np.ndarray:
    """The candidates' scores from a ranked list; a candidate it lacks gets its lowest score (0 for an empty list)."""
    got = dict(hits)
    floor = min(got.values()) if got else 0.0
    return np.array([got.get(d, floor) for d in docids], dtype=np.float64)


def qld_scores(collection: Path, workdir: Path, queries: dict[str, str], progress: bool) -> dict[str, list]:
    """{qid: query likelihood's top :data:`DEPTH` (docid, score)} from the collection's Lucene index."""
    from aheadrank.indexer.bm25 import Bm25Searcher
    from benchkit import Bm25Hits

    searcher = Bm25Searcher(Bm25Hits(collection, workdir, progress).index)
    try:
        searcher._searcher.set_qld(MU)
        qids = sorted(queries)
        hits = searcher.batch_search([queries[q] for q in qids], k=DEPTH, threads=2)
        return dict(zip(qids, hits, strict=True))
    finally:
        searcher.close()


@dataclass(frozen=True)
class LexicalPrior:
    """A second lexical prior: its feature name, what the tables call it, its scorer ``scores(collection, workdir,
    {qid: query}, progress) -> {qid: [(docid, score)], best first}``, the share of BM25's weight it takes and the
    probe's name for the option (default: the feature's)."""

    feature: str
    label: str
    scores: Callable[[Path, Path, dict[str, str], bool], dict[str, list]]
    share: float = 0.5
    option: str | None = None

    @property
    def name(self) -> str:
        return self.option or self.feature


QLD = LexicalPrior("qld", "query likelihood", qld_scores)


def collection_rows(args, name: str, probe: WindowProbe = QLD_PROBE, prior: LexicalPrior = QLD) -> dict:
    """A collection's baselines and, for each option (``none``, the prior's), each variant's served run; under
    ``checks`` the prior alone and BM25 alone (deciding nothing)."""
    from benchkit import eval_topics
    from label_free import label_free_baselines, runs_from
    from label_free_passages import candidates, multi_window, with_neural
    from label_free_prf import served_weights
    from label_free_window_size import probe_rows

    from aheadrank.build import MULTI_WINDOW
    from aheadrank.evaluation import evaluate
    from aheadrank.priors import QueryFeatures

    c = candidates(args, name)
    gate = multi_window(c.collection, args.sentences) >= MULTI_WINDOW
    queries, _ = eval_topics(c.collection, getattr(args, "split", "test"), None)
    ql = prior.scores(c.collection, args.workdir, {q: queries[q] for q in c.qids}, args.progress)
    key = prior.feature
    base = c.base()
    base_runs = label_free_baselines(base)
    with_ql = [
        (q, QueryFeatures(f.docids, {**f.features, key: candidate_scores(ql[q], f.docids)}, f.qrels))
        for q, f in base
    ]
    variants = [v for _, v in args.neural]
    runs = {}
    for folder, variant in args.neural:
        neural = c.neural(args.runs_of.get(name, folder), variant)
        w = served_weights(variant, gate)
        runs[(variant, "none")] = runs_from(with_neural(base, neural), w)
        runs[(variant, prior.name)] = runs_from(with_neural(with_ql, neural), with_qld(w, key, prior.share))
    alone = {k: runs_from(with_ql, {k: 1.0}) for k in ("bm25", key)}
    checks = {k: round(evaluate(r, c.qrels, ("nDCG@10",))["nDCG@10"], 4) for k, r in alone.items()}
    gates = dict.fromkeys(probe.options, gate)
    rows = probe_rows(
        c.qrels, base_runs, runs, variants, probe.options, gates, dict.fromkeys(probe.options, 0)
    )
    return rows | {"checks": checks}


def alone_lines(rows: dict, prior: LexicalPrior = QLD) -> list[str]:
    """The table line of BM25 and the prior each alone over BM25's top 100."""
    return [
        "Over BM25's top 100, each alone (nDCG@10; deciding nothing): "
        + "; ".join(
            f"{n} BM25 {r['checks']['bm25']:.4f}, {prior.label} {r['checks'][prior.feature]:.4f}"
            for n, r in rows.items()
        )
    ]


def alone_table(args, rows: dict) -> tuple[list[str], dict]:
    fields = {"alone": {n: r["checks"] for n, r in rows.items()}, "mu": MU, "qld_depth": DEPTH}
    return alone_lines(rows), fields


def main(argv=None) -> int:
    return probe_main(argv, QLD_PROBE, __doc__, "qld", collection_rows, alone_table)


if __name__ == "__main__":
    raise SystemExit(main())
