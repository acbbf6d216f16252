"""A proximity prior, chosen on other collections: the sequential dependence model beside BM25.

BM25, the bi-encoder and the label-free rankers' starts all score a document without asking whether the query's
words occur near one another: BM25 counts them apart, the bi-encoder pools them away. The sequential dependence
model (Metzler & Croft 2005) adds that: the query's words (weight 0.85), its adjacent pairs as ordered phrases
(0.10) and within unordered windows of 8 (0.05), each part scored by the index's BM25. Anserini builds it
(``io.anserini.search.query.SdmQueryGenerator``, its ``-sdm`` default weights, fixed before the run) over the
positions the build's Lucene index stores; this probe measures whether it earns a place in the served score.

- ``none`` (the build's): the served score as built;
- ``sdm``: the candidates' SDM scores as a fifth feature, z-scored over the candidates as every feature is,
  taking half of BM25's weight (the lexical share stays what it is; ``label_free_qld.py``'s design). A candidate
  outside SDM's top 1,000 gets the lowest score found for the query.

The rule, fixed in the commit that added this file before any of it was run, is the window probes'
(``label_free_window_size.py``, as ``label_free_qld.py``'s): each collection's option chosen on the other
collections' mean served nDCG@10 over the three rankers (``none`` unless ``sdm`` beats it by more than rounding);
the product adds the prior only if the choice over all collections is ``sdm`` and no collection serves worse with
its held-out option than with ``none``. Beside it, deciding nothing: SDM alone and BM25 alone over the same
candidates.

Nothing is built or trained; the neural scores come from committed label-free builds' pure runs.

    .venv/bin/python bench/label_free_sdm.py --collections cranfield scifact vaswani \\
        --neural bench/results/label-free/maxp-cranfield-vaswani:mores-2ib-s2 \\
                 bench/results/label-free/maxp-cranfield-vaswani:prettr-l5-e128 \\
                 bench/results/label-free/maxp-cranfield-vaswani:tk-6l-base \\
        --runs-of scifact=bench/results/label-free/maxp-scifact

Writes ``--out`` (``bench/results/label-free/sdm``): ``label_free_sdm.{json,md}`` and
``<collection>/runs/VARIANT+priors+window-heldout.trec.zst`` (the served run with the held-out option).

**Replication on new queries** (rule fixed in the commit that added this paragraph, `293ada2`, after ``sdm/``'s result and
before anything below was run). In ``sdm/`` every collection, held out, chose ``sdm``, and the rule's veto kept it
out: Cranfield's mean fell 0.0007 (0.4190 → 0.4183, no ranker significantly). Whether that loss is Cranfield's or its
75 test queries' is measured on queries that no label-free setting was chosen on: Cranfield's and Vaswani's ``train``
splits (SciFact's judgments stay unread, so SciFact's result stays blind to them), with the same builds
(``bench/label_free.py --split train``, every default) and the same options, weights and ``DEPTH``:

    .venv/bin/python bench/label_free.py --collections cranfield vaswani --split train \\
        --rankers mores-2ib-s2 prettr-l5-e128 tk-6l-base --out work/out-train --no-progress
    .venv/bin/python bench/label_free_sdm.py --collections cranfield vaswani --split train \\
        --neural work/out-train:mores-2ib-s2 work/out-train:prettr-l5-e128 work/out-train:tk-6l-base \\
        --out bench/results/label-free/sdm-train

``sdm`` becomes the label-free default only if, on each of the two collections' train queries, the three rankers'
mean served nDCG@10 with ``sdm`` is not below the build's by more than rounding (5e-5: the veto of ``sdm/``, on new
queries). Otherwise it stays out and no further SDM setting is probed on these collections. Either way the
product change (the service scoring SDM per query) is separate work.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from label_free_qld import DEPTH, LexicalPrior, alone_lines, lexical_probe  # noqa: E402
from label_free_qld import collection_rows as lexical_rows  # noqa: E402
from label_free_window_size import main as probe_main  # noqa: E402

# Anserini's -sdm defaults (Metzler & Croft 2005): the words, the ordered pairs, the unordered windows
WEIGHTS = (0.85, 0.10, 0.05)
SDM_PROBE = lexical_probe("label_free_sdm", "sdm")
OPTIONS = SDM_PROBE.options


def sdm_scores(collection: Path, workdir: Path, queries: dict[str, str], progress: bool) -> dict[str, list]:
    """{qid: SDM's top :data:`DEPTH` (docid, score)} from the collection's Lucene index (its BM25 scoring each
    part)."""
    from aheadrank.indexer.bm25 import Bm25Searcher
    from benchkit import Bm25Hits

    searcher = Bm25Searcher(Bm25Hits(collection, workdir, progress).index)
    try:
        from jnius import autoclass  # after Bm25Searcher has started the JVM with the project's Java

        generator = autoclass("io.anserini.search.query.SdmQueryGenerator")(*map(float, WEIGHTS))
        out = {}
        for q in sorted(queries):
            hits = searcher._searcher.search(generator, queries[q], DEPTH)
            out[q] = [(h.docid, float(h.score)) for h in hits]
        return out
    finally:
        searcher.close()


SDM = LexicalPrior("sdm", "SDM", sdm_scores)


def alone_table(args, rows: dict) -> tuple[list[str], dict]:
    fields = {"alone": {n: r["checks"] for n, r in rows.items()}, "weights": WEIGHTS, "sdm_depth": DEPTH}
    return alone_lines(rows, SDM), fields


def main(argv=None) -> int:
    return probe_main(argv, SDM_PROBE, __doc__, "sdm", partial(lexical_rows, prior=SDM), alone_table)


if __name__ == "__main__":
    raise SystemExit(main())
