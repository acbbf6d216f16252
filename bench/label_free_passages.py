"""A stronger label-free feature: the bi-encoder's best passage. Each document (BM25's top 100 of each test query)
is cut into windows of ``--sentences`` consecutive sentences, title in front (``aheadrank.indexer.
pseudo_queries.sentence_passages``); the ``bi-encoder-passages`` score is the best window's cosine with the query. Measured
beside the label-free baselines of ``bench/label_free.py`` (BM25, the bi-encoder, RRF k = 60, the equal-weight
z-score fusion) and, from committed label-free builds' pure neural runs (``--neural DIR:VARIANT``, read from
``DIR/<collection>/runs/VARIANT.trec.zst``; nothing is trained here), the served score with and without it:

- ``fusion-passages``: BM25, the bi-encoder and its best passage, 1/3 each (z-scores per query);
- ``VARIANT+priors``: neural, BM25 and bi-encoder 1/3 each, recomputed from the pure run (the committed
  ``VARIANT+priors`` run's score is printed beside it as a check);
- ``VARIANT+priors+passages``: neural, BM25, bi-encoder and best passage, 1/4 each;
- ``VARIANT+priors+split``: neural and BM25 1/3 each, the bi-encoder's third split between the whole document and
  its best passage (1/6 each). Where a document is one window (Vaswani: no sentence breaks) the two bi-encoder
  features are equal and this is ``VARIANT+priors`` exactly.

- ``VARIANT+priors+window``: the window rule, written (with the code that applies it) before it was first run on
  the current label-free defaults: where at least half of the collection's documents are cut into two or more
  windows (``multi_window``, counted over the whole corpus from its texts), the best window joins the served
  score at the bi-encoder's weight: neural ``s`` (the kind's label-free share, ``aheadrank.build.
  LABEL_FREE_NEURAL_SHARE``: MORES 1/3, PreTTR and TK 1/6), BM25, bi-encoder and best window ``(1 - s)/2``
  each, normalised to sum 1 (MORES: 1/4 each, ``+priors+passages``); elsewhere (most documents one window,
  where the feature only repeats the bi-encoder and would double its weight) it is ``VARIANT+priors``. The
  gate was written after ``passages-stored-maxp/`` showed the 4-way fusion 0.018 below ``+priors`` on
  Vaswani, whose documents are all one window: that collection's result under the rule is not blind to its
  judgments (it is ``+priors``, the build's served score, unchanged).

``VARIANT+priors`` uses the kind's label-free weights (``aheadrank.build.label_free_weights``; before the window
rule, 1/3 each for every kind, which the folders measured then used). Every other weight and the window (2
sentences) were fixed before any of this was measured; no judgment chooses anything. Paired t-tests against
the better of RRF and the equal-weight fusion and against ``fusion-passages``.

    .venv/bin/python bench/label_free_passages.py --collections scifact cranfield vaswani \\
        --neural bench/results/label-free/positive-teacher:mores-2ib-s2 \\
                 bench/results/label-free/positive-teacher-rankers:prettr-l5-e128 \\
                 bench/results/label-free/positive-teacher-rankers:tk-2l \\
        --out bench/results/label-free/passages

The window rule on the current label-free defaults (the runs of ``bench/label_free.py``'s top-level folder)::

    .venv/bin/python bench/label_free_passages.py --collections scifact cranfield vaswani \\
        --neural bench/results/label-free:mores-2ib-s2 bench/results/label-free:prettr-l5-e128 \\
                 bench/results/label-free:tk-6l-base --out bench/results/label-free/window-rule

Writes ``--out``: ``label_free_passages.{json,md}`` and ``<collection>/runs/{bi-encoder-passages,fusion-passages,
VARIANT+priors+passages,VARIANT+priors+split,VARIANT+priors+window}.trec.zst``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
log = logging.getLogger("bench.label_free_passages")
DEPTH = 100
BASELINES = ("bm25", "bi-encoder", "bi-encoder-passages", "rrf", "fusion-equal", "fusion-passages")
FUSION_PASSAGES = {"bm25": 1 / 3, "dense": 1 / 3, "passage": 1 / 3}
SERVED_PASSAGES = {"neural": 0.25, "bm25": 0.25, "dense": 0.25, "passage": 0.25}
SERVED_SPLIT = {"neural": 1 / 3, "bm25": 1 / 3, "dense": 1 / 6, "passage": 1 / 6}


def window_weights(share: float) -> dict[str, float]:
    """The window rule's served weights: neural ``share``, BM25, bi-encoder and best window (1 - share)/2 each,
    normalised to sum 1 (what ``aheadrank build`` serves since: ``aheadrank.build.share_weights``)."""
    from aheadrank.build import share_weights

    w = share_weights(share, window=True)["neural+bm25+dense+window"]
    return {("passage" if f == "window" else f): v for f, v in w.items()}  # this bench's name for it


def multi_window(collection: Path, size: int) -> float:
    """The share of the collection's documents cut into two or more windows (``aheadrank.build.multi_window``)."""
    from aheadrank.build import multi_window as share

    return share(collection, size)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--collections", nargs="+", default=["scifact", "cranfield", "vaswani"])
    ap.add_argument("--neural", nargs="*", default=[], metavar="DIR:VARIANT")
    ap.add_argument("--sentences", type=int, default=2, help="sentences per passage window")
    ap.add_argument("--base", default=None)
    ap.add_argument("--workdir", type=Path, default=ROOT / "work" / "label-free")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "label-free" / "passages")
    ap.add_argument("--progress", action="store_true")
    args = ap.parse_args(argv)
    if args.sentences < 1:
        ap.error("--sentences must be at least 1")
    args.neural = neural_list(ap, args.neural, "; measure other folders in another --out")
    return args


def neural_list(ap: argparse.ArgumentParser, given: list[str], hint: str = "") -> list[tuple[Path, str]]:
    """``--neural DIR:VARIANT ...`` parsed, each VARIANT once (its runs are named for it), else an argparse error."""
    parsed = [parse_neural(n) for n in given]
    names = [v for _, v in parsed]
    if len(set(names)) != len(names):
        ap.error(f"--neural: each VARIANT once (its runs are named for it){hint}")
    return parsed


def parse_neural(given: str) -> tuple[Path, str]:
    folder, sep, variant = given.rpartition(":")
    if not sep or not folder or not variant:
        raise SystemExit(
            f"--neural {given!r}: expected DIR:VARIANT (e.g. bench/results/label-free/x:mores-2ib-s2)"
        )
    return Path(folder), variant


def neural_scores(run: dict, cands: dict[str, list], qids: list[str], source: Path) -> dict[str, np.ndarray]:
    """The pure run's scores in candidate order; a run over other candidates is an error, never a guess."""
    out = {}
    for q in qids:
        docs = [d for d, _ in cands[q]]
        got = run.get(q, {})
        if set(got) != set(docs):
            missing, extra = len(set(docs) - set(got)), len(set(got) - set(docs))
            raise SystemExit(
                f"{source}: query {q!r} ranks other candidates than BM25's top {DEPTH} "
                f"({missing} missing, {extra} not among them): not a run of this collection's test queries"
            )
        out[q] = np.array([got[d] for d in docs], dtype=np.float64)
    return out


def embeddings(collection: Path, docids: list[str], size: int, base, work: Path, progress: bool):
    """(whole-document vectors {docid: v}, passage vectors [P, n], owner of each passage), cached in ``work``."""
    from aheadrank.indexer.collections import Collection, join_title_text
    from aheadrank.indexer.pseudo_queries import sentence_passages
    from aheadrank.rankers.dense import dense_encoder
    from benchkit import digest

    from aheadrank.baselines import encode_in_chunks

    enc = dense_encoder(base)
    path = work / f"passages-{collection.name}-{digest([docids, size, enc.fingerprint])}.npz"
    if path.exists():
        z = np.load(path)
        return dict(zip(docids, z["docs"], strict=True)), z["passages"], z["owner"]
    want = set(docids)
    texts = {d: (t, b) for d, t, b in Collection(collection).titled() if d in want}
    flat, owner = [], []
    for i, d in enumerate(docids):
        ps = sentence_passages(*texts[d], size=size)
        flat.extend(ps)
        owner.extend([i] * len(ps))
    t0 = time.perf_counter()
    docs = enc.encode_documents([join_title_text(*texts[d]) for d in docids])
    passages = encode_in_chunks(enc, flat, progress, desc=f"{collection.name} passages")
    seconds = time.perf_counter() - t0
    log.info(
        "%s: %d documents, %d passages embedded in %.0f s (%.1f passages/s)",
        collection.name,
        len(docids),
        len(flat),
        seconds,
        (len(flat) + len(docids)) / seconds,
    )
    work.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, docs=docs, passages=passages, owner=np.asarray(owner))
    tmp.replace(path)
    return dict(zip(docids, docs, strict=True)), passages, np.asarray(owner)


@dataclass
class Candidates:
    """A collection's judged test queries, BM25's top ``DEPTH`` for each, and the bi-encoder's vectors of the
    queries, the candidates and their windows (``rows_of[row_of[docid]]``: the rows of ``passages`` a document
    is cut into)."""

    collection: Path
    qrels: dict
    cands: dict
    qids: list
    docs: dict
    passages: np.ndarray
    owner: np.ndarray
    row_of: dict
    rows_of: list
    qv: dict

    def docids(self, q: str) -> list[str]:
        """Query ``q``'s candidates, BM25's order."""
        return [d for d, _ in self.cands[q]]

    def features(
        self, q: str, pool: Callable[[np.ndarray], float] = np.max, window: str = "window"
    ) -> dict[str, np.ndarray]:
        """Query ``q``'s label-free features in candidate order: BM25's score (``bm25``), the bi-encoder's cosine
        (``dense``) and its windows' cosines pooled into one per document (``window``, by ``pool``: the best)."""
        ds = self.docids(q)
        sims = self.passages @ self.qv[q]
        return {
            "bm25": np.array([s for _, s in self.cands[q]], dtype=np.float64),
            "dense": np.array([self.docs[d] @ self.qv[q] for d in ds], dtype=np.float64),
            window: np.array([pool(sims[self.rows_of[self.row_of[d]]]) for d in ds], dtype=np.float64),
        }

    def base(self, pool: Callable[[np.ndarray], float] = np.max, window: str = "window") -> list:
        """(qid, QueryFeatures) of every query with :meth:`features` and its judgments."""
        from aheadrank.priors import QueryFeatures

        return [
            (q, QueryFeatures(self.docids(q), self.features(q, pool, window), self.qrels.get(q, {})))
            for q in self.qids
        ]

    def neural(self, folder: Path, variant: str) -> dict[str, np.ndarray]:
        """The pure run ``folder/<collection>/runs/VARIANT.trec.zst`` in candidate order (``--neural DIR:VARIANT``);
        a missing run or one over other candidates is an error."""
        from aheadrank.evaluation import read_run

        source = folder / self.collection.name / "runs" / f"{variant}.trec.zst"
        if not source.exists():
            raise SystemExit(f"--neural {folder}:{variant}: no {source}")
        return neural_scores(read_run(source), self.cands, self.qids, source)


def with_neural(base: list, neural: dict[str, np.ndarray]) -> list:
    """``base``'s (qid, QueryFeatures) with each query's ``neural`` scores (in candidate order) added."""
    from aheadrank.priors import QueryFeatures

    return [(q, QueryFeatures(f.docids, {**f.features, "neural": neural[q]}, f.qrels)) for q, f in base]


def candidates(args, name: str) -> Candidates:
    """:class:`Candidates` of ``args.data / name`` (``args``: data, workdir, sentences, base, progress)."""
    from aheadrank.rankers.dense import dense_encoder
    from benchkit import Bm25Hits, eval_topics

    collection = args.data / name
    queries, qrels = eval_topics(collection, getattr(args, "split", "test"), None)
    cands = Bm25Hits(collection, args.workdir, args.progress).hits(queries, DEPTH)
    qids = sorted(q for q in queries if cands.get(q) and any(r > 0 for r in qrels.get(q, {}).values()))
    docids = sorted({d for q in qids for d, _ in cands[q]})
    docs, passages, owner = embeddings(
        collection, docids, args.sentences, args.base, args.workdir, args.progress
    )
    rows_of = [[] for _ in docids]
    for p, i in enumerate(owner.tolist()):
        rows_of[i].append(p)
    qv = dict(zip(qids, dense_encoder(args.base).encode_queries([queries[q] for q in qids]), strict=True))
    row_of = {d: i for i, d in enumerate(docids)}
    return Candidates(collection, qrels, cands, qids, docs, passages, owner, row_of, rows_of, qv)


def bench_collection(args, name: str) -> dict:
    from label_free import comparison, label_free_baselines, runs_from, write_zst_run

    from aheadrank.build import MULTI_WINDOW, _variant, label_free_weights
    from aheadrank.evaluation import compare, evaluate, read_run

    c = candidates(args, name)
    collection, qrels, qids, owner, row_of = c.collection, c.qrels, c.qids, c.owner, c.row_of
    base = c.base(window="passage")  # (qid, QueryFeatures): each feature in candidate order
    runs = {
        **label_free_baselines(base),
        "bi-encoder-passages": runs_from(base, {"passage": 1.0}),
        "fusion-passages": runs_from(base, FUSION_PASSAGES),
    }
    multi = multi_window(collection, args.sentences)
    gate = multi >= MULTI_WINDOW  # aheadrank.build.MULTI_WINDOW
    log.info(
        "%s: %.1f %% of documents have two or more windows: window rule %s",
        name,
        100 * multi,
        "on" if gate else "off",
    )
    result = {
        "collection": name,
        "test_queries": len(qids),
        "documents": len(row_of),
        "passages": len(owner),
        "multi_window": round(multi, 4),
        "window_rule": gate,
        "baselines": {},
        "variants": {},
    }
    for k, r in runs.items():
        result["baselines"][k] = evaluate(r, qrels, ("nDCG@10",))["nDCG@10"]
    best = max(("rrf", "fusion-equal"), key=lambda k: result["baselines"][k])
    result["best_label_free_baseline"] = best
    result["fusion-passages"] = {
        "vs_best_baseline": comparison(compare, runs[best], runs["fusion-passages"], qrels),
        "vs_bm25": comparison(compare, runs["bm25"], runs["fusion-passages"], qrels),
    }
    out_runs = args.out / name / "runs"
    out_runs.mkdir(parents=True, exist_ok=True)
    for k in ("bi-encoder-passages", "fusion-passages"):
        write_zst_run(out_runs / f"{k}.trec.zst", runs[k], k)
    for folder, variant in args.neural:
        source = folder / name / "runs" / f"{variant}.trec.zst"
        scored = with_neural(base, c.neural(folder, variant))
        priors_w = label_free_weights(_variant(variant).kind)["neural+bm25+dense"]
        committed = folder / name / "runs" / f"{variant}+priors.trec.zst"
        vruns = {
            variant: runs_from(scored, {"neural": 1.0}),
            f"{variant}+priors": runs_from(scored, priors_w),
            f"{variant}+priors+passages": runs_from(scored, SERVED_PASSAGES),
            f"{variant}+priors+split": runs_from(scored, SERVED_SPLIT),
            f"{variant}+priors+window": runs_from(
                scored, window_weights(priors_w["neural"]) if gate else priors_w
            ),
        }
        row = {
            "from": str(source.relative_to(ROOT) if source.is_relative_to(ROOT) else source),
            "weights": {
                "priors": priors_w,
                "window": window_weights(priors_w["neural"]) if gate else priors_w,
            },
            "runs": {},
        }
        if committed.exists():
            row["committed_priors_ndcg10"] = evaluate(read_run(committed), qrels, ("nDCG@10",))["nDCG@10"]
        for k, r in vruns.items():
            row["runs"][k] = {
                "ndcg10": evaluate(r, qrels, ("nDCG@10",))["nDCG@10"],
                "vs_best_baseline": comparison(compare, runs[best], r, qrels),
                "vs_fusion_passages": comparison(compare, runs["fusion-passages"], r, qrels),
            }
        for suffix in ("passages", "split", "window"):
            write_zst_run(
                out_runs / f"{variant}+priors+{suffix}.trec.zst",
                vruns[f"{variant}+priors+{suffix}"],
                f"{variant}_priors_{suffix}",
            )
        result["variants"][variant] = row
    return result


def table(results: list[dict]) -> str:
    from label_free import diff_p as cmp

    lines = [
        "| collection | run | nDCG@10 | vs better of RRF / fusion-equal | vs fusion-passages |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        c = r["collection"]
        for k in BASELINES:
            extra = ""
            if k == "fusion-passages":
                extra = cmp(r["fusion-passages"]["vs_best_baseline"])
            mark = " (better)" if k == r["best_label_free_baseline"] else ""
            lines.append(f"| {c} | {k}{mark} | {r['baselines'][k]:.4f} | {extra} | |")
        for row in r["variants"].values():
            for k, x in row["runs"].items():
                lines.append(
                    f"| {c} | {k} | {x['ndcg10']:.4f} | {cmp(x['vs_best_baseline'])} | {cmp(x['vs_fusion_passages'])} |"
                )
    lines.append("")
    for r in results:
        if "multi_window" in r:
            state = "on" if r["window_rule"] else "off (+priors+window is +priors)"
            lines.append(
                f"- {r['collection']}: {100 * r['multi_window']:.1f} % of documents have two or more windows; "
                f"window rule {state}"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from benchkit import machine_info, write_json

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(argv)
    t0 = time.perf_counter()
    results = []
    for name in args.collections:
        results.append(bench_collection(args, name))
        log.info("%s: %s", name, {k: round(v, 4) for k, v in results[-1]["baselines"].items()})
    md = table(results)
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "label_free_passages.md").write_text(md)
    write_json(
        args.out / "label_free_passages.json",
        {
            "benchmark": "label_free_passages",
            "command": [
                "python",
                "bench/label_free_passages.py",
                *(argv if argv is not None else sys.argv[1:]),
            ],
            "machine": machine_info(2),
            "sentences": args.sentences,
            "weights": {
                "fusion-passages": FUSION_PASSAGES,
                "served": "aheadrank.build.label_free_weights(kind)",
                "served+passages": SERVED_PASSAGES,
                "served+window": "window_weights(the kind's share) where multi_window >= 0.5",
            },
            "results": results,
            "wall_s": round(time.perf_counter() - t0, 1),
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
