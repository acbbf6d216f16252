"""What each stage of ``aheadrank build`` costs, and the estimate the build prints before it runs them.

The rates are measured on the reference machine, 2 idle CPU cores (x86-64, no GPU), from the builds' own records
(``build.json``) of ``bench/results/label-free/``: ``build-time/`` (SciFact, 5,183 abstracts of 215 words, and
57,175 MS MARCO passages of 55 words, both with nothing else running), ``passages-served/`` (SciFact's store with
passages) and, for how the rankers compare with one another in one run, ``defaults-steps0/``, ``tk-base/`` and
``prettr-pool8k/`` (beside other work, so only their ratios are used). A stage's cost follows what it reads:

- ``bm25``: about 2.2 µs a word (SciFact 2.4 s, MS MARCO 7 s) and a second to start Java;
- ``queries``: about 3 ms a training query (3,000 pseudo-queries in 7.6–9 s);
- ``dense``: 6.7 ms a document plus 0.061 ms a word (SciFact 102 s, MS MARCO 570 s: the line through both), and
  where the build stores the window prior, about 6 ms a sentence window (each of a document's 2-sentence windows
  with its title; SciFact's 5,183 abstracts have about 43,000: 4-5 minutes);
- ``train``: the ranker's start (fits, the step-0 validation; PreTTR's pooled map on up to 8,192 documents) plus
  its steps, only those still to run where a stopped train stage resumes from its saved state (2.6 s a step for
  MORES 2×IB S2 in the recipe's bfloat16, 360 steps in 935 s; in float32, where the CPU has no bfloat16 in
  hardware, STEP_S_FLOAT32; the others by their ratio to it);
- ``store``: the sequences the ranker encodes (each document's first window, and with passages every passage:
  windows of the ranker's length overlapping by a quarter), about 11.5 ms each for MORES whatever their length
  (SciFact 10.6 ms without passages and 11.7 ms with them, 23,738 sequences in 277 s; MS MARCO's 57,175 short
  passages 13 ms), the others by ratio;
- ``priors``: half a minute.

The start's validation and the priors both score the queries the trainer holds out (the recipe's 100, at most a
fifth of the queries: ``rankers.training.split_queries``), and the rates were measured with 100 of them: a smaller
collection, with fewer, gets those two in proportion (collections of 49-60 documents, 7-8 held-out queries, took
3-14 s of start and 1-2 s of priors where the flat rates said 60 s and 30 s:
``bench/results/label-free/build-estimate/small-2026-12-07/``).

So an estimate is the right order of magnitude, not a promise: documents of very unequal length (the estimate
reads the mean), a loaded machine or another CPU move it. The build prints it once the collection is read, with
the reference scaled by a probe (:func:`speed_probe`: the bi-encoder timed on 128 of the collection's documents
against the reference for them, a few seconds: the machine as it is now, a GPU, a faster or a busier CPU), and
again after the dense stage, scaled by how long that stage took against its estimate; and every stage's real time
as it ends (``build.json`` keeps them, the probe's in the collection stage's ``probe``).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PIECES_PER_WORD = 1.36  # word pieces per whitespace word (MS MARCO: 4,266,225 pieces for 57,175 x 54.8 words)
BM25_S = (1.0, 2.2e-6)  # seconds: to start, per word
QUERY_S = 3e-3  # per training query (cut from the collection, or judged) and its BM25 candidates
DENSE_S = (6.7e-3, 6.1e-5)  # per document, per word
STORE_S_PER_SEQUENCE = 11.5e-3  # MORES 2xIB S2; the other rankers by KIND_COST["store"]
STEP_S = 2.6  # one step of the cpu recipe (8 groups of 8), MORES 2xIB S2; the others by KIND_COST["step"]
# The reference's steps ran in the recipe's bfloat16 autocast, in hardware: emulated, a step takes 8.7x float32's
# (bench/results/train-precision/), so the reference's float32 step would have been 0.3 s, 10x faster than an AVX2
# machine's float32 step at the same bi-encoder speed (below) -- not a machine's spread. Where the CPU trains in
# float32 (no AVX512-BF16 or AMX: rankers.training.cpu_bf16_native) a step costs this many reference seconds:
# `bench/train_precision.py --precisions float32 --steps 3 --repeats 1` on an AVX2 EPYC, 2026-12-05, 22.9 s a step
# over the speed probe's scale in the same run, 7.2 (bench/results/train-precision/float32/)
STEP_S_FLOAT32 = 3.2
PRIORS_S = 30.0
# held-out queries the start's and the priors' rates were measured with (the recipes' val_queries)
HELD_OUT_QUERIES = 100
# per sentence window of the window prior: the demo build of 2026-11-29 (`make demo`, .demo/build-*/build.json)
# embedded 8,531 windows in 176 s and its 1,000 documents in 68 s, 3.4x the reference DENSE_S (a busy machine):
# 20.6 ms a window there, about 6 ms at the reference rates
WINDOW_S = 6e-3
POOL_FIT_S = (
    0.03  # PreTTR: per document its pooled map is fitted on (prettr-pool8k/: 96 s on 1,400, 293 on 8,192)
)
# the ranker's costs against MORES 2xIB S2's (store and step) and its start in seconds: the same-run ratios of
# defaults-steps0/ (store: PreTTR l5/e128 447 s, TK 2 layers 57 s against MORES's 606 s on SciFact), tk-base/ (TK
# over the base's 6 layers, 426 s beside a 1.4x slower dense stage), cpu-core-360/ (360 judged steps: bert 1,453 s,
# PreTTR 1,085 s, TK 2 layers 216 s against MORES's 1,497 s) and positive-teacher-rankers/ (tk-6l-base's 360 steps
# 1,555-1,838 s)
KIND_COST = {
    "mores": {"store": 1.0, "step": 1.0, "start": 60.0},
    "prettr": {"store": 0.74, "step": 0.72, "start": 30.0},
    "tk": {"store": 0.1, "step": 0.15, "start": 30.0},
    "tk-base": {"store": 0.5, "step": 1.7, "start": 250.0},
    "bert": {"store": 0.1, "step": 0.97, "start": 60.0},
}


PROBE_POOL = 1024  # documents the probe chooses its batches from: a seeded reservoir over the collection
PROBE_BATCH = 64  # the dense stage's batch (indexer/build.py BuildOptions.batch_size); the probe times two


@dataclass(frozen=True)
class Workload:
    """What a build has to do, as far as its cost goes."""

    documents: int
    mean_words: float
    queries: int  # training queries (pseudo-queries or judged)
    steps: int
    cost: str  # a KIND_COST key
    window: int  # word pieces the ranker reads of a document
    passages: bool  # long documents stored as passages too
    pool_docs: int = 0  # PreTTR: documents its pooled map is fitted on
    windows: int = 0  # sentence windows the dense stage embeds (the window prior; 0 without it)
    # the CPU trains in float32 (no bfloat16 in hardware, or the recipe asks for none)
    float32_steps: bool = False
    # a resumed train stage: the steps its saved state holds (rankers.training.saved_step)
    steps_done: int = 0
    # queries the trainer holds out: the start validates on them and the priors are fitted on them
    held_out: int = HELD_OUT_QUERIES


def stored_sequences(w: Workload) -> float:
    """Sequences the store stage runs through the ranker: each document's first window, and with passages its
    windows of ``w.window`` pieces overlapping by a quarter (aheadrank.passages), from the mean length."""
    pieces = w.mean_words * PIECES_PER_WORD
    per_doc = 1
    if w.passages and pieces > w.window:
        stride = w.window - w.window // 4
        per_doc += math.ceil((pieces - w.window) / stride) + 1
    return w.documents * per_doc


def step_s(w: Workload) -> float:
    """A training step of MORES 2xIB S2 on the reference machine in the precision the build will train in."""
    return STEP_S_FLOAT32 if w.float32_steps else STEP_S


def reference_seconds(w: Workload) -> dict[str, float]:
    """Each stage's seconds on the reference machine (2 idle CPU cores)."""
    k = KIND_COST[w.cost]
    words = w.documents * w.mean_words
    held = w.held_out / HELD_OUT_QUERIES
    return {
        "collection": 0.0,
        "bm25": BM25_S[0] + BM25_S[1] * words,
        "queries": QUERY_S * w.queries,
        "dense": DENSE_S[0] * w.documents + DENSE_S[1] * words + WINDOW_S * w.windows,
        "train": k["start"] * held
        + POOL_FIT_S * w.pool_docs
        + step_s(w) * k["step"] * max(w.steps - w.steps_done, 0),
        "store": STORE_S_PER_SEQUENCE * k["store"] * stored_sequences(w),
        "priors": PRIORS_S * held,
    }


# The store's size: bytes a stored value takes at each store dtype (store.spec.DTYPES; a codebook's own table is not
# counted), and the estimate's allowance for documents of unequal length. From the mean length alone the estimate
# (stored_sequences x min(mean pieces, window)) was 0.86-0.92 of what three float16 MORES 2xIB S2 stores wrote:
# bench/results/label-free/build-time/'s SciFact (8.15 GB for 8.87 GB, passages and windows) and MS MARCO (13.1 GB
# for 15.1 GB, its long passages stored as passages too) and the demo's 1,000 abstracts (1.57 GB for 1.71 GB)
VALUE_BYTES = {"float16": 2.0, "int8": 1.0, "book4": 0.5, "book2": 0.25}
STORE_BYTES_SLACK = 1.1
# the store stage starts only where the free space is at least this share of its estimate (so a store that would
# fit is never refused for the estimate's error), and says there is little room below DISK_WARN
DISK_REFUSE = 0.8
DISK_WARN = 1.25


def store_bytes(w: Workload, piece_bytes: float) -> float:
    """The bytes the store stage writes for the ranker's fields, ``piece_bytes`` a word piece (all its fields at
    the store's dtype): each stored sequence (:func:`stored_sequences`) at the documents' mean length, at most the
    ranker's window, with :data:`STORE_BYTES_SLACK`. The bi-encoder's window field (its windows' vectors, under
    1 % of a ranker's store) is not counted."""
    pieces = min(w.mean_words * PIECES_PER_WORD, w.window)
    return STORE_BYTES_SLACK * stored_sequences(w) * pieces * piece_bytes


def check_room(
    need: float,
    free: float,
    dtype: str,
    where: str | Path,
    kept: str = "the stages done are kept",
    elsewhere: str = "--out",
    refuse: bool = True,
) -> str:
    """One line for a store about to be written: ``[store] about X to write (DTYPE); Y free at DIR``, ending
    ``: little room to spare`` where the free space is under :data:`DISK_WARN` of ``need``. Where it is under
    :data:`DISK_REFUSE` (and ``refuse``) an AheadrankError with the line says there is not enough room and names
    the smaller dtypes' sizes (into another ``elsewhere``: a store's dtype is pinned); ``kept`` says what a rerun
    keeps."""
    from aheadrank.errors import AheadrankError

    line = f"[store] about {size(need)} to write ({dtype}); {size(free)} free at {where}"
    if refuse and free < DISK_REFUSE * need:
        smaller = [
            f"--dtype {other} about {size(need * b / VALUE_BYTES[dtype])}"
            for other, b in VALUE_BYTES.items()
            if b < VALUE_BYTES[dtype]
        ]
        raise AheadrankError(
            f"{line}: not enough room. Free space there and run the same command again ({kept})"
            + (
                f", or build a smaller store into another {elsewhere} ({', '.join(smaller)})"
                if smaller
                else ""
            )
        )
    return line + (": little room to spare" if free < DISK_WARN * need else "")


def size(n: float) -> str:
    """Bytes in words: ``1.57 GB``, ``420 MB``, ``12 kB``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


class ProbeSample:
    """A seeded reservoir of :data:`PROBE_POOL` texts, fed one text at a time while the collection is read."""

    def __init__(self, size: int = PROBE_POOL, seed: int = 0):
        self.size, self.rng, self.seen, self.texts = size, random.Random(seed), 0, []

    def add(self, text: str) -> None:
        self.seen += 1
        if len(self.texts) < self.size:
            self.texts.append(text)
        else:
            k = self.rng.randrange(self.seen)
            if k < self.size:
                self.texts[k] = text


def probe_batches(lengths: Sequence[int], batch: int = PROBE_BATCH) -> list[int]:
    """The probe's documents: two batches of ``batch`` neighbours in length, at the pool's quartiles (the dense
    stage sorts each shard by length, so its batches hold documents of about one length; two batches of a
    128-document sample sorted alone would be padded far more). Fewer when the pool is smaller."""
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    picks: list[int] = []
    for q in (0.25, 0.75):
        start = min(int(q * len(order)), max(0, len(order) - batch))
        picks.extend(int(i) for i in order[start : start + batch])
    return list(dict.fromkeys(picks))


def speed_probe(texts: Iterable[str], encoder) -> dict:
    """How fast the bi-encoder (``encoder``: rankers/dense.py, on the build's device) runs here and now against the
    reference: ``{"documents", "seconds", "scale", "cpu_capability"}``, ``scale`` its seconds over :data:`DENSE_S`'s
    for the same documents (words counted as the estimate counts them), ``cpu_capability`` the vector units torch
    dispatches to on this CPU (``AVX2``, ``AVX512``: what a stage's time on the CPU depends on, training's most). One
    warm-up batch is not timed (first calls pay for allocation and thread start, which the stages do not pay per
    batch)."""
    import torch

    texts = list(texts)
    seqs = encoder.tokenize_documents(texts)
    picks = probe_batches([len(s) for s in seqs])
    if not picks:
        raise ValueError("the probe needs at least one document")
    chosen = [seqs[i] for i in picks]
    encoder.encode(chosen[:8], batch_size=8)
    t0 = time.perf_counter()
    encoder.encode(chosen, batch_size=PROBE_BATCH)
    seconds = time.perf_counter() - t0
    ref = DENSE_S[0] * len(picks) + DENSE_S[1] * sum(len(texts[i].split()) for i in picks)
    # four significant digits: a tiny model on a fast machine takes milliseconds, and its scale is still above 0
    return {
        "documents": len(picks),
        "seconds": float(f"{seconds:.4g}"),
        "scale": float(f"{seconds / ref:.4g}"),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def cost_key(kind: str, options: dict) -> str:
    """The KIND_COST entry of a ranker variant (its kind and options)."""
    if kind == "tk" and options.get("tk_base"):
        return "tk-base"
    return kind if kind in KIND_COST else "mores"


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def estimate_line(
    left: dict[str, float],
    scale: float | None,
    earlier: bool = False,
    probe: int | None = None,
    refined: bool = True,
    resumed: tuple[int, int] | None = None,
    store: tuple[float, str] | None = None,
) -> str:
    """One line: the stages still to run with their estimated time, and what the rates are: the reference
    (``scale`` None), scaled by the dense stage's time, or (``probe``: its number of documents) by the probe's
    (:func:`speed_probe`). ``earlier``: the scale was timed in an earlier run or another build, maybe on a
    machine busier or idler than now. ``refined``: a line after the dense stage will say it better (not when
    the dense stage has run and its time could not be used). ``resumed``: (step, steps) where the train stage
    resumes from its saved state. ``store``: (the bytes the store stage will write, its dtype)."""
    total = sum(left.values())
    parts = ", ".join(f"{stage} {duration(s)}" for stage, s in left.items() if s >= 1) or "each under 1 s"
    if resumed and "train" in left:
        parts += f"; train resumes at step {resumed[0]} of {resumed[1]}"
    if scale is None:
        how = "at the reference rates of 2 idle CPU cores (aheadrank/buildtime.py), refined after the dense stage"
    else:
        ran = f"a probe of {probe} documents ran on the bi-encoder" if probe else "the dense stage ran"
        how = f"the reference rates x {scale:.2g}, as {ran} against its estimate"
        if earlier:
            how += " in an earlier run (the machine may be busier or idler now)"
        if probe and refined:
            how += "; refined after the dense stage"
    disk = f"; the store about {size(store[0])} on disk ({store[1]})" if store else ""
    return f"[estimate] about {duration(total)} left ({parts}): {how}{disk}"
