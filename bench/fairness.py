"""A small request's latency while a maximal one runs, before and after issue 37's item 7, side by side in one
run: *before* is the model thread first come, first served with the old defaults (``--no-interleave
--doc-batch-size 64 --max-documents 10000``), *after* the defaults now (requests take turns a chunk at a time,
chunks of 16 texts, at most 1,000 documents a request).

One untrained production-size checkpoint (``mores-2ib-s2`` over the packaged MiniLM: the same computation as a
trained one), no store: ``/rerank`` with ad-hoc texts (the bundled SciFact sample's documents, repeated to
the mode's ``--max-documents``, or ``--max-docs``), served by ``aheadrank serve`` on 127.0.0.1. Per mode:
the maximal request alone (seconds, documents/s, status: 504 if it cannot finish in the deadline), a small request
(``--small-docs`` texts) alone, and the same small request sent ``--smalls`` times one after the other while the
maximal request runs. Bounded: every request has a client timeout; the servers are stopped at the end.

    .venv/bin/python bench/fairness.py                        # bench/results/fairness.json
    .venv/bin/python bench/fairness.py --max-docs 300 --out /tmp/fairness.json   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import httpx  # noqa: E402
from aheadrank.services.process import ServeProcess  # noqa: E402
from aheadrank.services.settings import ServiceSettings  # noqa: E402
from benchkit import SAMPLE, machine_info, write_record  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--max-docs", type=int, default=None, help="the maximal request (default: each mode's limit)"
    )
    p.add_argument("--small-docs", type=int, default=4)
    p.add_argument("--smalls", type=int, default=5)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/aheadrank-bench-fairness"))
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "fairness.json")
    return p.parse_args(argv)


def checkpoint(work: Path) -> Path:
    from aheadrank.rankers import save_checkpoint
    from aheadrank.rankers.variants import parse_variant

    ckpt = work / "ckpt-mores-2ib-s2-untrained"
    if not (ckpt / "fingerprint.json").is_file():
        save_checkpoint(parse_variant("mores-2ib-s2").init(), ckpt)
    return ckpt


def texts(n: int) -> list[str]:
    docs = [json.loads(line) for line in (SAMPLE / "corpus.jsonl").open()]
    pool = [f"{d.get('title', '')} {d.get('text', '')}".strip() for d in docs]
    return [pool[i % len(pool)] for i in range(n)]


def post(url: str, docs: list[str]) -> tuple[int, float]:
    t = time.perf_counter()
    try:
        r = httpx.post(
            url + "/rerank", json={"query": "gene expression in cancer", "texts": docs}, timeout=600
        )
        status = r.status_code
    except httpx.HTTPError:
        status = -1
    return status, time.perf_counter() - t


def queue_depth(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return float(next(x for x in text.splitlines() if x.startswith("aheadrank_queue_depth ")).split()[1])


MODES = {
    "before": ["--no-interleave", "--doc-batch-size", "64", "--max-documents", "10000"],
    "after": [],  # the defaults
}


def run_mode(ckpt: Path, mode: str, args, work: Path) -> dict:
    limit = int(MODES[mode][-1]) if MODES[mode] else ServiceSettings.model_fields["max_documents"].default
    n = args.max_docs or limit
    server = ServeProcess(
        ["--checkpoint", str(ckpt), "--threads", str(args.threads), "--no-access-log", *MODES[mode],
         *(["--max-documents", str(n)] if n > limit else [])],
        work / f"serve-{mode}.log", clean_env=True,
    )  # fmt: skip
    try:
        server.wait_ready(600)
        big, small = texts(n), texts(args.small_docs)
        post(server.url, small)  # first touch
        alone_small = [post(server.url, small)[1] for _ in range(args.smalls)]
        big_status, big_alone = post(server.url, big)
        out: dict = {}

        def run_big() -> None:
            out["big"] = post(server.url, big)

        t = threading.Thread(target=run_big)
        t.start()
        deadline = time.monotonic() + 60
        while queue_depth(server.url) < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        during = [post(server.url, small) for _ in range(args.smalls)]
        t.join(700)
        statuses = sorted({s for s, _ in during})
        lat = [x for _, x in during]
        return {
            "mode": mode,
            "server_args": MODES[mode],
            "max_request": {"documents": n, "status": big_status, "seconds_alone": round(big_alone, 2),
                            "docs_per_s": round(n / big_alone, 1) if big_status == 200 else None,
                            "status_with_smalls": out.get("big", (None,))[0],
                            "seconds_with_smalls": round(out.get("big", (0, 0.0))[1], 2)},
            "small_alone_s": {"median": round(statistics.median(alone_small), 3), "max": round(max(alone_small), 3)},
            "small_during_max_s": {"median": round(statistics.median(lat), 3), "max": round(max(lat), 3),
                                   "first": round(lat[0], 3), "statuses": statuses},
        }  # fmt: skip
    finally:
        server.stop()


def main(argv=None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    args.workdir.mkdir(parents=True, exist_ok=True)
    ckpt = checkpoint(args.workdir)
    modes = [run_mode(ckpt, mode, args, args.workdir) for mode in MODES]
    print(
        f"{'mode':<8}{'max docs':>9}{'alone s':>9}{'docs/s':>8}{'status':>7}"
        f"{'small alone s':>14}{'small during: median':>21}{'max':>8}"
    )
    for m in modes:
        mx, sa, sd = m["max_request"], m["small_alone_s"], m["small_during_max_s"]
        print(
            f"{m['mode']:<8}{mx['documents']:>9}{mx['seconds_alone']:>9}{mx['docs_per_s'] or '-':>8}"
            f"{mx['status']:>7}{sa['median']:>14}{sd['median']:>21}{sd['max']:>8}"
        )
    write_record(
        args.out, "bench/fairness.py", argv, machine_info(args.threads), t0,
        request_timeout_s=ServiceSettings.model_fields["request_timeout_s"].default, modes=modes,
    )  # fmt: skip
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
