"""The dense prior of a long document, its head's and its passages' cosines mixed, chosen on other collections.

``bench/label_free_local_dense.py`` (``bench/results/label-free/local-dense/``) replaced the head's cosine (the
document's first 256 word pieces) by its passages' best and kept the head: the passages serve lower (MORES 2×IB S2
0.7420 against 0.7486 on SciFact, 0.4175 against 0.4288 on Cranfield) while the bi-encoder alone ranks higher with
them and keeps a relevant text's rank when its head is another document's (SciFact 0.6695 against 0.2007 buried).
This probe, written after that run, measures one feature that reads both, so a text whose head is off the topic
keeps its dense prior and the others keep most of the head's:

- ``whole`` (the build's): the cosine with the document's first 256 word pieces;
- ``max(whole,maxp)``: the larger of that and the best cosine of its passages as the ranker cuts them (128 word
  pieces, a quarter overlapping, at most 10);
- ``mean(whole,maxp)``: their mean.

A document that fits one passage scores the same under all three.

The rule, fixed in the commit that added this file before any of it was run, is ``label_free_local_dense.py``'s
(the window probes'): each collection's option chosen on the others' mean served nDCG@10 over the three rankers
(``whole`` unless another beats it by more than rounding); the product changes the dense prior only if the choice
over all collections is another option and no collection serves worse with its held-out option than with
``whole``. The buried check and the chunked baselines are printed beside it, deciding nothing.

    .venv/bin/python bench/label_free_local_dense_mix.py --collections cranfield scifact vaswani \\
        --neural bench/results/label-free/maxp-cranfield-vaswani:mores-2ib-s2 \\
                 bench/results/label-free/maxp-cranfield-vaswani:prettr-l5-e128 \\
                 bench/results/label-free/maxp-cranfield-vaswani:tk-6l-base \\
        --runs-of scifact=bench/results/label-free/maxp-scifact

Writes ``--out`` (``bench/results/label-free/local-dense-mix``): ``label_free_local_dense_mix.{json,md}`` and
``<collection>/runs/VARIANT+priors+window-heldout.trec.zst`` (the served run with the held-out option).
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from label_free_local_dense import CURRENT, MIXES, buried_table, collection_rows  # noqa: E402
from label_free_window_size import WindowProbe  # noqa: E402
from label_free_window_size import main as probe_main  # noqa: E402

MIX_PROBE = WindowProbe(
    "label_free_local_dense_mix",
    "dense",
    (CURRENT, *MIXES),
    CURRENT,
    lambda o: (2, "max"),
    lambda o: f"dense {o}",
)


def main(argv=None) -> int:
    table = partial(buried_table, probe=MIX_PROBE)
    return probe_main(argv, MIX_PROBE, __doc__, "local-dense-mix", collection_rows, table)


if __name__ == "__main__":
    raise SystemExit(main())
