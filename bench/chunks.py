"""One query's online path at several chunk sizes, side by side in one process (commit 7ad67b2): ``run_query`` of
``bench/speed.py`` over the same N stored candidates, chunk sizes interleaved round after round, so that a busy
machine slows all alike; prints a table and writes JSON (median and min per size, the ratio to the first size).

    .venv/bin/python bench/chunks.py --rankers prettr-l5-e128 mores-1ib-s2 --d 128 --chunks 256 300
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import speed as S  # noqa: E402


def rows_for(name: str, d: int, n: int, chunks: list[int], rounds: int, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    row = next(r for r in S.CATALOGUE if r.name == name)
    probe = S.init_ranker("bert", max_query_len=S.QUERY_PIECES, max_doc_len=128)
    vocab = int(probe.config.bert["vocab_size"])
    q_pieces = torch.randint(S.FIRST_WORD_ID, vocab, (S.QUERY_PIECES,), generator=gen).tolist()
    d_pieces = min(d, int(probe.config.bert["max_position_embeddings"]) - S.QUERY_PIECES - 3)
    pieces = torch.randint(S.FIRST_WORD_ID, vocab, (n, d_pieces), generator=gen)
    builder = S.FieldBuilder(pieces, 64, [row.options["layer"]] if row.kind == "prettr" else [])
    with torch.inference_mode(False):
        ranker = row.init(seed=seed, max_query_len=S.QUERY_PIECES, max_doc_len=d_pieces)
    if row.strategy:
        ranker.strategy = row.strategy
    S.score_head_reads_interaction(ranker)
    q = S.pad([ranker.query_ids(q_pieces)], S.DEVICE, ranker.text.pad)
    fields, mask = builder.build(ranker)
    times: dict[int, list[float]] = {c: [] for c in chunks}
    for c in chunks:  # warm-up
        S.run_query(ranker, q, fields, mask, c, n)
    for _ in range(rounds):
        for c in chunks:
            times[c].append(S.timed(lambda c=c: S.run_query(ranker, q, fields, mask, c, n)) * 1e3)
    base = statistics.median(times[chunks[0]])
    return {
        "ranker": name,
        "d_pieces": d_pieces,
        "n_docs": n,
        "chunks": {
            str(c): {
                "ms_median": statistics.median(v),
                "ms_min": min(v),
                "x_first": statistics.median(v) / base,
            }
            for c, v in times.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rankers", nargs="+", default=["prettr-l5-e128", "prettr-l5-e0", "mores-1ib-s2"])
    p.add_argument("--d", nargs="+", type=int, default=[128, 512])
    p.add_argument("--n", type=int, default=300)
    p.add_argument("--chunks", nargs="+", type=int, default=[256, 300])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=S.REPO / "bench" / "results" / "chunks.json")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = []
    with torch.inference_mode():
        for d in args.d:
            for name in args.rankers:
                r = rows_for(name, d, args.n, args.chunks, args.rounds, args.seed)
                results.append(r)
                cells = "  ".join(
                    f"{c}: {v['ms_median']:7.2f} ms ({v['x_first']:.2f}x)" for c, v in r["chunks"].items()
                )
                print(f"{name:18s} d={r['d_pieces']:4d}  {cells}", flush=True)
    info = S.machine_info(args.threads)
    out = {"benchmark": "bench/chunks.py", "command": " ".join(sys.argv), "machine": info, "rows": results}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
