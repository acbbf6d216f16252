"""The label-free served score with its cosines taken about the corpus mean (mean-centring).

The cosines a label-free MORES 2×IB S2 build serves — its start's similarity residual ``cos(q̄, d̄)`` in the last
block's value space, the bi-encoder's cosine and its best 2-sentence window's — are taken between vectors that
share a large common component: the value map's bias and its near-singular weights (condition number about 3,000,
``label_free_sim_space.py``), the bi-encoder's anisotropy. Centring removes it: ``cos(q - mu, d - mu)`` with ``mu``
the mean of the collection's document vectors, a statistic of the corpus that needs no query and no judgment
(BERT-whitening's first step, Su et al. 2021, without the rotation). The options:

- ``none``: the build as it serves today (``maxp-scifact/``, ``maxp-cranfield-vaswani/``);
- ``neural``: the residual centred, ``mu`` the mean of the value vectors of every passage of every document of
  the collection (the build's passages: 128 word pieces, a quarter overlap); the pure MORES score changes;
- ``all``: that, and the bi-encoder's cosine and its window's centred on the mean of every document's bi-encoder
  vector (title and text, as the dense field embeds it);
- ``neural-whiten``, ``all-whiten``: the same vectors whitened instead of centred, ``(v - mu) W`` with ``W =
  C^(-1/2)`` (ZCA, every dimension kept) and ``C`` the covariance of the same document vectors. Whitened, the value
  space and the states' space are the same up to a rotation (the value map is linear), so this also settles which
  space the residual should be in without choosing one.

Served with the build's label-free weights (``aheadrank.build.label_free_weights``, the window prior where at least
half the documents are two or more windows), over each test query's BM25 top 100, long documents by MaxP
(``--aggregation``, the build's ``maxp``). The baselines (BM25, the bi-encoder, RRF k = 60, the equal-weight fusion)
are a user's, uncentred; ``bi-encoder-centre`` and ``bi-encoder-whiten`` are printed beside them and choose nothing.

The rule, fixed in the commit that added this file before any of it was run:

- for a target collection T, the option with the best mean served nDCG@10 over the other collections, ``none``
  unless another beats it by more than ``TIE`` (``label_free_window_size.choose_option``); T's served and pure
  scores at its held-out option are compared (paired t-test) with T's better fusion, with BM25 (pure) and with
  ``none``;
- the product centres only if the same choice over all collections picks an option other than ``none`` and no
  collection serves worse at its held-out option than at ``none`` (the veto of ``label_free_sim_space.py``).
  Adopting it means a per-store mean (of the stored values and of the dense field) recorded at store time;
- ``none`` must give the committed build's pure and served nDCG@10 (``--check C=DIR``: the runs
  ``DIR/C/runs/mores-2ib-s2{,+priors}.trec.zst``, within 0.002), or the probe's scores are not the build's.

Nothing is built or trained: every passage is encoded by the untrained start itself (float32, not the store's
float16), the BM25, bi-encoder and window features come from ``bench/label_free_passages.py``'s cache.

    .venv/bin/python bench/label_free_center.py --collections cranfield vaswani scifact \\
        --check scifact=bench/results/label-free/maxp-scifact \\
                cranfield=bench/results/label-free/maxp-cranfield-vaswani \\
                vaswani=bench/results/label-free/maxp-cranfield-vaswani \\
        --out bench/results/label-free/center

Writes ``--out``: ``label_free_center.{json,md}`` and ``<collection>/runs/mores-2ib-s2-<option>{,+priors}.trec.zst``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
log = logging.getLogger("bench.label_free_center")
VARIANT = "mores-2ib-s2"


@dataclass(frozen=True)
class Option:
    """How an option scores: the map of the residual's vectors and of the bi-encoder's (None, ``centre``,
    ``whiten``), the residual's query (``blocks``: through the blocks' own layers, the build's; ``encoder``: the
    query encoder's states, the documents' depth) and its space (``values``, the build's, or ``states``)."""

    neural: str | None = None
    bi: str | None = None
    query: str = "blocks"
    space: str = "values"

    def pure(self) -> tuple:
        """What decides the pure score: everything but the bi-encoder's map."""
        return (self.neural, self.query, self.space)


OPTIONS = {
    "none": Option(),
    "neural": Option("centre"),
    "all": Option("centre", "centre"),
    "neural-whiten": Option("whiten"),
    "all-whiten": Option("whiten", "whiten"),
}


def pure_of(options: dict[str, Option]) -> dict[str, str]:
    """Which pure score each option serves: that of the option with the same residual and no bi-encoder map."""
    return {
        o: next(p for p, x in options.items() if x.pure() == how.pure() and x.bi is None)
        for o, how in options.items()
    }


RUN_OF = pure_of(OPTIONS)


def parse_args(argv=None, doc: str | None = None, out: Path | None = None) -> argparse.Namespace:
    from aheadrank.passages import AGGREGATIONS

    ap = argparse.ArgumentParser(
        description=doc or __doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--collections", nargs="+", default=["cranfield", "vaswani", "scifact"])
    ap.add_argument("--aggregation", choices=AGGREGATIONS, default="maxp")
    ap.add_argument(
        "--check",
        nargs="*",
        default=[],
        metavar="C=DIR",
        help="committed label-free build runs to match, per collection",
    )
    ap.add_argument("--base", default=None)
    ap.add_argument("--workdir", type=Path, default=ROOT / "work" / "label-free")
    ap.add_argument("--out", type=Path, default=out or ROOT / "bench" / "results" / "label-free" / "center")
    ap.add_argument("--progress", action="store_true")
    args = ap.parse_args(argv)
    if len(args.collections) < 2:
        ap.error("--collections: at least two (each is chosen on the others)")
    try:
        args.check = {c: Path(d) for c, d in (x.split("=", 1) for x in args.check)}
    except ValueError:
        ap.error("--check: COLLECTION=DIR")
    args.sentences = 2  # the window prior's windows (aheadrank.build.WINDOW_SENTENCES)
    return args


def centred(v: np.ndarray, mu: np.ndarray) -> np.ndarray:
    """``v - mu`` (rows or one vector), float64."""
    return np.asarray(v, dtype=np.float64) - mu


def vector_map(how: str | None, mu: np.ndarray, cov: np.ndarray):
    """The map of an option's vectors: none, ``v - mu`` or ``(v - mu) C^(-1/2)`` (ZCA; eigenvalues floored at
    1e-12 of the largest, so a rank-deficient covariance stays finite)."""
    if how is None:
        return lambda v: np.asarray(v, dtype=np.float64)
    if how == "centre":
        return lambda v: centred(v, mu)
    if how != "whiten":
        raise ValueError(f"unknown map {how!r}")
    lam, u = np.linalg.eigh(cov)
    lam = np.maximum(lam, lam.max() * 1e-12)
    w = (u / np.sqrt(lam)) @ u.T
    return lambda v: centred(v, mu) @ w


def moments(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The mean and covariance of the rows, float64."""
    x = np.asarray(vectors, dtype=np.float64)
    return x.mean(axis=0), np.cov(x, rowvar=False)


def corpus_docids(collection: Path) -> list[str]:
    from aheadrank.indexer.collections import Collection

    return sorted(d.docid for d in Collection(collection))


def bi_encoder_vectors(args, c, docids: list[str]) -> np.ndarray:
    """Every document's bi-encoder vector (title and text, as the dense field embeds it): the candidates' from
    ``c``, the rest embedded here and cached."""
    from aheadrank.indexer.collections import Collection, join_title_text
    from aheadrank.rankers.dense import dense_encoder
    from benchkit import digest

    enc = dense_encoder(args.base)
    rest = [d for d in docids if d not in c.docs]
    path = args.workdir / f"center-dense-{c.collection.name}-{digest([rest, enc.fingerprint])}.npz"
    if path.exists():
        vecs = np.load(path)["docs"]
    elif rest:
        want = set(rest)
        texts = {d: join_title_text(t, b) for d, t, b in Collection(c.collection).titled() if d in want}
        t0 = time.perf_counter()
        vecs = enc.encode_documents([texts[d] for d in rest])
        log.info(
            "%s: %d more documents embedded in %.0f s", c.collection.name, len(rest), time.perf_counter() - t0
        )
        args.workdir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, docs=vecs)
        tmp.replace(path)
    else:
        vecs = np.zeros((0, len(next(iter(c.docs.values())))), dtype=np.float32)
    return np.concatenate([np.asarray(list(c.docs.values())), np.asarray(vecs)]).astype(np.float64)


def mapped_bi_encoder(c, vmap, window: bool) -> dict[str, dict[str, np.ndarray]]:
    """{qid: its dense and window features} with every bi-encoder vector mapped by ``vmap`` (the candidates' and
    the windows' mapped once)."""
    from label_free_sim_space import cosines

    docs = {d: vmap(v) for d, v in c.docs.items()}
    windows = vmap(c.passages) if window else None
    out = {}
    for q in c.qids:
        ds = c.docids(q)
        qv = vmap(c.qv[q])
        out[q] = {"dense": cosines(qv, np.stack([docs[d] for d in ds]))}
        if window:
            sims = cosines(qv, windows)
            out[q]["window"] = np.array([np.max(sims[c.rows_of[c.row_of[d]]]) for d in ds], dtype=np.float64)
    return out


def collection_rows(
    args, name: str, ranker, options: dict[str, Option] = OPTIONS, current: str = "none"
) -> dict:
    """A collection's baselines and, for each option, the pure run (where the option is its own ``pure_of``) and the
    served one; ``current`` (the build's) checked against ``args.check``."""
    from benchkit import eval_topics
    from label_free import label_free_baselines, runs_from
    from label_free_passages import candidates, multi_window, with_neural
    from label_free_prf import served_weights
    from label_free_sim_space import cosines, encoded_passages, query_vectors

    from aheadrank.build import MULTI_WINDOW
    from aheadrank.evaluation import evaluate, read_run
    from aheadrank.passages import aggregate
    from aheadrank.priors import QueryFeatures

    c = candidates(args, name)
    queries, _ = eval_topics(c.collection, "test", None)
    gate = multi_window(c.collection, args.sentences) >= MULTI_WINDOW
    docids = corpus_docids(c.collection)
    d_states, d_values, owner = encoded_passages(args, c.collection, ranker, docids)
    docs = {"values": d_values, "states": d_states}
    texts = [queries[q] for q in c.qids]
    qvec = {}  # (query, space) -> [Q, n]
    for how in sorted({x.query for x in options.values()}):
        q_states, q_values = query_vectors(ranker, texts, through_blocks=how == "blocks")
        qvec[how, "values"], qvec[how, "states"] = q_values, q_states
    run_of = pure_of(options)
    index = {d: i for i, d in enumerate(docids)}
    rows_of: list[list[int]] = [[] for _ in docids]
    for p, i in enumerate(owner.tolist()):
        rows_of[i].append(p)
    base = c.base()
    pure = sorted(set(run_of.values()))
    maps = {o: vector_map(options[o].neural, *moments(docs[options[o].space])) for o in pure}
    neural: dict[str, dict[str, np.ndarray]] = {o: {} for o in pure}
    for k, (q, f) in enumerate(base):
        rows = [r for d in f.docids for r in rows_of[index[d]]]
        own = [j for j, d in enumerate(f.docids) for _ in rows_of[index[d]]]
        for o in pure:
            x = options[o]
            sims = cosines(maps[o](qvec[x.query, x.space][k]), maps[o](docs[x.space][rows]))
            neural[o][q] = np.asarray(aggregate(sims.tolist(), own, len(f.docids), args.aggregation))
    feats = {None: base}
    bi_maps = sorted({x.bi for x in options.values() if x.bi})
    dense_moments = moments(bi_encoder_vectors(args, c, docids)) if bi_maps else None
    for how in bi_maps:
        mapped = mapped_bi_encoder(c, vector_map(how, *dense_moments), gate)
        feats[how] = [(q, QueryFeatures(f.docids, {**f.features, **mapped[q]}, f.qrels)) for q, f in base]
    runs = label_free_baselines(base)
    for how in sorted(h for h in feats if h):
        runs[f"bi-encoder-{how}"] = runs_from(feats[how], {"dense": 1.0})
    w = served_weights(VARIANT, gate)
    for option, x in options.items():
        scored = with_neural(feats[x.bi], neural[run_of[option]])
        if run_of[option] == option:
            runs[f"{VARIANT}-{option}"] = runs_from(scored, {"neural": 1.0})
        runs[f"{VARIANT}-{option}+priors"] = runs_from(scored, w)
    ndcg = {k: evaluate(r, c.qrels, ("nDCG@10",))["nDCG@10"] for k, r in runs.items()}
    check = None
    if name in args.check:
        check = {}
        for suffix in ("", "+priors"):
            source = args.check[name] / name / "runs" / f"{VARIANT}{suffix}.trec.zst"
            committed = evaluate(read_run(source), c.qrels, ("nDCG@10",))["nDCG@10"]
            got = ndcg[f"{VARIANT}-{current}{suffix}"]
            check[suffix or "pure"] = {
                "run": str(source),
                "ndcg10": round(committed, 4),
                current: round(got, 4),
            }
            if abs(committed - got) > 0.002:
                raise SystemExit(
                    f"{name}: the option {current} gives {got:.4f}, the committed build {committed:.4f} ({source}): "
                    "the probe's scores are not the build's"
                )
    served = {o: ndcg[f"{VARIANT}-{o}+priors"] for o in options}
    return {
        "qrels": c.qrels,
        "runs": runs,
        "ndcg": ndcg,
        "served": served,
        "gate": gate,
        "check": check,
        "extra": {"documents": len(docids), "passages": len(owner)},
    }


def main(argv=None) -> int:
    from label_free_sim_space import held_out_probe, start_probe

    args, rows = start_probe(argv, parse_args, collection_rows)
    baselines = ("bm25", "bi-encoder", "bi-encoder-centre", "bi-encoder-whiten", "rrf", "fusion-equal")
    return held_out_probe(
        args, argv, rows, tuple(OPTIONS), "none", "label_free_center", baselines=baselines, pure_of=RUN_OF
    )


if __name__ == "__main__":
    raise SystemExit(main())
