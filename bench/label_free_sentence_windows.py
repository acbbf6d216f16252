"""Sentence windows for a label-free build's ranker: would its passages serve better as windows of a few sentences
(title in front, :func:`aheadrank.indexer.pseudo_queries.sentence_passages`: the bi-encoder's window of
``bench/label_free_passages.py``, 2 sentences, fixed there before anything was measured) than as the ranker's
window of word pieces (what ``aheadrank build --passages`` stores)? Nothing is built or trained: each test
candidate's windows of both kinds are encoded on the fly (``Ranker.encode_documents``, rounded to float16 as a store
keeps them) and scored as the service scores stored fields; a document's score is its windows' MaxP or
``first+max``; pure and served (neural, BM25, bi-encoder 1/3 each), beside the label-free baselines. The word-piece
rows reproduce ``bench/label_free_window.py``'s stored ones, which checks the path.

The rule fixed before the first run (bench/results/label-free/README.md, "Nor do sentence windows"): the 2-sentence
windows replace the ranker's, chosen on Cranfield's judgments (where ``window/`` chose), only if they serve at least
as well under both aggregations; then they would be applied unchanged to SciFact and Vaswani.

The same probe measures ``--titled``: the ranker's window with the title in front of every passage
(:func:`titled_passages`; Dai & Callan 2019 put the title before each passage, and a plain split leaves it in the
first passage only). The served rows are 1/3 each (``served``) and, where the build's store has sentence windows
(the window gate), the label-free build's served weights with the window prior (``served+window``: 1/4 each for
MORES). Rule, written with this code before its first run: ``pieces+title`` replaces ``pieces`` in the label-free
store only if on Cranfield its ``served+window`` is at least ``pieces``'s under both aggregations (MaxP and
``first+max``); it would then be applied unchanged to SciFact (Vaswani has no titles: nothing changes there).

    .venv/bin/python bench/label_free_sentence_windows.py --collections cranfield --sizes 2 3 --steps 0
    .venv/bin/python bench/label_free_sentence_windows.py --collections cranfield --sizes --titled

needs ``bench/label_free.py``'s build of the same settings (its ``--workdir``). Writes ``--out``:
``label_free_sentence_windows.{json,md}``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
log = logging.getLogger("bench.label_free_sentence_windows")
AGGREGATIONS = ("maxp", "first+max")
ENCODE_CHUNK = 1024  # windows encoded at once


def parse_args(argv=None) -> argparse.Namespace:
    import label_free as lf

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--collections", nargs="+", default=["cranfield"])
    ap.add_argument("--ranker", default="mores-2ib-s2")
    ap.add_argument("--sizes", nargs="*", type=int, default=[2], help="sentences per window")
    ap.add_argument(
        "--titled",
        action="store_true",
        help="also the scheme pieces+title: the ranker's window of word pieces with the title in front of every passage",
    )
    lf.add_build_name_options(ap)
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--base", default=None, help="the bi-encoder of the window prior (default: the packaged one)"
    )
    ap.add_argument("--workdir", type=Path, default=ROOT / "work" / "label-free")
    ap.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / "label-free" / "sentence-windows"
    )
    args = ap.parse_args(argv)
    if any(s < 1 for s in args.sizes):
        ap.error("--sizes must be at least 1 sentence")
    return lf.recipe_settings(args)


def titled_passages(tokenizer, title: str, body: str, opts) -> list[str]:
    """A document's passages of ``opts.window`` word pieces with its title in front of every one (Dai & Callan
    2019's title + passage): the whole text where it fits the window or has no title; else the body split as
    ``--passages`` splits (:func:`aheadrank.passages.split_passages`, its overlap a quarter of the body's window) into
    windows of what the title (cut to half the window at most) leaves, each joined with the title
    (:func:`aheadrank.indexer.collections.join_title_text`)."""
    from aheadrank.indexer.collections import join_title_text

    from aheadrank.passages import PassageOptions, effective_overlap, split_passages

    def pieces(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])

    whole = join_title_text(title, body)
    if not (title or "").strip() or not (body or "").strip() or pieces(whole) <= opts.window:
        return split_passages(tokenizer, [whole], opts)[0]
    half = opts.window // 2
    head = split_passages(tokenizer, [title.strip()], PassageOptions(half, 0, 1))[0][0]
    room = opts.window - pieces(join_title_text(head, "x")) + pieces("x")
    body_opts = PassageOptions(room, effective_overlap(room, None), opts.max_passages)
    return [join_title_text(head, p) for p in split_passages(tokenizer, [body], body_opts)[0]]


def windows_of(
    ranker, titled: dict, docids: list[str], sizes: list[int], with_title: bool = False
) -> dict[str, list[list[str]]]:
    """Per scheme, each document's windows: ``pieces`` (the ranker's window, split as ``--passages`` splits: a
    document that fits is one window), ``pieces+title`` (with ``with_title``: the same window, the title in front of
    every passage, :func:`titled_passages`) and ``sent<N>`` (N sentences, stride one, title in front)."""
    from aheadrank.indexer.collections import join_title_text
    from aheadrank.indexer.pseudo_queries import sentence_passages

    from aheadrank.passages import DEFAULT_MAX_PASSAGES, PassageOptions, effective_overlap, split_passages

    window = int(ranker._text().max_doc_len)
    opts = PassageOptions(window, effective_overlap(window, None), DEFAULT_MAX_PASSAGES)
    texts = [join_title_text(*titled[d]) for d in docids]
    tokenizer = ranker._text().tokenizer
    out = {"pieces": split_passages(tokenizer, texts, opts)}
    if with_title:
        out["pieces+title"] = [titled_passages(tokenizer, *titled[d], opts) for d in docids]
    for s in sizes:
        out[f"sent{s}"] = [sentence_passages(*titled[d], size=s) for d in docids]
    return out


def window_prior(args, build: Path, queries: dict, feats: dict, qids: list[str]) -> tuple[bool, dict]:
    """The window prior of the label-free served score as the build serves it: each test candidate's best stored
    2-sentence window (``aheadrank.rerank.window_cosines`` over the build's ``store/windows``, which the build keeps
    where at least MULTI_WINDOW of the documents are two or more windows). Whether the store has windows, and where
    it does ``{"served+window": the build's served weights}`` after adding the ``window`` feature to ``feats``."""
    from aheadrank.rankers.dense import dense_encoder
    from aheadrank.store.windows import open_windows

    from aheadrank.build import _variant, label_free_weights, paths
    from aheadrank.rerank import window_cosines

    encoder = dense_encoder(args.base)
    windows = open_windows(paths(build)["store"], encoder.fingerprint)
    if windows is None:
        return False, {}
    try:
        qv = encoder.encode_queries([queries[q] for q in qids])
        for q, v in zip(qids, qv, strict=True):
            f = feats[q]
            f.features["window"] = window_cosines(windows, v, f.docids, f.features["dense"]).astype(
                np.float64
            )
    finally:
        windows.close()
    kind = _variant(args.ranker).kind
    return True, {"served+window": label_free_weights(kind, window=True)["neural+bm25+dense+window"]}


def bench_collection(args, name: str) -> dict:
    import label_free as lf
    from aheadrank.indexer.collections import Collection
    from aheadrank.rankers import load_ranker

    from aheadrank.build import paths
    from aheadrank.passages import aggregate
    from aheadrank.rerank import QUERY_PIECES

    collection = args.data / name
    build, queries, qrels, _, feats, qids, baselines, scores, best = lf.probe_setup(args, name)
    log.info("%s baselines %s", name, {k: round(v, 4) for k, v in scores.items()})

    ranker = load_ranker(paths(build)["checkpoint"], device=args.device)
    ranker.read_queries_up_to(QUERY_PIECES)  # as the service reads queries
    docids = sorted({d for q in qids for d in feats[q].docids})
    want = set(docids)
    titled = {d: (t, b) for d, t, b in Collection(collection).titled() if d in want}
    pos = {d: i for i, d in enumerate(docids)}
    gate, extra = window_prior(args, build, queries, feats, qids)
    out = {
        "collection": name,
        "build": str(build),
        "baselines": scores,
        "best_baseline": best,
        "window_rule": gate,
        "schemes": {},
    }
    for scheme, per_doc in windows_of(ranker, titled, docids, args.sizes, args.titled).items():
        t0 = time.perf_counter()
        flat = [w for ws in per_doc for w in ws]
        lengths = np.array([len(ws) for ws in per_doc])
        ends = np.cumsum(lengths)  # document i's windows are flat[starts[i] : ends[i]]
        starts = ends - lengths
        fields = [  # float16 as a store keeps them, a chunk at a time (SciFact's windows in float32: ~20 GB)
            {k: v.half() for k, v in f.items()}
            for i in range(0, len(flat), ENCODE_CHUNK)
            for f in ranker.encode_documents(flat[i : i + ENCODE_CHUNK], batch_size=32)
        ]
        row = {
            "windows": len(flat),
            "documents": len(docids),
            "encode_seconds": round(time.perf_counter() - t0, 1),
            "runs": {},
        }
        log.info(
            "%s %s: %d windows for %d documents, encoded in %.0f s",
            name,
            scheme,
            len(flat),
            len(docids),
            row["encode_seconds"],
        )
        windows = {}  # qid -> (each window's score, its candidate's index): scored once, aggregated twice
        for q in qids:
            f = feats[q]
            sel = [k for d in f.docids for k in range(starts[pos[d]], ends[pos[d]])]
            own = [j for j, d in enumerate(f.docids) for _ in range(starts[pos[d]], ends[pos[d]])]
            windows[q] = (
                ranker.score(ranker.encode_query(queries[q]), [fields[k] for k in sel]).numpy(),
                own,
            )
        for agg in AGGREGATIONS:
            vf = []
            for q in qids:
                f = feats[q]
                neural = np.array(aggregate(*windows[q], len(f.docids), agg))
                vf.append((q, type(f)(f.docids, {**f.features, "neural": neural}, f.qrels)))
            for kind, x in lf.pure_and_served(vf, qrels, baselines, best, extra).items():
                row["runs"][f"{agg}/{kind}"] = x
                log.info(
                    "%s %-7s %-9s %-6s %.4f  vs bm25 %s  vs %s %s",
                    name, scheme, agg, kind, x["ndcg10"], lf.diff_p(x["vs_bm25"]), best, lf.diff_p(x["vs_best_baseline"]),
                )  # fmt: skip
        out["schemes"][scheme] = row
        del fields
    return out


def table(results: list[dict]) -> str:
    import label_free as lf

    return lf.window_table(results, "schemes", "windows")


def main(argv=None) -> int:
    import label_free as lf

    return lf.run_probe(argv, parse_args, bench_collection, table, "label_free_sentence_windows")


if __name__ == "__main__":
    raise SystemExit(main())
