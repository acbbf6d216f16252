"""What the benchmark scripts under ``bench/`` share, tested (tests/test_benchkit.py) and kept beside them, out of the
installed package: JSON results, the machine record, CPU samples, and the stages several benchmarks cache (the BM25
index of a collection, a split's topics). A script run as ``python bench/<name>.py`` imports it as ``benchkit``
(its folder is first on ``sys.path``). The scripts stay thin: argument parsing, the measurement, the report.
Ranker variants and their names come from :mod:`rankers.variants`; training from :mod:`rankers.recipe`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import subprocess
import time
from pathlib import Path

# benchmarks run offline (nothing is downloaded); set before anything imports transformers
for _name, _value in (
    ("HF_HUB_OFFLINE", "1"),
    ("TRANSFORMERS_OFFLINE", "1"),
    ("TOKENIZERS_PARALLELISM", "false"),
):
    os.environ.setdefault(_name, _value)

import aheadrank  # noqa: E402  (after the offline variables)
from aheadrank.fsfaults import atomic_write_text  # noqa: E402

SAMPLE = Path(aheadrank.__file__).resolve().parent / "data" / "scifact-sample"  # the bundled SciFact sample
_SOURCE = Path(__file__).resolve().parents[1]  # the checkout's root (for the git commit in machine records)
log = logging.getLogger("bench")


# ---- results --------------------------------------------------------------------------------------------
def digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def clean(value):
    """JSON-ready: NaN / inf as None, tuples as lists, rounded floats stay as they are."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(clean(data), indent=2) + "\n")


def write_record(
    path: Path, script: str, argv: list[str] | None, machine: dict, t_start: float, **fields
) -> dict:
    """Write a benchmark's JSON record: the script, its command line, the machine, ``fields``, the wall time."""
    import sys

    command = " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])])
    record = {"benchmark": script, "command": command, "machine": machine, **fields}
    record["wall_s"] = round(time.perf_counter() - t_start, 1)
    write_json(path, record)
    return record


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def stage(msg: str) -> None:
    log.info(msg)


def sigmoid(x: float) -> float:
    """A served log-odds score as the ``relevance_score`` a client reads (stable at either end)."""
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def paired(a: dict, b: dict, qrels: dict) -> dict:
    """nDCG@10 of run ``b`` against run ``a``, paired over the queries: {diff, ci95, p} (a t-test)."""
    from aheadrank.evaluation import compare

    c = compare(a, b, qrels)
    return {"diff": c.mean_diff, "ci95": [c.ci_low, c.ci_high], "p": c.p}


def shown(c: dict) -> str:
    """A :func:`paired` comparison as a table cell: diff [95 % CI], p."""
    return f"{c['diff']:+.4f} [{c['ci95'][0]:+.4f}, {c['ci95'][1]:+.4f}], p {c['p']:.2g}"


def write_table(out: Path, lines: list[str]) -> None:
    """Print a bench's table and write it beside its JSON record (``out`` with ``.md``)."""
    print("\n".join(lines))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


# ---- the served backend ---------------------------------------------------------------------------------
def served_backend(build: Path, threads: int, **settings):
    """(the service's ``RerankBackend`` over the build at ``build``, as ``aheadrank serve DIR`` loads it, on the CPU
    with ``threads`` and ``settings``; the build's paths): the RAG benches' server, in-process."""
    import torch
    from aheadrank.services.backend import RerankBackend
    from aheadrank.services.settings import ServiceSettings

    from aheadrank.build import paths

    torch.set_num_threads(threads)
    built = paths(build)
    given = {"checkpoint": built["checkpoint"], "store": built["store"], "index": built["lucene"]}
    given.update(device="cpu", access_log=False, threads=threads)
    given.update(settings)  # index=None: served without the index (no BM25 for /rerank's texts)
    return RerankBackend.load(ServiceSettings(**given)), built


# ---- the machine ----------------------------------------------------------------------------------------
def machine_info(threads: int) -> dict:
    import torch

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=_SOURCE, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "threads": threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        # the vector units torch dispatches to (AVX2, AVX512): a step timed on one is not a step timed on another
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "git_commit": commit,
        "load_average_start": list(os.getloadavg()),
    }


def score_head_reads_interaction(ranker) -> None:
    """A ranker with the similarity residual starts with a zero score head, so its untrained scores are the
    residual alone and do not read the interaction: give the head random weights (fixed seed), so that a benchmark
    comparing two paths' scores compares the interaction too. Others are left as they are."""
    if getattr(ranker.config, "sim", False):
        import torch

        torch.nn.init.normal_(ranker.head.weight, std=0.2, generator=torch.Generator().manual_seed(3))


def machine(device: str) -> dict:
    """:func:`machine_info` with torch's threads, the device and its GPU name."""
    import torch

    info = machine_info(torch.get_num_threads())
    info["device"] = device
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def cpu_sample() -> tuple[float, int, int]:
    """(time, busy clock ticks of the whole machine, clock ticks of this process) from /proc."""
    try:
        busy = sum(
            int(v)
            for i, v in enumerate(Path("/proc/stat").read_text().split("\n")[0].split()[1:])
            if i not in (3, 4, 8, 9)
        )
        own = sum(int(v) for v in Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[11:13])
    except (OSError, ValueError):
        busy = own = 0
    return time.perf_counter(), busy, own


def others_cores(start: tuple[float, int, int], end: tuple[float, int, int]) -> float:
    """CPU cores other processes kept busy between two :func:`cpu_sample` s (0 where /proc is unavailable)."""
    dt = end[0] - start[0]
    ticks = (end[1] - start[1]) - (end[2] - start[2])
    return max(0.0, ticks / os.sysconf("SC_CLK_TCK") / dt) if dt > 0 else 0.0


def proc_status(pid: int | str = "self") -> dict[str, int] | None:
    """VmRSS, VmHWM, RssAnon, RssFile, RssShmem (kB) of a process from /proc; None once it is gone."""
    from aheadrank.memory import proc_status as read

    return read(pid)


def least_squares_slope(xs: list[float], ys: list[float]) -> float | None:
    """The slope of the least-squares line through (xs, ys); None for fewer than 2 distinct xs."""
    if len(xs) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else None


def lower_envelope(t: list[float], values: list[float], window: float) -> tuple[list[float], list[float]]:
    """The minimum of ``values`` in each ``window``-long stretch of ``t`` (from t[0]), at the time it was seen.
    For memory sampled between periodic trims, the minima are what a trim leaves: their slope is growth that
    trimming does not give back, where the raw samples' slope mostly follows when the last trim happened."""
    if window <= 0:
        raise ValueError(f"window must be > 0, got {window}")
    best: dict[int, tuple[float, float]] = {}
    for x, y in zip(t, values, strict=True):
        k = int((x - t[0]) // window)
        if k not in best or y < best[k][1]:
            best[k] = (x, y)
    picked = [best[k] for k in sorted(best)]
    return [x for x, _ in picked], [y for _, y in picked]


# ---- cached stages --------------------------------------------------------------------------------------
def bm25_index_path(collection: Path, work: Path) -> Path:
    """Where :func:`ensure_bm25_index` keeps the collection's index (built or not)."""
    return work / "bm25" / f"{collection.name}-{digest(str(collection))}"


def ensure_bm25_index(collection: Path, work: Path, progress: bool) -> Path:
    """The collection's BM25 Lucene index, built once per collection path."""
    from aheadrank.indexer.bm25 import build_bm25_index, is_lucene_index

    index = bm25_index_path(collection, work)
    if is_lucene_index(index):
        stage(f"bm25 index: cached {index}")
        return index
    t0 = time.perf_counter()
    result = build_bm25_index(collection, index, progress=progress)
    stage(f"bm25 index: {result.documents} documents in {time.perf_counter() - t0:.1f} s -> {index}")
    return index


class Bm25Hits:
    """BM25 top-k hits of one collection, cached in ``<workdir>/bm25-hits`` under the collection's content
    (its corpus file's sha256), the queries' texts and the depth. A run whose hits are all cached never
    opens (or builds) the Lucene index, so the rest of a bench runs where no Java is installed (a GPU
    machine with the hits carried from a machine that has Pyserini: bench/device/)."""

    def __init__(self, collection: Path, workdir: Path, progress: bool):
        self.collection, self.workdir, self.progress = collection, workdir, progress
        self._index: Path | None = None
        corpus = sorted(collection.glob("corpus.jsonl*"))
        if not corpus:
            raise SystemExit(f"{collection} has no corpus.jsonl")
        sha = hashlib.sha256()
        with corpus[0].open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                sha.update(block)
        self.key = f"{collection.name}-{sha.hexdigest()[:12]}"

    @property
    def index(self) -> Path:
        if self._index is None:
            self._index = ensure_bm25_index(self.collection, self.workdir, self.progress)
        return self._index

    def hits(self, queries: dict[str, str], depth: int) -> dict[str, list]:
        """{qid: [(docid, bm25 score), ...]} best first, as ``aheadrank.runs.bm25_candidates``."""
        path = self.workdir / "bm25-hits" / f"{self.key}-{digest([sorted(queries.items()), depth])}.json"
        cached = read_json(path)
        if cached is not None:
            return {q: [(d, float(s)) for d, s in hits] for q, hits in cached.items()}
        from aheadrank.runs import bm25_candidates  # (sets Java up: only on a miss)

        found = bm25_candidates(self.index, queries, depth)
        write_json(path, found)
        return found


def filler_docid(qid: str, order: list[str], avoid: set[str], hint: str = "") -> str:
    """The document whose first words bury ``qid``'s relevant texts (``bench/rag_long_texts.py``,
    ``bench/label_free_local_dense.py``): a fixed draw by the query id from ``order`` (every docid, collection order),
    never one in ``avoid`` (the query's candidates and relevant documents); ``hint`` ends the error where none is left."""
    import zlib

    if len(avoid) >= len(order):
        raise SystemExit(f"query {qid!r}: every document is a candidate or relevant; no filler{hint}")
    i = zlib.crc32(qid.encode()) % len(order)
    while order[i] in avoid:
        i = (i + 1) % len(order)
    return order[i]


def eval_topics(collection: Path, split: str, max_queries: int | None) -> tuple[dict, dict]:
    """The split's queries (the first ``max_queries`` by qid order when given) and their qrels."""
    from aheadrank.indexer.topics import read_beir_split

    queries, qrels = read_beir_split(collection, split)
    if max_queries:
        keep = sorted(queries, key=lambda q: (0, int(q), q) if q.isdigit() else (1, 0, q))[:max_queries]
        queries = {q: queries[q] for q in keep}
    return queries, {q: j for q, j in qrels.items() if q in queries}


def add_split_option(parser) -> None:
    """``--split {test,train}``: the judged split a label-free bench evaluates (default test; train: queries no
    label-free setting was chosen on, for a replication)."""
    parser.add_argument(
        "--split",
        choices=("test", "train"),
        default="test",
        help="the judged split evaluated (train: queries no label-free setting was chosen on, for a replication)",
    )


def add_options(parser, specs, exclude: tuple[str, ...] = ()) -> None:
    """argparse flags for declared options (:class:`aheadrank.rankers.spec.OptionSpec`, e.g.
    ``aheadrank.rankers.recipe.training_options()``: the ones ``aheadrank train`` has), each defaulting to
    None ("not given": the recipe's); a bool gets its flag and its negation."""
    for o in specs:
        if o.name in exclude:
            continue
        on, off = o.names
        if o.type is bool:
            parser.add_argument(on, dest=o.name, action="store_const", const=True, default=None, help=o.help)
            parser.add_argument(off, dest=o.name, action="store_const", const=False, help=f"not {on}")
        else:
            parser.add_argument(on, dest=o.name, type=o.type, default=None, choices=o.choices, help=o.help)
