"""The window prior's pooling, chosen on other collections: a document's best window, or a softer pool.

The label-free served score's window prior is the bi-encoder's cosine with a document's *best* window of 2 sentences
(title in front; ``aheadrank.build.WINDOW_SENTENCES``, ``store/windows.py``). The max was fixed before anything
was measured. A single window that happens to match can lift a document whose other windows are off the topic; two
softer pools weigh the rest of it: ``first+max``, the mean of the first window (title and opening) and the best, as
the service pools a long document's passages by default (``aheadrank.passages``); ``top2``, the mean of the two best
windows. A document of one window scores the same under all three.

The rule, fixed in the commit that added this file before any of it was run (``label_free_window_size.py``'s):

- with each pool a collection's served score is the build's, its window feature pooled that way (the window prior
  where at least half of the collection's documents are two or more windows, else no window feature, so a
  collection with no sentence breaks, Vaswani, is the same with every pool);
- for a target collection T the pool is chosen on the other collections: the pool with the largest mean, over the
  other collections and the three rankers, of served nDCG@10; another than the current ``max`` only if its mean is
  larger than max's by more than ``TIE`` (rounding). T's served score with its held-out pool is compared (paired
  t-test) with T's better fusion and with T's served score with ``max``;
- the product changes the window prior's pool only if the same choice over all collections picks another and no
  collection serves worse (mean over the three rankers) with its held-out pool than with ``max``.

Nothing is built or trained; the windows' vectors come from ``bench/label_free_passages.py``'s cache, the neural
scores from committed label-free builds' pure runs.

    .venv/bin/python bench/label_free_window_pool.py --collections cranfield scifact vaswani \\
        --neural bench/results/label-free:mores-2ib-s2 bench/results/label-free:prettr-l5-e128 \\
                 bench/results/label-free:tk-6l-base --out bench/results/label-free/window-pool

``--runs-of scifact=bench/results/label-free/maxp-scifact`` reads SciFact's pure runs with MaxP passages.

Writes ``--out``: ``label_free_window_pool.{json,md}`` and ``<collection>/runs/VARIANT+priors+window-heldout.trec.zst``
(the served run with the held-out pool).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from label_free_window_size import POOLS, WindowProbe  # noqa: E402
from label_free_window_size import main as probe_main  # noqa: E402

POOL_PROBE = WindowProbe(
    "label_free_window_pool", "pool", POOLS, "max", lambda p: (2, p), lambda p: f"pool {p}"
)


def main(argv=None) -> int:
    return probe_main(argv, POOL_PROBE, __doc__, "window-pool")


if __name__ == "__main__":
    raise SystemExit(main())
