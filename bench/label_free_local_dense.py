"""The dense prior of a long document, chosen on other collections: its head, or its passages' best cosine.

The label-free served score weighs the bi-encoder's cosine with a document (``dense``): one vector of the document's
first 256 word pieces (``rankers/dense.py``, sentence-transformers' limit for the base), whatever follows unread. A
text whose head is off the query's topic (a RAG chunk that starts in another section: ``bench/rag_long_texts.py``'s
``buried`` cell) loses that feature, and with it most of its served score (SciFact 0.677 -> 0.451 nDCG@10,
``bench/results/rag-long-texts/``). A local dense prior reads every part of the text:

- ``whole`` (the build's): the cosine with the document's first 256 word pieces;
- ``maxp``: the best cosine of the document's passages as the ranker cuts them (128 word pieces, a quarter
  overlapping, at most 10: ``indexer/build.py`` ``passage_options``), each embedded alone;
- ``maxp256``: the same with the bi-encoder's own window (256 pieces, 64 overlapping, at most 10).

A document that fits one passage scores the same under all three (its passage is the text the head reads).

The rule, fixed in the commit that added this file before any of it was run (``label_free_window_size.py``'s):

- with each option a collection's served score is the build's (``aheadrank.build.label_free_weights``; the window
  prior where at least half of the collection's documents are two or more windows), its ``dense`` feature computed
  that way; the baselines (the bi-encoder alone, RRF, the equal-weight fusion) keep the head's cosine: they are what
  a user would pick instead;
- for a target collection T the option is chosen on the other collections: the one with the largest mean, over the
  other collections and the three rankers, of served nDCG@10; another than ``whole`` only if its mean is larger by
  more than ``TIE`` (rounding). T's served score with its held-out option is compared (paired t-test) with T's better
  fusion and with T's served score with ``whole``;
- the product changes the dense prior only if the same choice over all collections picks another option and no
  collection serves worse (mean over the three rankers) with its held-out option than with ``whole``.

Beside the choice, and deciding nothing: the baselines of a user who chunks long documents (the bi-encoder alone,
RRF and the equal-weight fusion with each passage option's feature) against the build's served score; and the
``buried`` check of the dense feature alone: each judged-relevant candidate's text with the first 100 words of an
unrelated document in front of it (as ``bench/rag_long_texts.py`` buries it), ranked by the bi-encoder's feature of
each option against the other candidates' unburied features (nDCG@10 of the bi-encoder alone, buried and not).

Nothing is built or trained; the passages are cut from the collection and embedded by the bi-encoder (cached in
``--workdir``), the neural scores come from committed label-free builds' pure runs.

    .venv/bin/python bench/label_free_local_dense.py --collections cranfield scifact vaswani \\
        --neural bench/results/label-free/maxp-cranfield-vaswani:mores-2ib-s2 \\
                 bench/results/label-free/maxp-cranfield-vaswani:prettr-l5-e128 \\
                 bench/results/label-free/maxp-cranfield-vaswani:tk-6l-base \\
        --runs-of scifact=bench/results/label-free/maxp-scifact

Writes ``--out`` (``bench/results/label-free/local-dense``): ``label_free_local_dense.{json,md}`` and
``<collection>/runs/VARIANT+priors+window-heldout.trec.zst`` (the served run with the held-out option).
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from label_free_window_size import WindowProbe  # noqa: E402
from label_free_window_size import main as probe_main  # noqa: E402

log = logging.getLogger("bench.label_free_local_dense")
OPTIONS = ("whole", "maxp", "maxp256")
CURRENT = "whole"
WINDOWS = {"maxp": (128, 32), "maxp256": (256, 64)}  # word pieces per passage, overlap
# the head's and the passages' cosines mixed into one feature (bench/label_free_local_dense_mix.py)
MIXES = {"max(whole,maxp)": np.maximum, "mean(whole,maxp)": lambda a, b: (a + b) / 2}
FILLER_WORDS = 100  # bench/rag_long_texts.py's --filler-words default

DENSE_PROBE = WindowProbe(
    "label_free_local_dense", "dense", OPTIONS, CURRENT, lambda o: (2, "max"), lambda o: f"dense {o}"
)


def best_cosine(qv: np.ndarray, vectors: np.ndarray, owner: np.ndarray, n: int) -> np.ndarray:
    """Each of ``n`` texts' best cosine with ``qv`` over its passages' unit ``vectors`` (``owner``: each row's text)."""
    out = np.full(n, -np.inf)
    np.maximum.at(out, owner, vectors @ qv)
    return out


class PassageVectors:
    """The bi-encoder's vectors of texts' passages for each option, embedded once and cached by digest."""

    def __init__(self, base, workdir: Path, progress: bool):
        from aheadrank.rankers.dense import dense_encoder

        self.enc = dense_encoder(base)
        self.tokenizer = self.enc.text.tokenizer
        self.workdir = workdir
        self.progress = progress

    def split(self, texts: list[str], option: str) -> tuple[list[str], np.ndarray]:
        from aheadrank.passages import DEFAULT_MAX_PASSAGES, PassageOptions, flatten, split_passages

        window, overlap = WINDOWS[option]
        flat, owner = flatten(
            split_passages(self.tokenizer, texts, PassageOptions(window, overlap, DEFAULT_MAX_PASSAGES))
        )
        return flat, np.asarray(owner, dtype=np.int64)

    def __call__(self, name: str, texts: list[str], option: str) -> tuple[np.ndarray, np.ndarray]:
        """(passage vectors [P, n], owner [P]) of ``texts`` cut as ``option`` cuts them."""
        from benchkit import digest

        from aheadrank.baselines import encode_in_chunks

        path = (
            self.workdir / f"local-dense-{name}-{digest([texts, WINDOWS[option], self.enc.fingerprint])}.npz"
        )
        if path.exists():
            z = np.load(path)
            return z["vectors"], z["owner"]
        flat, owner = self.split(texts, option)
        t0 = time.perf_counter()
        vectors = encode_in_chunks(self.enc, flat, self.progress, desc=f"{name} {option}")
        seconds = time.perf_counter() - t0
        log.info(
            "%s %s: %d texts, %d passages embedded in %.0f s (%.1f passages/s)",
            name,
            option,
            len(texts),
            len(flat),
            seconds,
            len(flat) / max(seconds, 1e-9),
        )
        self.workdir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, vectors=vectors, owner=owner)
        tmp.replace(path)
        return vectors, owner


def feature_of(option: str, per: dict[str, np.ndarray]) -> np.ndarray:
    """An option's dense feature from the head's and the passages' cosines (``per``: {"whole", "maxp", ...})."""
    if option in per:
        return per[option]
    if option not in MIXES:
        raise ValueError(f"unknown dense option {option!r}; known: {(*OPTIONS, *MIXES)}")
    return MIXES[option](per[CURRENT], per["maxp"])


def option_features(local: dict, option: str) -> dict[str, np.ndarray]:
    """{qid: ``option``'s feature in candidate order} from :func:`local_features`."""
    queries = local[CURRENT]
    return {q: feature_of(option, {f: local[f][q] for f in local}) for q in queries}


def local_features(c, texts: dict[str, str], vectors: PassageVectors) -> dict[str, dict[str, np.ndarray]]:
    """{whole / maxp / maxp256: {qid: that cosine in candidate order}} over
    :class:`label_free_passages.Candidates` ``c``."""
    docids = sorted({d for q in c.qids for d in c.docids(q)})
    row = {d: i for i, d in enumerate(docids)}
    out = {CURRENT: {q: np.array([c.docs[d] @ c.qv[q] for d in c.docids(q)]) for q in c.qids}}
    for option in WINDOWS:
        vecs, owner = vectors(c.collection.name, [texts[d] for d in docids], option)
        out[option] = {}
        for q in c.qids:
            best = best_cosine(c.qv[q], vecs, owner, len(docids))
            out[option][q] = np.array([best[row[d]] for d in c.docids(q)])
    return out


def collection_texts(collection: Path, wanted: set[str]) -> tuple[dict[str, str], list[str]]:
    """The one text of each wanted document (title and body joined, as the build embeds it), and every docid in
    collection order (the fillers' pool, :func:`benchkit.filler_docid`)."""
    from aheadrank.indexer.collections import Collection, join_title_text

    texts, order = {}, []
    for d, title, body in Collection(collection).titled():
        order.append(d)
        if d in wanted:
            texts[d] = join_title_text(title, body)
    return texts, order


def buried_check(
    c, texts: dict[str, str], order: list[str], vectors: PassageVectors, local: dict, options=OPTIONS
) -> dict:
    """The bi-encoder alone (nDCG@10) with each option's feature, unburied and with every judged-relevant candidate
    buried behind :data:`FILLER_WORDS` words of an unrelated document."""
    from aheadrank.indexer.collections import Collection, join_title_text
    from benchkit import filler_docid

    from aheadrank.priors import ndcg10

    fillers = {}
    for q in c.qids:
        fillers[q] = filler_docid(q, order, set(c.docids(q)) | set(c.qrels.get(q, {})))
    need = set(fillers.values()) - set(texts)
    filler_text = dict(texts)
    if need:
        filler_text |= {
            d: join_title_text(t, b) for d, t, b in Collection(c.collection).titled() if d in need
        }
    buried, where = [], []  # the buried texts; (qid, candidate index) of each
    for q in c.qids:
        head = " ".join(filler_text[fillers[q]].split()[:FILLER_WORDS])
        for i, d in enumerate(c.docids(q)):
            if c.qrels.get(q, {}).get(d, 0) > 0:
                buried.append(f"{head} {texts[d]}")
                where.append((q, i))
    out = {"buried_texts": len(buried)}
    name = f"{c.collection.name}-buried"
    bur = {}  # each cosine with every relevant candidate buried
    for feature in local:
        if feature == CURRENT:
            bv, owner = vectors.enc.encode_documents(buried), np.arange(len(buried))
        else:
            bv, owner = vectors(name, buried, feature)
        bur[feature] = {q: f.copy() for q, f in local[feature].items()}
        for k, (q, i) in enumerate(where):
            bur[feature][q][i] = float(np.max(bv[owner == k] @ c.qv[q]))

    def mean_ndcg(feats: dict) -> float:
        return round(float(np.mean([ndcg10(feats[q], c.docids(q), c.qrels.get(q, {})) for q in c.qids])), 4)

    for option in options:
        out[option] = {
            "unburied": mean_ndcg(option_features(local, option)),
            "buried": mean_ndcg(option_features(bur, option)),
        }
    return out


def collection_rows(args, name: str, probe: WindowProbe = DENSE_PROBE) -> dict:
    """A collection's baselines and, for each option, each variant's served run, its nDCG@10 and the gate; under
    ``checks`` the buried check and the chunked baselines (deciding nothing)."""
    from label_free import label_free_baselines, runs_from
    from label_free_passages import candidates, multi_window, with_neural
    from label_free_prf import served_weights
    from label_free_window_size import probe_rows

    from aheadrank.build import MULTI_WINDOW
    from aheadrank.priors import QueryFeatures

    c = candidates(args, name)
    gate = multi_window(c.collection, args.sentences) >= MULTI_WINDOW
    base = c.base()
    base_runs = label_free_baselines(base)  # the head's cosine: what a user would pick instead
    texts, order = collection_texts(
        c.collection,
        {d for q in c.qids for d in c.docids(q)} | {d for q in c.qids for d in c.qrels.get(q, {})},
    )
    vectors = PassageVectors(args.base, args.workdir, args.progress)
    local = local_features(c, texts, vectors)
    checks = buried_check(c, texts, order, vectors, local, probe.options)
    variants = [v for _, v in args.neural]
    runs = {}
    for option in probe.options:
        dense = option_features(local, option)
        feats = [(q, QueryFeatures(f.docids, {**f.features, "dense": dense[q]}, f.qrels)) for q, f in base]
        for folder, variant in args.neural:
            scored = with_neural(feats, c.neural(args.runs_of.get(name, folder), variant))
            runs[(variant, option)] = runs_from(scored, served_weights(variant, gate))
    checks["chunked_baselines"] = chunked_baselines(base, local, runs, c.qrels, variants)
    log.info("%s: buried check %s", name, checks)
    windows = dict.fromkeys(probe.options, len(c.owner))
    rows = probe_rows(
        c.qrels, base_runs, runs, variants, probe.options, dict.fromkeys(probe.options, gate), windows
    )
    return rows | {"checks": checks}


def chunked_baselines(base: list, local: dict, runs: dict, qrels: dict, variants: list[str]) -> dict:
    """What a user who chunks long documents would pick instead: the label-free baselines with each passage
    option's bi-encoder feature, and each variant's served score (the build's, ``whole``) against the better of
    that RRF and equal-weight fusion (deciding nothing)."""
    from label_free import comparison, label_free_baselines

    from aheadrank.evaluation import compare, evaluate
    from aheadrank.priors import QueryFeatures

    out = {}
    for option in WINDOWS:
        feats = [
            (q, QueryFeatures(f.docids, {**f.features, "dense": local[option][q]}, f.qrels)) for q, f in base
        ]
        b = label_free_baselines(feats)
        ndcg = {k: round(evaluate(r, qrels, ("nDCG@10",))["nDCG@10"], 4) for k, r in b.items()}
        best = max(("rrf", "fusion-equal"), key=lambda k: ndcg[k])
        served = {v: comparison(compare, b[best], runs[(v, CURRENT)], qrels) for v in variants}
        out[option] = {"baselines": ndcg, "better_fusion": best, "served_vs_better_fusion": served}
    return out


def buried_table(args, rows: dict, probe: WindowProbe = DENSE_PROBE) -> tuple[list[str], dict]:
    """The buried check's table and JSON field (deciding nothing)."""
    options = probe.options
    lines = [
        "The bi-encoder alone (nDCG@10), each judged-relevant candidate unburied / buried behind "
        f"{FILLER_WORDS} words of an unrelated document (deciding nothing):",
        "",
        "| collection | buried texts | " + " | ".join(options) + " |",
        "|---|---:|" + "---|" * len(options),
    ]
    for name in rows:
        x = rows[name]["checks"]
        cells = " | ".join(f"{x[o]['unburied']:.4f} / {x[o]['buried']:.4f}" for o in options)
        lines.append(f"| {name} | {x['buried_texts']} | {cells} |")
    lines += [
        "",
        "The baselines of a user who chunks long documents: the bi-encoder's feature as each passage option computes"
        " it (nDCG@10), and the build's served score (dense whole) against the better of that RRF and equal-weight"
        " fusion (diff, p; deciding nothing):",
        "",
        "| collection | dense | bi-encoder | rrf | fusion-equal | "
        + " | ".join(v for _, v in args.neural)
        + " |",
        "|---|---|---:|---:|---:|" + "---|" * len(args.neural),
    ]
    from label_free import diff_p

    for name in rows:
        for option, x in rows[name]["checks"]["chunked_baselines"].items():
            b = x["baselines"]
            cells = " | ".join(diff_p(x["served_vs_better_fusion"][v]) for _, v in args.neural)
            lines.append(
                f"| {name} | {option} | {b['bi-encoder']:.4f} | {b['rrf']:.4f} | {b['fusion-equal']:.4f} | {cells} |"
            )
    return lines, {"buried_check": {n: r["checks"] for n, r in rows.items()}, "filler_words": FILLER_WORDS}


def main(argv=None) -> int:
    return probe_main(argv, DENSE_PROBE, __doc__, "local-dense", collection_rows, buried_table)


if __name__ == "__main__":
    raise SystemExit(main())
