"""What the window prior costs a request of texts the store does not hold (the RAG path, cold cache).

A label-free build's priors weigh the bi-encoder's best sentence window (store/windows.py); a text sent ad hoc
gets that prior as its docid does: its sentence windows are cut and embedded online
(services/texts.py ``window_cosines_online``). This bench loads a build in-process (the service's own
``RerankBackend``, as ``aheadrank serve DIR`` does) and times ``score_texts`` on requests of ``--texts``
documents of the collection that no request has sent before (nothing from the store, nothing from the
cache), with the window prior and without it (the store's windows unset for that request: neural + whole-text
dense), interleaved request by request (``--rounds`` of each), so that both read the same kind of texts
under the same load. Reported: the median seconds per request and per text for each, their ratio, the
encode stage's share, and the longest stretch a request held the model thread between two turns (the median over
requests; services/README.md, "Turns stay short").

    .venv/bin/python bench/ad_hoc_windows_cost.py --build DIR --collection ../shared/data/cranfield \\
        --out bench/results/ad-hoc-windows-cost/cranfield.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from benchkit import machine_info, write_record
from rich.console import Console
from rich.table import Table

console = Console(width=None if sys.stdout.isatty() else 140)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", type=Path, required=True, help="a directory made by `aheadrank build`")
    p.add_argument("--collection", type=Path, required=True, help="the build's collection (its texts)")
    p.add_argument("--texts", type=int, default=50, help="texts per request")
    p.add_argument("--rounds", type=int, default=6, help="requests of each kind")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("bench/results/ad-hoc-windows-cost.json"))
    return p.parse_args(argv)


def longest_turn(steps) -> float:
    """Drive a backend's ``*_steps`` generator to its end as the model thread does (services/turns.py ``drive``),
    without other requests: its longest turn (seconds), i.e. how long it held the thread at once."""
    from aheadrank.services.turns import drive

    turns: list[float] = []
    drive(steps, turns.append)
    return max(turns)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    import torch

    torch.set_num_threads(args.threads)
    from aheadrank.indexer.collections import Collection
    from aheadrank.services.backend import RerankBackend, StageClock
    from aheadrank.services.settings import ServiceSettings

    from aheadrank.build import paths

    built = paths(args.build)
    settings = ServiceSettings(
        checkpoint=built["checkpoint"],
        store=built["store"],
        device="cpu",
        access_log=False,
        threads=args.threads,
        text_cache_bytes=4 << 30,  # nothing evicted: each text's window entry is counted in the record
    )
    backend = RerankBackend.load(settings)
    backend.warmup()
    if backend.scorer is None or backend.scorer.windows is None:
        raise SystemExit(f"{args.build}: its priors weigh no sentence windows; nothing to measure")
    backend.reader.text_shards = 0  # every text unknown to the store: encoded online
    texts = [d.text for d in Collection(args.collection)]
    need = 2 * args.rounds * args.texts
    if len(texts) < need:
        raise SystemExit(
            f"{args.collection}: {len(texts)} documents, {need} needed (lower --rounds or --texts)"
        )
    windows = backend.scorer.windows
    cached = backend.text_cache._items  # the texts whose windows were cut and embedded: their cache entries
    query = "what is the effect of the shape of a body on the flow around it"
    times: dict[str, list[float]] = {"window": [], "no window": []}
    encode: dict[str, list[float]] = {"window": [], "no window": []}
    longest: dict[str, list[float]] = {"window": [], "no window": []}
    at = 0
    for r in range(args.rounds):
        for cell in ("window", "no window") if r % 2 == 0 else ("no window", "window"):
            batch = texts[at : at + args.texts]  # never sent before: no cache entry
            at += args.texts
            backend.settings.ad_hoc_windows = cell == "window"  # the service's --ad-hoc-windows
            clock = StageClock()
            t = time.perf_counter()
            longest[cell].append(longest_turn(backend.score_texts_steps(query, batch, clock)))
            times[cell].append(time.perf_counter() - t)
            encode[cell].append(clock.seconds["encode"])
    window_entries = sum(key[1].startswith("windows") for key in cached)
    backend.close()

    rows = []
    for cell in times:
        med = statistics.median(times[cell])
        rows.append(
            {
                "cell": cell,
                "median_s": med,
                "per_text_ms": 1e3 * med / args.texts,
                "encode_share": statistics.median(
                    e / s for e, s in zip(encode[cell], times[cell], strict=True)
                ),
                "longest_turn_s": statistics.median(longest[cell]),
                "seconds": times[cell],
                "longest_turns": longest[cell],
            }
        )
    ratio = rows[0]["median_s"] / rows[1]["median_s"]
    table = Table(title=f"{args.texts} unknown texts a request, {args.collection.name}, {args.rounds} rounds")
    for col in ("cell", "median s", "ms / text", "encode share", "longest turn s"):
        table.add_column(col, justify="left" if col == "cell" else "right")
    for r in rows:
        table.add_row(
            r["cell"],
            f"{r['median_s']:.2f}",
            f"{r['per_text_ms']:.1f}",
            f"{r['encode_share']:.0%}",
            f"{r['longest_turn_s']:.3f}",
        )
    console.print(table)
    console.print(f"window / no window: {ratio:.2f}")
    write_record(
        args.out,
        "bench/ad_hoc_windows_cost.py",
        argv,
        machine_info(args.threads),
        t_start,
        build=str(args.build),
        collection=str(args.collection),
        texts=args.texts,
        rounds=args.rounds,
        window_sentences=windows.record["sentences"],
        window_entries=window_entries,
        rows=rows,
        ratio=ratio,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
