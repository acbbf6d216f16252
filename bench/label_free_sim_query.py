"""The label-free MORES start's similarity residual with its query read at the documents' depth.

The label-free MORES 2×IB S2 start scores a candidate by its similarity residual alone (``label_free_sim_space.py``):
``cos(V q̄ + b, mean of V D + b)`` with ``V`` the last block's value map. Its two sides are read at different
depths of the base model: the document states ``D`` leave the document encoder after its first L - K = 4 layers,
while ``q̄`` is the query's mean after the query encoder's 4 layers *and* the K = 2 blocks' own layers (6 in all, the
bi-encoder's depth). Nothing chose that asymmetry; it is how ``interact`` was written for trained rankers. This probe
scores the same start with the query read where the documents are:

- ``blocks`` (the build's): the query through the blocks' own layers, in the value space;
- ``encoder``: the mean of the query encoder's states (4 layers, as ``D``), through the same value map;
- ``encoder-states``: the same query mean and the documents' mean states, without the value map (both sides the
  base model's layer-4 mean: a 4-layer bi-encoder).

Pure and served with the build's label-free weights (``aheadrank.build.label_free_weights``, the window prior where
at least half the documents are two or more windows), over each test query's BM25 top 100, long documents by MaxP
(``--aggregation``, the build's ``maxp``), every passage encoded by the untrained start itself (float32).

The rule, fixed in the commit that added this file before any of it was run: for a target collection T, the
option with the best mean served nDCG@10 over the other collections, ``blocks`` unless another beats it by more than
``TIE`` (``label_free_window_size.choose_option``); the product changes the label-free start's residual only if the
choice over all collections is not ``blocks`` and no collection serves worse at its held-out option than with
``blocks``; ``blocks`` must give the committed build's pure and served nDCG@10 (``--check C=DIR``, within 0.002).
Adopting it means a MORES option for the residual's query (the stored fields do not change).

    .venv/bin/python bench/label_free_sim_query.py --collections cranfield vaswani scifact \\
        --check scifact=bench/results/label-free/maxp-scifact \\
                cranfield=bench/results/label-free/maxp-cranfield-vaswani \\
                vaswani=bench/results/label-free/maxp-cranfield-vaswani \\
        --out bench/results/label-free/sim-query

Writes ``--out``: ``label_free_sim_query.{json,md}`` and ``<collection>/runs/mores-2ib-s2-<option>{,+priors}.trec.zst``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from label_free_center import Option  # noqa: E402

OPTIONS = {
    "blocks": Option(),
    "encoder": Option(query="encoder"),
    "encoder-states": Option(query="encoder", space="states"),
}


def main(argv=None) -> int:
    from label_free_center import collection_rows, parse_args, pure_of
    from label_free_sim_space import held_out_probe, start_probe

    out = ROOT / "bench" / "results" / "label-free" / "sim-query"
    args, rows = start_probe(
        argv,
        lambda a: parse_args(a, __doc__, out),
        lambda args, name, ranker: collection_rows(args, name, ranker, OPTIONS, current="blocks"),
    )
    return held_out_probe(
        args, argv, rows, tuple(OPTIONS), "blocks", "label_free_sim_query", pure_of=pure_of(OPTIONS)
    )


if __name__ == "__main__":
    raise SystemExit(main())
