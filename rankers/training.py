"""Training any ranker through its unsplit model (``forward_pairs``), and PreTTR's compressor pre-training.

Groups of one judged-relevant document and n negatives sampled from the query's first-stage (BM25)
candidates, localised softmax cross-entropy (the positive is class 0), AdamW with linear warm-up and
linear decay, gradient accumulation, periodic validation on held-out training queries (the best checkpoint
is kept), mixed precision on CUDA, and a ``train-state.pt`` next to the checkpoint so a stopped run resumes
where it stopped (written at each validation and at least every :data:`SAVE_EVERY_S` seconds between them, so a
slow machine killed between validations loses minutes, not hours). Without a progress bar a log line says the
step, its rate and the time left every :data:`LOG_EVERY_S` seconds. Optional distillation: MSE between the
student's and a teacher ranker's scores.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from aheadrank.rankers.base import Ranker
from aheadrank.rankers.checkpoint import save_checkpoint
from aheadrank.rankers.spec import option
from aheadrank.rankers.text import pad

from aheadrank.errors import TrainingError
from aheadrank.fsfaults import atomic_write, atomic_write_text

log = logging.getLogger("aheadrank.train")
SAVE_EVERY_S = 600.0  # the resumable state at least this often (a CPU step of the recipe takes 2-25 s)
LOG_EVERY_S = 300.0  # without a progress bar: a line this often between validations
NEGATIVE_SAMPLING = ("uniform", "spread")


@dataclass
class TrainConfig:
    """Every option of :func:`train`, with its help: ``aheadrank train`` and ``bench/effectiveness.py`` derive
    a flag from each field, and :func:`rankers.recipe.resolve_training` fills the ones the recipe measured."""

    steps: int = option(1000, "training steps")
    group_size: int = option(8, "documents per group: 1 judged-relevant + (group size - 1) BM25 negatives")
    queries_per_step: int = option(8, "groups (queries) per step")
    grad_accum: int = option(1, "gradient accumulation: micro-batches per step")
    lr: float = option(3e-5, "learning rate")
    weight_decay: float = option(0.01, "AdamW weight decay")
    warmup: float = option(
        0.1,
        "linear warm-up, as a fraction of the steps",
        env="AHEADRANK_LR_WARMUP",  # serve's is a switch
    )
    eval_every: int = option(200, "validate every N steps and at the end (0: only at the end)")
    val_queries: int = option(50, "training queries held out for validation (at most a fifth of them)")
    val_depth: int = option(50, "BM25 candidates re-ranked per validation query")
    neg_depth: int = option(100, "negatives come from each query's top N BM25 candidates")
    negatives: str = option(
        "uniform",
        "negative sampling: uniform over the BM25 candidates, or spread (each drawn with weight 1 / how many "
        "training queries have it as a candidate: the few documents near many queries recur less as negatives, "
        "so that the model does not learn them instead of relevance)",
        choices=NEGATIVE_SAMPLING,
    )
    seed: int = option(0, "random seed (initialisation, sampling, the validation split)")
    amp: bool = option(True, "float16 autocast on CUDA")
    cpu_amp: bool = option(
        False, "bfloat16 autocast on CPU (faster steps where the CPU has AVX512-BF16 or AMX)"
    )
    distill_weight: float = option(
        0.0, "> 0: add MSE to a teacher ranker's scores (train: --teacher; bench/effectiveness.py: its bert)"
    )
    listwise_weight: float = option(
        0.0,
        "> 0: add listwise KL(teacher || student) over each group from the BM25 + bi-encoder fusion (its "
        "scores precomputed over the training queries' candidates)",
    )
    listwise_temperature: float = option(
        1.0, "the listwise teacher's softmax temperature (z-scored per query)"
    )
    ce_weight: float = option(1.0, "weight of the cross-entropy on the judged positive")
    max_grad_norm: float = option(1.0, "gradient clipping norm")
    validate_initial: bool = option(
        True,
        "validate the initial weights first (kept if no step beats them)",
        flag="--validate-initial/--no-validate-initial",
    )
    freeze_embeddings: bool = option(
        False,
        "keep every embedding table (word, position, type) as initialised (less memorisation on small training "
        "sets)",
        flag="--freeze-embeddings/--train-embeddings",
    )
    # shorter than the model reads: cheaper steps, and the checkpoint still reads (is evaluated and indexed at)
    # its full length
    doc_len: int | None = option(
        None,
        "word pieces per document while training and validating (none: the model's --max-doc-len)",
        flag="--train-doc-len",
    )
    fresh_lr: float | None = option(
        None,
        "learning rate of the parameters that start from scratch (heads, TK's kernel weights, PreTTR's "
        "compressor: Ranker.fresh_parameter_names; none: --lr)",
    )


@dataclass
class TrainingData:
    """Texts by docid, queries by qid, judgments and first-stage candidates (ranked docids) per query."""

    texts: dict[str, str]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    candidates: dict[str, list[str]]
    # optional precomputed teacher scores per query over its candidates (e.g. the BM25 + dense hybrid):
    # the listwise distillation target (``TrainConfig.listwise_weight``)
    teacher: dict[str, dict[str, float]] | None = None
    # docids whose text is a copy of another document's (a label-free pseudo-query's source, under its own id):
    # left out where the collection's documents are drawn (:meth:`documents`)
    copies: frozenset[str] = frozenset()

    def documents(self) -> dict[str, str]:
        """The collection's own documents: ``texts`` without the ``copies``."""
        return {d: t for d, t in self.texts.items() if d not in self.copies} if self.copies else self.texts

    def trainable(self) -> list[str]:
        """Queries with a judged-relevant document in the collection and at least one negative candidate."""
        out = []
        for qid in sorted(self.queries):
            rel = {d for d, r in self.qrels.get(qid, {}).items() if r > 0 and d in self.texts}
            if rel and any(d not in rel for d in self.candidates.get(qid, [])):
                out.append(qid)
        return out


@dataclass
class TrainResult:
    steps: int
    best_metric: float
    best_step: int
    seconds: float
    history: list[dict] = field(default_factory=list)
    validated: bool = True  # False: no held-out queries, best_metric is the last step's negative loss


def held_out_count(queries: int, n_val: int) -> int:
    """How many of ``queries`` trainable queries :func:`split_queries` holds out: ``n_val``, at most a fifth."""
    return min(n_val, queries // 5)


def split_queries(data: TrainingData, n_val: int, seed: int) -> tuple[list[str], list[str]]:
    qids = data.trainable()
    rng = random.Random(seed)
    rng.shuffle(qids)
    n_val = held_out_count(len(qids), n_val)
    return sorted(qids[n_val:]), sorted(qids[:n_val])


def candidate_counts(data: TrainingData, qids: list[str], depth: int) -> dict[str, int]:
    """How many of ``qids`` have each document among their first ``depth`` candidates."""
    counts: dict[str, int] = {}
    for q in qids:
        for d in set(data.candidates.get(q, [])[:depth]):
            counts[d] = counts.get(d, 0) + 1
    return counts


def sample_group(
    data: TrainingData,
    qid: str,
    size: int,
    depth: int,
    rng: random.Random,
    counts: dict[str, int] | None = None,
) -> list[str]:
    """[a judged-relevant document, size − 1 negatives from the first ``depth`` candidates]: drawn uniformly, or
    with ``counts`` (:func:`candidate_counts`) each with weight 1 / its count, without replacement (keys
    u^(1/w), Efraimidis–Spirakis)."""
    rel = [d for d, r in data.qrels[qid].items() if r > 0 and d in data.texts]
    negs = [d for d in data.candidates[qid][:depth] if d not in data.qrels[qid] or data.qrels[qid][d] <= 0]
    if counts is None:
        picked = rng.sample(negs, min(size - 1, len(negs)))
    else:
        keys = [rng.random() ** counts.get(d, 1) for d in negs]  # u^(1/w) with w = 1 / count
        picked = [negs[i] for i in sorted(range(len(negs)), key=lambda i: -keys[i])[: size - 1]]
    while len(picked) < size - 1:  # few candidates: repeat negatives rather than change the group shape
        picked.append(rng.choice(negs))
    return [rng.choice(rel), *picked]


def group_scores(
    ranker: Ranker, queries: list[str], groups: list[list[str]], texts: dict[str, str]
) -> torch.Tensor:
    """Scores [n_groups, group_size] of the unsplit model."""
    q_seqs = ranker.tokenize_queries(queries)
    flat_docs = [texts[d] for g in groups for d in g]
    d_seqs = ranker.tokenize_documents(flat_docs)
    size = len(groups[0])
    q_rep = [q for q in q_seqs for _ in range(size)]
    pad_id = ranker._text().pad
    q_ids, q_mask = pad(q_rep, ranker.device, pad_id)
    d_ids, d_mask = pad(d_seqs, ranker.device, pad_id)
    return ranker.forward_pairs(q_ids, q_mask, d_ids, d_mask).float().view(len(groups), size)


@torch.no_grad()
def rerank_queries(ranker: Ranker, data: TrainingData, qids: list[str], depth: int, batch: int = 64) -> dict:
    """A run {qid: {docid: score}} re-ranking each query's top-``depth`` candidates with the unsplit model."""
    was_training = ranker.training
    ranker.eval()
    run = {}
    for qid in qids:
        docs = data.candidates.get(qid, [])[:depth]
        if docs:
            scores = ranker.score_pairs(data.queries[qid], [data.texts[d] for d in docs], batch_size=batch)
            run[qid] = dict(zip(docs, scores.tolist(), strict=True))
    ranker.train(was_training)
    return run


def validation_metric(run: dict, qrels: dict) -> float:
    """nDCG@10 of ``run``; −inf where a score is not a finite number (weights gone NaN never count as better)."""
    from aheadrank.evaluation import evaluate

    if not all(math.isfinite(s) for scores in run.values() for s in scores.values()):
        return -math.inf
    return float(evaluate(run, {q: qrels[q] for q in run}, metrics=("ndcg_cut_10",))["ndcg_cut_10"])


def has_negative(data: TrainingData, qid: str, depth: int) -> bool:
    """Whether ``qid`` has a candidate that is not judged relevant among its first ``depth`` (a group needs one)."""
    judged = data.qrels.get(qid, {})
    return any(judged.get(d, 0) <= 0 for d in data.candidates.get(qid, [])[:depth])


def listwise_kl(scores: torch.Tensor, target: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """KL(softmax(target / T) || softmax(scores)) averaged over groups: the student matches the teacher's
    whole distribution over each group, not just its top document."""
    t = F.softmax(target.float() / temperature, dim=-1)
    return F.kl_div(F.log_softmax(scores.float(), dim=-1), t, reduction="batchmean")


def group_teacher(data: TrainingData, qids: list[str], groups: list[list[str]], device) -> torch.Tensor:
    """The precomputed teacher scores of each group's documents [n_groups, group_size]."""
    assert data.teacher is not None
    rows = []
    for q, g in zip(qids, groups, strict=True):
        t = data.teacher[q]
        floor = min(t.values())  # a judged positive outside the teacher's candidates: its worst score
        rows.append([t.get(d, floor) for d in g])
    return torch.tensor(rows, dtype=torch.float32, device=device)


def lr_lambda(warmup_steps: int, total: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps)
        return max(0.0, (total - step) / max(1, total - warmup_steps))

    return f


def loss_ends(losses: list[float]) -> tuple[float | None, float | None]:
    """Mean loss over the first and the last 10% of steps (at least one step each); None without steps."""
    if not losses:
        return None, None
    tenth = max(1, len(losses) // 10)
    return sum(losses[:tenth]) / tenth, sum(losses[-tenth:]) / tenth


def cpu_bf16_native() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX), the only CPUs where bfloat16
    autocast makes a step faster. Elsewhere (AVX2 alone) oneDNN emulates it and a training step runs several times
    slower than in float32 (``bench/train_precision.py``)."""
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:  # a torch without the probes
        return False


def autocast_context(device: torch.device, cfg: TrainConfig) -> Callable[[], torch.autocast]:
    """Mixed precision of the training forward: float16 on CUDA (``amp``), bfloat16 on CPU (``cpu_amp``) where
    the CPU has it in hardware (:func:`cpu_bf16_native`; else float32, said once in the log). Weights, optimizer
    state, gradients and validation stay float32."""
    if device.type == "cuda":
        return lambda: torch.autocast("cuda", dtype=torch.float16, enabled=cfg.amp)
    bf16 = cfg.cpu_amp and device.type == "cpu"
    if bf16 and not cpu_bf16_native():
        log.info(
            "training in float32: this CPU has no bfloat16 in hardware (AVX512-BF16 or AMX), where autocast is slower"
        )
        bf16 = False
    return lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)


@contextmanager
def doc_len_limited(ranker: Ranker, doc_len: int | None) -> Iterator[None]:
    """``ranker`` reads documents up to ``doc_len`` word pieces inside (``None``: unchanged), its own after."""
    text = ranker._text()
    before = text.max_doc_len
    if doc_len is not None:
        ranker.limit_doc_len(min(doc_len, ranker.config.max_doc_len))
    try:
        yield
    finally:
        text.max_doc_len = before


def state_file(out: str | Path) -> Path:
    """Where a run into checkpoint ``out`` keeps its resumable state (``OUT.train-state.pt``, beside it)."""
    out = Path(out)
    return out.parent / f"{out.name}.train-state.pt"


def saved_step(out: str | Path) -> int:
    """The step a run into checkpoint ``out`` resumes from: its saved state's (read memory-mapped, a fraction of a
    second for 556 MB), 0 where there is none or it cannot be read (a time estimate reads it; :func:`train`
    checks the state properly)."""
    path = state_file(out)
    if not path.is_file():
        return 0
    try:
        return int(torch.load(path, map_location="cpu", mmap=True, weights_only=False)["step"])
    except Exception as exc:  # noqa: BLE001 -- an unreadable state only costs the estimate its resume
        log.debug("no saved step in %s: %s", path, exc)
        return 0


def train(
    ranker: Ranker,
    data: TrainingData,
    out: str | Path,
    cfg: TrainConfig,
    teacher: Ranker | None = None,
    resume: bool = True,
    progress: bool = True,
    stop_after: int | None = None,
    record: dict | None = None,
) -> TrainResult:
    """Train ``ranker`` in place; the best checkpoint (by validation nDCG@10) is written to ``out``, with
    ``record`` (e.g. the stages before this one) beside the training config in its ``extra``.

    ``stop_after`` ends this invocation after that many steps (the state is saved; a later call resumes).
    With ``cfg.doc_len`` documents are cut shorter while training and validating; the checkpoint keeps the
    model's own ``max_doc_len``."""
    with doc_len_limited(ranker, cfg.doc_len):
        return _train(ranker, data, out, cfg, teacher, resume, progress, stop_after, record or {})


def ranker_shape(ranker: Ranker) -> dict:
    """What makes a training state fit a ranker: its kind and configuration, less its provenance and ``extra`` (the
    records and fitted maps that training itself adds)."""
    skip = ("extra", "base", "format")
    return {"kind": ranker.kind, **{k: v for k, v in asdict(ranker.config).items() if k not in skip}}


def check_state_ranker(state: dict, ranker: Ranker, path: Path) -> None:
    """Refuse to resume ``ranker`` from a training state written for another ranker (e.g. a build whose kind now
    resolves to another variant): by the shape the state records, or, for a state without one, by its parameters'
    names and shapes."""
    fix = "give the variant it was started with, or delete it to start over"
    mine = ranker_shape(ranker)
    theirs = state.get("ranker")
    if theirs is not None:
        diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        if diff:
            shown = ", ".join(f"{k} {theirs.get(k)!r} (this ranker: {mine.get(k)!r})" for k in diff[:4])
            raise TrainingError(f"{path} was written for another ranker: {shown}; {fix}")
        return
    have = {k: tuple(v.shape) for k, v in ranker.state_dict().items()}
    saved = {k: tuple(v.shape) for k, v in state["model"].items()}
    if have != saved:
        odd = sorted(set(have) ^ set(saved)) or sorted(k for k in have if have[k] != saved[k])
        raise TrainingError(
            f"{path} was written for another ranker ({len(odd)} parameters differ, e.g. {odd[0]}); {fix}"
        )


def _train(
    ranker: Ranker,
    data: TrainingData,
    out: str | Path,
    cfg: TrainConfig,
    teacher: Ranker | None,
    resume: bool,
    progress: bool,
    stop_after: int | None,
    record: dict,
) -> TrainResult:
    from aheadrank.logs import progress_bar

    out = Path(out)
    state_path = state_file(out)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    train_q, val_q = split_queries(data, cfg.val_queries, cfg.seed)
    train_q = [q for q in train_q if has_negative(data, q, cfg.neg_depth)]
    if not train_q:
        raise TrainingError(
            "no trainable queries: none has a judged-relevant document of the collection and a BM25 negative among "
            f"its first {cfg.neg_depth} candidates (do the qrels name this collection's documents? a larger "
            "--neg-depth?)"
        )
    if cfg.negatives not in NEGATIVE_SAMPLING:
        raise ValueError(f"negatives are sampled {' or '.join(NEGATIVE_SAMPLING)}, not {cfg.negatives!r}")
    counts = candidate_counts(data, train_q, cfg.neg_depth) if cfg.negatives == "spread" else None
    if cfg.listwise_weight > 0 and (data.teacher is None or any(q not in data.teacher for q in train_q)):
        raise ValueError("listwise distillation needs teacher scores for every training query")
    device = ranker.device
    use_amp = cfg.amp and device.type == "cuda"  # float16 needs the loss scaler
    autocast = autocast_context(device, cfg)
    frozen = [p for n, p in ranker.named_parameters() if cfg.freeze_embeddings and "embeddings" in n]
    for p in frozen:
        p.requires_grad_(False)
    fresh = set(ranker.fresh_parameter_names()) if cfg.fresh_lr is not None else set()
    named = [(n, p) for n, p in ranker.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in named if n not in fresh]},
        {"params": [p for n, p in named if n in fresh], "lr": cfg.fresh_lr},
    ]
    opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(int(cfg.warmup * cfg.steps), cfg.steps))
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
    step, best, best_step, history = 0, -math.inf, -1, []
    if resume and state_path.is_file():
        state = torch.load(state_path, map_location=device, weights_only=False)
        if state["config"] != asdict(cfg):
            theirs, mine = state["config"], asdict(cfg)
            diff = sorted(k for k in set(theirs) | set(mine) if theirs.get(k) != mine.get(k))
            shown = ", ".join(f"{k} {theirs.get(k)!r} (now {mine.get(k)!r})" for k in diff[:4])
            raise TrainingError(
                f"{state_path} was written with another training config: {shown}; give the same options to resume, "
                "or delete it to start over"
            )
        check_state_ranker(state, ranker, state_path)
        ranker.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        step, best, best_step, history = state["step"], state["best"], state["best_step"], state["history"]
        rng.setstate(state["rng"])
        torch.set_rng_state(state["torch_rng"])
        log.info("resumed at step %d from %s", step, state_path)
    if step == 0 and val_q and cfg.validate_initial:
        # the starting point is a candidate too: a run that only hurts keeps the initial weights
        best = validation_metric(rerank_queries(ranker, data, val_q, cfg.val_depth), data.qrels)
        best_step = 0
        log.info("step 0 (initial weights) val nDCG@10 %.4f", best)
        save_checkpoint(
            ranker,
            out,
            overwrite=True,
            extra={**record, "train": {**asdict(cfg), "best_step": 0, "val_ndcg10": best, "val_qids": val_q}},
        )
    ranker.train()
    bar = progress_bar(
        total=cfg.steps, initial=step, desc=f"train {ranker.kind}", unit="step", disable=not progress
    )
    start, seen = time.perf_counter(), 0
    limit = cfg.steps if stop_after is None else min(cfg.steps, step + stop_after)
    first, saved, said = step, start, start
    while step < limit:
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(cfg.grad_accum):
            qids = [rng.choice(train_q) for _ in range(cfg.queries_per_step)]
            groups = [sample_group(data, q, cfg.group_size, cfg.neg_depth, rng, counts) for q in qids]
            queries = [data.queries[q] for q in qids]
            with autocast():
                scores = group_scores(ranker, queries, groups, data.texts)
                loss = cfg.ce_weight * F.cross_entropy(
                    scores.float(), torch.zeros(len(groups), dtype=torch.long, device=device)
                )
                if cfg.listwise_weight > 0:
                    target = group_teacher(data, qids, groups, device)
                    loss = loss + cfg.listwise_weight * listwise_kl(scores, target, cfg.listwise_temperature)
                if teacher is not None and cfg.distill_weight > 0:
                    with torch.no_grad():
                        target = group_scores(teacher, queries, groups, data.texts)
                    loss = loss + cfg.distill_weight * F.mse_loss(scores, target)
            scaler.scale(loss / cfg.grad_accum).backward()
            total += loss.item() / cfg.grad_accum
            seen += len(groups) * cfg.group_size
        if not use_amp and not math.isfinite(total):  # (float16 on CUDA: the loss scaler skips such a step)
            bar.close()
            raise TrainingError(
                f"step {step + 1}: the loss is {total} (not a finite number), so the weights would be too: stopped "
                f"with nothing of it saved; the best checkpoint so far stays at {out} (step {best_step}). A lower "
                "--lr, or other loss weights or --listwise-temperature, may train"
            )
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(ranker.parameters(), cfg.max_grad_norm)
        scaler.step(opt)
        scaler.update()
        sched.step()
        step += 1
        rate = seen / max(time.perf_counter() - start, 1e-9)
        bar.update(1)
        bar.set_postfix(loss=f"{total:.4f}", ex_s=f"{rate:.1f}")
        history.append({"step": step, "loss": total})
        now = time.perf_counter()
        if not progress and now - said >= LOG_EVERY_S:
            said, per_step = now, (now - start) / (step - first)
            log.info(
                "step %d/%d loss %.4f, %.1f s a step so far, about %d min left",
                step,
                cfg.steps,
                total,
                per_step,
                math.ceil(per_step * (limit - step) / 60),
            )
        validate = step % cfg.eval_every == 0 or step in (cfg.steps, limit)
        if validate:
            metric = (
                validation_metric(rerank_queries(ranker, data, val_q, cfg.val_depth), data.qrels)
                if val_q
                else -total
            )
            if val_q:
                history[-1]["val_ndcg10"] = metric
                log.info("step %d loss %.4f val nDCG@10 %.4f", step, total, metric)
            else:  # no held-out queries (e.g. the pseudo-query stage): the last step is kept
                log.info("step %d loss %.4f (no validation)", step, total)
            if metric > best:
                best, best_step = metric, step
                save_checkpoint(
                    ranker,
                    out,
                    overwrite=True,
                    extra={
                        **record,
                        "train": {
                            **asdict(cfg),
                            "best_step": step,
                            "val_ndcg10": metric if val_q else None,
                            "val_qids": val_q,
                        },
                    },
                )
        if validate or time.perf_counter() - saved >= SAVE_EVERY_S:
            snapshot = {
                "config": asdict(cfg),
                "ranker": ranker_shape(ranker),
                "model": ranker.state_dict(),
                "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(),
                "scaler": scaler.state_dict(),
                "step": step,
                "best": best,
                "best_step": best_step,
                "history": history,
                "rng": rng.getstate(),
                "torch_rng": torch.get_rng_state(),
            }
            # whole or not at all: a run killed while writing keeps its last state
            atomic_write(state_path, functools.partial(torch.save, snapshot))
            saved = time.perf_counter()
    bar.close()
    ranker.eval()
    for p in frozen:  # frozen tables are given back
        p.requires_grad_(True)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "train-history.json", json.dumps(history))
    return TrainResult(step, best, best_step, time.perf_counter() - start, history, validated=bool(val_q))


def pretrain_compressor(
    ranker: Ranker,
    data: TrainingData,
    steps: int,
    lr: float = 1e-3,
    batch: int = 16,
    seed: int = 0,
    progress: bool = True,
) -> list[float]:
    """PreTTR: train only the compressor/decompressor on (query, candidate) pairs with the attention-MSE
    loss (eq. 2). Returns the loss per step."""
    from aheadrank.logs import progress_bar

    if ranker.kind != "prettr" or not ranker.config.compress:
        raise ValueError("pretrain_compressor needs a PreTTR ranker with a compressor (compress > 0)")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    params = [
        *ranker.compressor.parameters(),
        *ranker.decompressor.parameters(),
        *ranker.decompressor_norm.parameters(),
    ]
    opt = torch.optim.AdamW(params, lr=lr)
    trainable = {id(p) for p in params}
    frozen = [p for p in ranker.parameters() if id(p) not in trainable and p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    pairs = [(q, d) for q in sorted(data.candidates) if q in data.queries for d in data.candidates[q][:20]]
    ranker.train()
    losses = []
    for _ in progress_bar(range(steps), desc="compressor", disable=not progress):
        chosen = [pairs[rng.randrange(len(pairs))] for _ in range(batch)]
        q_ids, q_mask = pad(ranker.tokenize_queries([data.queries[q] for q, _ in chosen]), ranker.device)
        d_ids, d_mask = pad(ranker.tokenize_documents([data.texts[d] for _, d in chosen]), ranker.device)
        loss = ranker.attention_mse(q_ids, q_mask, d_ids, d_mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    for p in frozen:
        p.requires_grad_(True)
    ranker.eval()
    return losses
