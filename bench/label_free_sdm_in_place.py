"""The sequential dependence model in BM25's place in the served score, chosen on other collections.

``label_free_sdm.py`` measured SDM (Anserini's ``SdmQueryGenerator``, weights 0.85 / 0.10 / 0.05) as a fifth feature
at half of BM25's weight: chosen on the other collections every collection took it, and alone over BM25's top 100 it
ranks above BM25 on all three (Cranfield 0.3586 against 0.3443, SciFact 0.6829 against 0.6789, Vaswani 0.4634
against 0.4604), but Cranfield served lower with it (mean of the three rankers 0.4183 against 0.4190), so its rule
kept the build as it is. This probe, written after that result, asks the next question: the lexical feature *is*
SDM, all of BM25's weight (BM25 still picks the candidates).

- ``none`` (the build's): the served score as built;
- ``sdm-in-place``: the candidates' SDM scores with all of BM25's weight, BM25's score left out of the fusion. A
  candidate outside SDM's top 1,000 gets the lowest score found for the query.

The rule, fixed in the commit that added this file before any of it was run, is ``label_free_sdm.py``'s: each
collection's option chosen on the other collections' mean served nDCG@10 over the three rankers (``none`` unless
``sdm-in-place`` beats it by more than rounding); the product takes it only if the choice over all collections is
``sdm-in-place`` and no collection serves worse with its held-out option than with ``none``. Beside it, deciding
nothing: SDM alone and BM25 alone.

    .venv/bin/python bench/label_free_sdm_in_place.py --collections cranfield scifact vaswani \\
        --neural bench/results/label-free/maxp-cranfield-vaswani:mores-2ib-s2 \\
                 bench/results/label-free/maxp-cranfield-vaswani:prettr-l5-e128 \\
                 bench/results/label-free/maxp-cranfield-vaswani:tk-6l-base \\
        --runs-of scifact=bench/results/label-free/maxp-scifact

Writes ``--out`` (``bench/results/label-free/sdm-in-place``): ``label_free_sdm_in_place.{json,md}`` and
``<collection>/runs/VARIANT+priors+window-heldout.trec.zst``.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from label_free_qld import collection_rows as lexical_rows  # noqa: E402
from label_free_qld import lexical_probe  # noqa: E402
from label_free_sdm import SDM, alone_table  # noqa: E402
from label_free_window_size import main as probe_main  # noqa: E402

IN_PLACE = replace(SDM, share=1.0, option="sdm-in-place")
PROBE = lexical_probe("label_free_sdm_in_place", IN_PLACE.name)
OPTIONS = PROBE.options


def main(argv=None) -> int:
    rows = partial(lexical_rows, prior=IN_PLACE)
    return probe_main(argv, PROBE, __doc__, "sdm-in-place", rows, alone_table)


if __name__ == "__main__":
    raise SystemExit(main())
