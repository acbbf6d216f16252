"""Shared fixtures: a tiny random BERT base (fast), the real packaged MiniLM base, random texts."""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from pathlib import Path

import pytest
import torch

# one thread per test process: fast for tiny models and immune to oversubscription on a shared 2-core box
torch.set_num_threads(1)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the tests' collections judge a handful of queries: --labels auto trains on them, as it does on a collection that
# judges MIN_JUDGED_QUERIES (tests/test_build.py::test_auto_labels_build_label_free_where_too_few_queries_are_judged
# tests the minimum itself)
os.environ["AHEADRANK_MIN_JUDGED_QUERIES"] = "1"

WORDS = (
    "protein cell cancer tumour gene expression patient clinical trial risk therapy dose mouse model "
    "signal pathway receptor binding membrane virus infection immune response vaccine blood pressure "
    "heart disease brain neuron memory sleep diet obesity insulin glucose liver kidney lung smoking "
    "the of and in a to is was for with that by on as are from at an be this which or have has not "
    "increase decrease associated significant reduced higher lower levels study results showed effect"
).split()


def random_text(rng: random.Random, lo: int = 1, hi: int = 60) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


AERO_WORDS = (
    "wing lift drag shock flow boundary layer heat plate cone pressure supersonic laminar nozzle jet".split()
)


def write_judged_collection(
    root: Path, rng: random.Random, docs: int, sentences: tuple[int, int], queries: dict[str, list[str]]
) -> Path:
    """A tiny BEIR folder: ``docs`` documents of 10-word sentences (``sentences``: how many in the even and the odd
    ones, so that every other one can be longer than a ranker's window), a 4-word query per qid and, per split
    name in ``queries``, a qrels file judging two documents relevant to each of its qids (the k-th qid of all:
    d{2k} and d{2k+1})."""
    (root / "qrels").mkdir(parents=True)
    lines = []
    for i in range(docs):
        body = [" ".join(rng.choices(AERO_WORDS, k=10)) for _ in range(sentences[i % 2])]
        lines.append(json.dumps({"_id": f"d{i}", "title": "", "text": ". ".join(body) + "."}) + "\n")
    (root / "corpus.jsonl").write_text("".join(lines))
    qids = [q for split in queries.values() for q in split]
    (root / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": " ".join(rng.choices(AERO_WORDS, k=4))}) + "\n" for q in qids)
    )
    for split, these in queries.items():
        judged = [(q, f"d{(2 * qids.index(q) + j) % docs}") for q in these for j in (0, 1)]
        (root / "qrels" / f"{split}.tsv").write_text(
            "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, d in judged)
        )
    return root


def build_tiny_label_free(collection: Path, out: Path, base: Path, max_queries: int) -> Path:
    """``aheadrank build --labels none`` of ``collection`` with a 1-layer TK and 2 training steps, into ``out``."""
    from aheadrank.build import BuildPlan, build

    plan = BuildPlan(
        str(collection),
        str(out),
        ranker="tk-1l",
        steps=2,
        max_queries=max_queries,
        base=str(base),
        progress=False,
        labels="none",
    )
    build(plan, echo=lambda _: None)
    return out


def _has_avx512f() -> bool:
    try:
        return " avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def _has_compiler() -> bool:
    from aheadrank.kernels import native

    return native._compiler() is not None


def _families_all_on() -> bool:
    from aheadrank.kernels import native

    return native.families() == frozenset(native.FAMILIES)


# the compiled AVX-512 kernels (aheadrank/kernels/native_kernels.c) can run here, every family switched on (the
# suite run with AHEADRANK_NATIVE=none or a list of families skips the kernels' own tests); elsewhere they
# decline and PyTorch runs
needs_kernel = pytest.mark.skipif(
    not (_has_compiler() and _has_avx512f() and _families_all_on()),
    reason="no C compiler, no AVX-512F, or kernel families off (AHEADRANK_NATIVE): PyTorch runs",
)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from aheadrank.rankers.base_model import packaged_base_dir

    return packaged_base_dir()


def save_tiny_bert(path: Path, minilm_dir: Path, *, hidden: int, layers: int, heads: int, seed: int) -> Path:
    """A random BERT (FFN 2 × hidden, 256 positions) with the MiniLM tokenizer (vocabulary 30522), saved at path."""
    from aheadrank.rankers.base_model import TOKENIZER_FILES
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=30522,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=2 * hidden,
        max_position_embeddings=256,
        initializer_range=0.2,
    )
    BertModel(cfg).save_pretrained(path, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (minilm_dir / name).is_file():
            shutil.copyfile(minilm_dir / name, path / name)
    return path


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory, minilm_dir) -> Path:
    """A random 4-layer, 32-hidden BERT with the MiniLM tokenizer (vocabulary 30522)."""
    path = tmp_path_factory.mktemp("tiny-bert")
    return save_tiny_bert(path, minilm_dir, hidden=32, layers=4, heads=4, seed=1234)


@pytest.fixture(scope="session")
def tiny_rag_build(tmp_path_factory, tiny_base) -> tuple[Path, Path]:
    """(a tiny judged collection of short documents with 4 test queries, its label-free build): what the RAG
    benches (bench/rag_bm25.py, bench/rag_chunks.py) run on; read only."""
    root = tmp_path_factory.mktemp("rag-build")
    coll = write_judged_collection(
        root / "coll", random.Random(5), 30, (3, 2), {"test": ["q0", "q1", "q2", "q3"]}
    )
    return coll, build_tiny_label_free(coll, root / "b", tiny_base, max_queries=20)


@pytest.fixture(scope="session", autouse=True)
def server_logs(tmp_path_factory) -> Path:
    """The test servers' logs (services_testkit.Server) in this session's temporary folder, which pytest prunes
    (it keeps the last three), instead of one file per server left in /tmp."""
    path = tmp_path_factory.mktemp("server-logs")
    os.environ["AHEADRANK_TEST_SERVER_LOGS"] = str(path)
    return path


@pytest.fixture(autouse=True)
def command_loggers():
    """Each test's loggers as a process starts them: a command run in-process (``serve`` through typer's CliRunner
    sets the ``aheadrank`` logger to JSON lines at its level) would otherwise log into the next test's stderr,
    which the one-error-line tests read."""
    names = ("aheadrank", "aheadrank.train", "uvicorn.error")  # aheadrank.train: build sets it to INFO
    saved = {
        n: (logging.getLogger(n).level, logging.getLogger(n).handlers[:], logging.getLogger(n).propagate)
        for n in names
    }
    yield
    for name, (level, handlers, propagate) in saved.items():
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.handlers[:] = handlers
        logger.propagate = propagate


@pytest.fixture
def rng() -> random.Random:
    return random.Random(42)


@pytest.fixture(scope="session")
def service_env(tmp_path_factory, tiny_base):
    """The bundled SciFact sample with its BM25 index, a tiny MORES 2×IB (s2) checkpoint and its store."""
    from services_testkit import build_service_env

    return build_service_env(tmp_path_factory.mktemp("service"), tiny_base)
