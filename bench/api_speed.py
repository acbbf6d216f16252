"""The public Python API's ``Ranker.score`` against the service's scoring loop, side by side in one run.

One query of 16 word pieces against N candidates of d word pieces (random ids from the vocabulary, the same
for every ranker, as ``bench/speed.py``; d = 512 means 493 pieces). Per ranker, untimed: the documents'
fields from ``document_fields``, one float32 dict a document as ``encode_documents`` returns them, and
their float16 rounding as the store keeps it. Timed under ``torch.inference_mode``, the query side
(``query_state``) plus the scores of all N, per path:

- ``service``: ``aheadrank.rerank.score_stored`` (``rerank-run``, the service) over an in-memory reader that
  hands each batch over as the store does (float16, padded, one copy a batch; no HDF5, so the timed work is
  the scoring loop's);
- ``api-float16``: ``Ranker.score(qs, docs)`` with one float16 dict a document (what the store keeps);
- ``api-float32``: ``Ranker.score(qs, docs)`` with ``encode_documents``' float32 dicts;
- ``before-float32``: what ``Ranker.score`` did up to c8b97aa: every document copied into one float32
  buffer (a torch copy a document and field), one ``score_batch`` over all N. Its ``score_batch`` is today's:
  PreTTR's float32 fields take the stored path since 6cf20cd, so for PreTTR this row is the old padding and
  batching only, not the old generic layers.

Rounds interleave a ranker's paths (each round runs each path once), so a busy machine slows them alike;
the median over rounds counts. Speed-up: ``bert``'s service time / the path's time at the same d. The
scores of every path are compared with the service's (max |Δ| relative to the largest score).

    .venv/bin/python bench/api_speed.py                   # N = 300, d = 128 and 512, 2 threads (~4 minutes)
    .venv/bin/python bench/api_speed.py --d 128 --rankers mores-2ib-s2 --rounds 3
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch
from aheadrank.rankers.base import SCORE_BATCH
from aheadrank.rankers.text import pad
from aheadrank.rankers.variants import parse_variant
from benchkit import (
    cpu_sample,
    machine_info,
    others_cores,
    score_head_reads_interaction,
    write_record,
)
from rich.console import Console
from rich.table import Table

from aheadrank.rerank import score_stored

REPO = Path(__file__).resolve().parents[1]
QUERY_PIECES = 16
FIRST_WORD_ID = 1000  # below: [PAD], [unusedN], [UNK], [CLS], [SEP], [MASK] in the BERT vocabulary
PATHS = ("service", "api-float16", "api-float32", "before-float32")
BERT_PATHS = ("service", "api-float32")  # bert's fields are its embeddings: the paths differ in copies only
console = Console(width=None if sys.stdout.isatty() else 150)


class MemoryReader:
    """What ``score_stored`` asks of a store reader (``fetch_torch``), from padded float16 fields in memory:
    each batch gathered into new tensors, as the store's fetch copies a batch out of its shards."""

    def __init__(self, docids: list[str], fields: dict[str, torch.Tensor], mask: torch.Tensor):
        self.row = {d: i for i, d in enumerate(docids)}
        self.fields, self.mask = fields, mask

    def fetch_torch(self, docids, device="cpu", pad_to=None, dequantize=True):
        index = torch.tensor([self.row[d] for d in docids])
        mask = self.mask[index]
        width = int(mask.sum(1).max())
        fields = {k: v[index, :width].to(device) for k, v in self.fields.items()}
        return SimpleNamespace(
            docids=list(docids), unknown=[], fields=fields, scales={}, mask=mask[:, :width]
        )


def before_score(ranker, qs, docs: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    """``Ranker.score`` up to c8b97aa: one float32 buffer per field, a torch copy per document, one batch."""
    names = list(docs[0])
    lengths = [int(d[names[0]].shape[0]) for d in docs]
    fields = {}
    for name in names:
        buf = torch.zeros(len(docs), max(lengths), docs[0][name].shape[1], dtype=ranker.dtype)
        for i, d in enumerate(docs):
            buf[i, : lengths[i]] = torch.as_tensor(d[name]).to(ranker.dtype)
        fields[name] = buf
    mask = torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]
    return ranker.score_batch(qs, fields, mask).float().cpu()


def encode(ranker, pieces: torch.Tensor, batch: int) -> list[dict[str, torch.Tensor]]:
    """``encode_documents``' output for word-piece ids: one float32 dict ([len, dim] views) a document."""
    ids, mask = pad([ranker.doc_ids(p) for p in pieces.tolist()], ranker.device, ranker.text.pad)
    out = []
    for s in range(0, len(ids), batch):
        m = mask[s : s + batch]
        cpu = {k: v.float().cpu() for k, v in ranker.document_fields(ids[s : s + batch], m).items()}
        out.extend({k: v[i, :n] for k, v in cpu.items()} for i, n in enumerate(m.sum(1).tolist()))
    return out


def padded16(docs: list[dict[str, torch.Tensor]]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    lengths = [int(next(iter(d.values())).shape[0]) for d in docs]
    fields = {
        k: torch.nn.utils.rnn.pad_sequence([d[k].half() for d in docs], batch_first=True) for k in docs[0]
    }
    return fields, torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]


def bench_ranker(name: str, d_pieces: int, pieces: torch.Tensor, q_pieces: list[int], args) -> list[dict]:
    t_setup = time.perf_counter()
    row = parse_variant(name)
    with torch.inference_mode(False):  # weights as a loaded checkpoint's
        ranker = row.init(seed=args.seed, max_query_len=QUERY_PIECES, max_doc_len=d_pieces)
    if row.strategy:
        ranker.strategy = row.strategy
    score_head_reads_interaction(ranker)
    q = pad([ranker.query_ids(q_pieces)], ranker.device, ranker.text.pad)
    docs32 = encode(ranker, pieces, args.encode_batch)
    docs16 = [{k: v.half() for k, v in d.items()} for d in docs32]
    docids = [f"d{i}" for i in range(len(docs32))]
    reader = MemoryReader(docids, *padded16(docs32))
    setup_s = time.perf_counter() - t_setup

    def service(n: int) -> torch.Tensor:
        qs = ranker.query_state(*q)
        scored, _ = score_stored(ranker, reader, qs, docids[:n], {"fetch": 0.0, "score": 0.0})
        return torch.tensor([s for _, s in scored])

    paths: dict[str, Callable[[int], torch.Tensor]] = {
        "service": service,
        "api-float16": lambda n: ranker.score(ranker.query_state(*q), docs16[:n]),
        "api-float32": lambda n: ranker.score(ranker.query_state(*q), docs32[:n]),
        "before-float32": lambda n: before_score(ranker, ranker.query_state(*q), docs32[:n]),
    }
    names = BERT_PATHS if row.kind == "bert" else PATHS
    rounds = args.bert_rounds if row.kind == "bert" else args.rounds
    times: dict[str, list[float]] = {p: [] for p in names}
    others: dict[str, list[float]] = {p: [] for p in names}
    scores: dict[str, torch.Tensor] = {}
    for p in names:  # warm-up: bert on 16 documents (a pass over all N is its timed run)
        paths[p](16 if row.kind == "bert" else len(docids))
    for _ in range(rounds):
        for p in names:
            start = cpu_sample()
            t0 = time.perf_counter()
            scores[p] = paths[p](len(docids))
            times[p].append(time.perf_counter() - t0)
            others[p].append(others_cores(start, cpu_sample()))
    ref = scores["service"]
    scale = float(ref.abs().max().clamp(min=1e-12))
    out = []
    for p in names:
        out.append(
            {
                "ranker": name,
                "kind": row.kind,
                "path": p,
                "d_pieces": d_pieces,
                "n_docs": len(docids),
                "score_batch": SCORE_BATCH,
                "rounds": rounds,
                "times_ms": [round(t * 1e3, 2) for t in times[p]],
                "ms_median": statistics.median(times[p]) * 1e3,
                "ms_min": min(times[p]) * 1e3,
                "other_processes_cores": round(statistics.mean(others[p]), 2),
                "max_rel_diff_vs_service": float((scores[p] - ref).abs().max()) / scale,
                "setup_s": round(setup_s, 1),
            }
        )
    return out


def finish(rows: list[dict]) -> None:
    for r in rows:
        bert = next(
            b
            for b in rows
            if b["kind"] == "bert" and b["path"] == "service" and b["d_pieces"] == r["d_pieces"]
        )
        r["speedup_vs_bert"] = bert["ms_median"] / r["ms_median"]
        service = next(
            s
            for s in rows
            if s["ranker"] == r["ranker"] and s["path"] == "service" and s["d_pieces"] == r["d_pieces"]
        )
        r["x_service_time"] = r["ms_median"] / service["ms_median"]


def print_table(rows: list[dict]) -> None:
    t = Table(title=f"Ranker.score (Python API) vs score_stored (the service), N = {rows[0]['n_docs']}")
    for c in (
        "d",
        "ranker",
        "path",
        "ms median",
        "ms min",
        "× service",
        "× bert",
        "max rel Δ",
        "other cores",
    ):
        t.add_column(c, justify="left" if c in ("ranker", "path") else "right")
    for r in rows:
        t.add_row(
            str(r["d_pieces"]),
            r["ranker"],
            r["path"],
            f"{r['ms_median']:.1f}",
            f"{r['ms_min']:.1f}",
            f"{r['x_service_time']:.2f}",
            f"{r['speedup_vs_bert']:.1f}",
            f"{r['max_rel_diff_vs_service']:.1e}",
            f"{r['other_processes_cores']:.1f}",
        )
    console.print(t)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--n", type=int, default=300, help="candidates per query")
    p.add_argument("--d", type=int, nargs="+", default=[128, 512], help="document word pieces (512 -> 493)")
    p.add_argument("--rankers", nargs="+", default=["bert", "mores-2ib-s2", "prettr-l5-e128"])
    p.add_argument(
        "--rounds", type=int, default=5, help="interleaved rounds per ranker (bert: --bert-rounds)"
    )
    p.add_argument("--bert-rounds", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--encode-batch", type=int, default=32, help="documents per document-side batch (untimed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "api_speed.json")
    args = p.parse_args(argv)
    if "bert" not in args.rankers:
        args.rankers.insert(0, "bert")  # the reference of every speed-up
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    info = machine_info(args.threads)
    console.print(f"[bold]{info['cpu']}[/], {args.threads} threads, torch {info['torch']}")
    gen = torch.Generator().manual_seed(args.seed)
    rows: list[dict] = []
    with torch.inference_mode():
        probe = parse_variant("bert").init(max_query_len=QUERY_PIECES, max_doc_len=128)
        max_pos = int(probe.config.bert["max_position_embeddings"])
        vocab = int(probe.config.bert["vocab_size"])
        del probe
        q_pieces = torch.randint(FIRST_WORD_ID, vocab, (QUERY_PIECES,), generator=gen).tolist()
        for d in args.d:
            d_pieces = min(d, max_pos - QUERY_PIECES - 3)
            pieces = torch.randint(FIRST_WORD_ID, vocab, (args.n, d_pieces), generator=gen)
            for name in args.rankers:
                for r in bench_ranker(name, d_pieces, pieces, q_pieces, args):
                    rows.append(r)
                    console.print(
                        f"d {d_pieces:4d} {name:16s} {r['path']:15s} {r['ms_median']:9.1f} ms "
                        f"(min {r['ms_min']:.1f}, other processes {r['other_processes_cores']:.1f} cores)"
                    )
                gc.collect()  # this ranker's fields before the next one's
    finish(rows)
    print_table(rows)
    info["load_average_end"] = list(os.getloadavg())
    write_record(
        args.out,
        "api_speed.py",
        argv,
        info,
        t_start,
        settings={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        rows=rows,
    )
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
