"""Label-free builds measured: each collection built by ``aheadrank build --labels none`` (no judgment of it is
read until the test split is evaluated), against what a user could assemble without labels, in one run.

Per collection (BEIR folders with a test split): BM25 top-100 of the test queries, the bi-encoder alone, RRF
(k = 60) and the equal-weight z-score fusion of the two (the baselines); per ranker variant the pure neural
score and the served score (neural + priors, the checkpoint's ``priors.json``: ``aheadrank.build``'s label-free
default weights), plus the priors fitted on held-out pseudo-queries (``--priors pseudo``) computed from the same
features. Paired t-tests against the better of RRF and the equal-weight fusion, and against BM25. Rows that choose
nothing: ``+neural0.2`` / ``+neural0.5`` (the served score at other neural shares) and, for a kind whose share is
not 1/3 (``aheadrank.build.LABEL_FREE_NEURAL_SHARE``: chosen on every collection's test judgments), ``+share1/3``:
the served score at the share fixed before anything was measured, the one that saw no judgment.

    .venv/bin/python bench/label_free.py --collections scifact cranfield vaswani \\
        --rankers mores-2ib-s2 prettr-l5-e128 tk-6l-base [--device cuda] [--steps N]

Writes ``--out`` (default bench/results/label-free): ``label_free.json``, ``label_free.md`` and the TREC runs
``<collection>/runs/{bm25,bi-encoder,rrf,fusion-equal,<variant>,<variant>+priors}.trec.zst``.
``--prepare`` runs only what needs Java (the BM25 stages and the test queries' hits), so that the rest can run
on a machine without it (bench/device/label_free.sh). ``--split train`` evaluates the train split's queries instead
(``results/label-free/train-split*/``): queries no label-free setting was chosen on, for replications; nothing may be
chosen on SciFact's, whose label-free results must stay blind to its judgments.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
log = logging.getLogger("bench.label_free")
DEPTH = 100


def parse_args(argv=None) -> argparse.Namespace:
    from aheadrank.rankers.recipe import training_options
    from benchkit import add_options, add_split_option

    from aheadrank.passages import AGGREGATIONS, LABEL_FREE_AGGREGATION

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--collections", nargs="+", default=["scifact", "cranfield", "vaswani"])
    ap.add_argument("--rankers", nargs="+", default=["mores-2ib-s2", "prettr-l5-e128", "tk-6l-base"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--recipe", default="auto")
    ap.add_argument("--max-queries", type=int, default=3000)
    # aheadrank train's
    add_options(ap, [o for o in training_options() if o.name in ("steps", "ce_weight", "lr", "fresh_lr")])
    ap.add_argument(
        "--fit-head",
        action="store_true",
        help="bert, MORES, PreTTR: the score head ridge-fitted to the teacher first (aheadrank build --fit-head); "
        "builds in VARIANT[...]-fit-head",
    )
    ap.add_argument("--workdir", type=Path, default=ROOT / "work" / "label-free")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "label-free")
    ap.add_argument("--base", default=None)
    ap.add_argument("--max-test-queries", type=int, default=None)
    add_split_option(ap)
    ap.add_argument(
        "--depth",
        type=int,
        default=DEPTH,
        help="rerank BM25's top N test candidates; the baselines are over the same N (the builds do not change)",
    )
    ap.add_argument("--prepare", action="store_true", help="only the stages that need Java, then stop")
    ap.add_argument(
        "--sources",
        nargs="+",
        default=[],
        metavar="TARGET=A+B",
        help="transfer: the ranker of TARGET starts from a checkpoint trained on the judgments of collections A, "
        "B (every judged query of each; never TARGET's), then --transfer-steps label-free steps on TARGET",
    )
    ap.add_argument(
        "--transfer-steps", type=int, default=0, help="label-free steps after the transfer (0: as is)"
    )
    add_build_name_options(ap, steps=False)  # --steps: aheadrank train's, above
    ap.add_argument(
        "--aggregation",
        default=LABEL_FREE_AGGREGATION,
        choices=AGGREGATIONS,
        help="with --passages: how a document's score comes from its passages' in the measured runs "
        "(default: what a label-free build records for serve, aheadrank.passages.LABEL_FREE_AGGREGATION; "
        "before it was recorded the default was first+max); the build and its priors are the same",
    )
    ap.add_argument(
        "--no-baseline-runs",
        dest="baseline_runs",
        action="store_false",
        help="leave the baselines' runs unwritten (their numbers stay in the JSON): for a setting's run beside "
        "another folder that holds them",
    )
    ap.add_argument("--no-progress", dest="progress", action="store_false")
    args = ap.parse_args(argv)
    args.sources = parse_sources(args.sources, args.collections)
    return args


def parse_sources(given: list[str], collections: list[str]) -> dict[str, list[str]]:
    """{target: [source collections]} from TARGET=A+B; a target among its own sources is refused."""
    out = {}
    for item in given:
        target, _, rest = item.partition("=")
        sources = [x for x in rest.split("+") if x]
        if not sources or target in sources:
            raise SystemExit(f"--sources {item!r}: give TARGET=A[+B...] with TARGET not among its sources")
        out[target] = sources
    return out


def merged_collection(data: Path, names: list[str], out: Path) -> Path:
    """A BEIR folder of the collections ``names`` together (ids prefixed ``name/``), whose ``train`` split is every
    judged query of each (their train and test splits): what a transferred ranker is trained on."""
    import json

    from aheadrank.indexer.topics import read_beir_split

    if (out / "qrels" / "train.tsv").is_file():
        return out
    tmp = out.with_name(out.name + ".partial")
    (tmp / "qrels").mkdir(parents=True, exist_ok=True)
    with (
        open(tmp / "corpus.jsonl", "w") as corpus,
        open(tmp / "queries.jsonl", "w") as qf,
        open(tmp / "qrels" / "train.tsv", "w") as qr,
    ):
        qr.write("query-id\tcorpus-id\tscore\n")
        for name in names:
            with open(data / name / "corpus.jsonl") as f:
                for line in f:
                    doc = json.loads(line)
                    doc["_id"] = f"{name}/{doc['_id']}"
                    corpus.write(json.dumps(doc) + "\n")
            splits = sorted(p.stem for p in (data / name / "qrels").glob("*.tsv") if p.stem != "all")
            for split in splits:
                queries, qrels = read_beir_split(data / name, split)
                for q, text in queries.items():
                    if any(r > 0 for r in qrels.get(q, {}).values()):
                        qf.write(json.dumps({"_id": f"{name}/{split}/{q}", "text": text}) + "\n")
                        for d, r in qrels[q].items():
                            qr.write(f"{name}/{split}/{q}\t{name}/{d}\t{r}\n")
    tmp.rename(out)
    return out


def source_checkpoint(args, target: str, variant: str) -> tuple[Path, dict]:
    """The checkpoint of ``variant`` trained (the recipe, judged) on ``target``'s source collections, built once
    per source set; and its build record."""
    from aheadrank.build import BuildPlan, build, paths

    names = args.sources[target]
    key = "+".join(names)
    collection = merged_collection(args.data, names, args.workdir / "sources" / key / "collection")
    out = args.workdir / "sources" / key / variant
    # the shared stages (BM25, dense field) of the source set: from the first variant built over it
    built = [d for d in sorted((args.workdir / "sources" / key).iterdir()) if (d / "build.json").is_file()]
    reuse = next((d for d in built if d != out), None)
    plan = BuildPlan(
        collection=str(collection),
        out=str(out),
        ranker=variant,
        device=args.device,
        labels="train",
        recipe=args.recipe,
        steps=args.steps,
        base=args.base,
        reuse=str(reuse) if reuse else None,
        progress=args.progress,
    )
    record = build(plan, echo=log.info)
    return paths(out)["checkpoint"], record.stages


def plan_for(args, collection: Path, ranker: str, out: Path, reuse: Path | None = None, init=None):
    from aheadrank.build import BuildPlan

    return BuildPlan(
        collection=str(collection),
        out=str(out),
        ranker=ranker,
        device=args.device,
        labels="none",
        recipe=args.recipe,
        steps=args.transfer_steps if init else args.steps,
        max_queries=args.max_queries,
        init=str(init) if init else None,
        ce_weight=args.ce_weight,
        lr=args.lr,
        fresh_lr=args.fresh_lr,
        fit_head=args.fit_head or None,
        positive=args.positive,
        teacher=args.teacher,
        base=args.base,
        reuse=str(reuse) if reuse else None,
        progress=args.progress,
        passages=args.passages,
        dtype=args.dtype,
    )


def build_name(args, collection: str, variant: str, transfer: bool = False) -> str:
    """The build folder of ``variant`` under the collection's workdir: every setting that changes the trained ranker
    or its store away from the first label-free recipe (source positives, no passages) is in the name, so that a run with other settings never resumes (or is refused by) a
    build made with these."""
    name = (
        f"{variant}-from-{'+'.join(args.sources[collection])}-{args.transfer_steps}" if transfer else variant
    )
    if args.steps is not None and not transfer:  # a transfer's steps are --transfer-steps, named above
        name += f"-steps{args.steps}"
    if args.ce_weight is not None:
        name += f"-ce{args.ce_weight:g}"
    if args.positive != "source":
        name += f"-positive-{args.positive}"
    if args.teacher != "fusion":
        name += f"-teacher-{args.teacher}"
    if args.lr is not None:
        name += f"-lr{args.lr:g}"
    if args.fresh_lr is not None:
        name += f"-fresh-lr{args.fresh_lr:g}"
    if args.fit_head:
        name += "-fit-head"
    if args.passages:  # the same ranker, another store
        name += "-passages"
    if args.dtype != "float16":  # the same ranker, another store
        name += f"-{args.dtype}"
    return name


def add_build_name_options(ap: argparse.ArgumentParser, steps: bool = True, passages: bool = True) -> None:
    """The settings that name this bench's build folders (:func:`build_name`): this bench's own, and those of a
    script that reads its builds."""
    from aheadrank.store.spec import DTYPES

    from aheadrank.build import POSITIVES, TEACHER_NAMES, BuildPlan

    if steps:
        ap.add_argument("--steps", type=int, default=None)
    # the build's own setting by default (BuildPlan's); another value builds in a folder named for it
    for flag, choices, what in (
        ("positive", POSITIVES, "label-free positive (aheadrank build --positive); teacher builds in VARIANT-positive-teacher"),
        ("teacher", list(TEACHER_NAMES), "label-free teacher (aheadrank build --teacher); others build in VARIANT[...]-teacher-TEACHER"),
        ("dtype", list(DTYPES), "the store's dtype (aheadrank build --dtype); other than float16 builds in VARIANT[...]-DTYPE"),
    ):  # fmt: skip
        ap.add_argument(f"--{flag}", default=getattr(BuildPlan, flag), choices=choices, help=what)
    if passages:
        ap.add_argument(
            "--passages",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="store documents longer than the ranker's window as passages too, scored by them as served "
            "(aheadrank build --passages, a label-free build's default); builds in VARIANT[...]-passages",
        )


def recipe_settings(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with the settings :func:`build_name` reads that a reading script does not take: the recipe's."""
    from aheadrank.build import BuildPlan

    args.ce_weight = args.lr = args.fresh_lr = None
    args.fit_head = False
    args.sources, args.transfer_steps = {}, 0
    args.passages = getattr(args, "passages", True)
    args.dtype = getattr(args, "dtype", BuildPlan.dtype)
    return args


def write_outputs(out: Path, stem: str, md: str, argv, extra: dict, t0: float) -> None:
    """``out/<stem>.md`` (the table) and ``out/<stem>.json`` (the command, the machine, ``extra``)."""
    from benchkit import machine_info, write_json

    print(md)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text(md + "\n")
    command = ["python", f"bench/{stem}.py", *(argv if argv is not None else sys.argv[1:])]
    payload = {"benchmark": stem, "command": command, "machine": machine_info(2), **extra}
    write_json(out / f"{stem}.json", {**payload, "wall_s": round(time.perf_counter() - t0, 1)})


def run_probe(argv, parse_args, bench_collection, table, stem: str, **extra) -> int:
    """A probe's whole run: ``bench_collection(args, name)`` per collection, then :func:`write_outputs` of
    ``table(results)`` and ``{**extra, "results": results}`` under ``stem``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(argv)
    t0 = time.perf_counter()
    results = [bench_collection(args, name) for name in args.collections]
    write_outputs(args.out, stem, table(results), argv, {**extra, "results": results}, t0)
    return 0


def runs_from(features: list, docids_weights) -> dict:
    """{qid: {docid: score}} of Σ w·zscore(feature) per query (``features``: (qid, QueryFeatures))."""
    from aheadrank.priors import zscore

    run = {}
    for qid, q in features:
        s = sum(w * zscore(q.features[f]) for f, w in docids_weights.items() if w)
        run[qid] = dict(zip(q.docids, np.asarray(s, dtype=np.float64).tolist(), strict=True))
    return run


def equal_share_weights(served: dict[str, float]) -> dict[str, float] | None:
    """The served weights over ``served``'s features with the neural share at 1/3 (``aheadrank.build.share_weights``,
    the share fixed before anything was measured), or None where ``served`` already has it. A kind listed in
    ``aheadrank.build.LABEL_FREE_NEURAL_SHARE`` (PreTTR, TK: 1/6) got its share from a rule over the test judgments
    of SciFact, Cranfield and Vaswani (``bench/results/label-free/loo/``), so its ``+priors`` row saw this
    collection's judgments; its ``+share1/3`` row saw none."""
    w = third_share_weights(list(served))
    if w is None:
        return None
    return None if all(abs(w[f] - served[f]) < 1e-9 for f in w) else w


def third_share_weights(names: list[str]) -> dict[str, float] | None:
    """``names``' weights at the neural share 1/3, BM25 and the bi-encoder the rest in equal parts (the window prior,
    where present, at the bi-encoder's): a label-free MORES build's (``aheadrank.build.share_weights``); None for a
    feature set it has no weights for."""
    from fractions import Fraction

    from aheadrank.build import share_weights

    for key, w in share_weights(Fraction(1, 3), window="window" in names).items():
        if set(key.split("+")) == set(names):
            return w
    return None


def label_free_baselines(features: list) -> dict:
    """The runs a user can assemble without labels from (qid, QueryFeatures) with ``bm25`` and ``dense``: BM25, the
    bi-encoder, RRF (k = 60) and the equal-weight z-score fusion."""
    from aheadrank.baselines import EQUAL_FUSION, rrf_run

    return {
        "bm25": runs_from(features, {"bm25": 1.0}),
        "bi-encoder": runs_from(features, {"dense": 1.0}),
        "rrf": rrf_run(dict(features)),
        "fusion-equal": runs_from(features, EQUAL_FUSION),
    }


def write_zst_run(path: Path, run: dict, tag: str) -> None:
    """``NAME.trec.zst``; where zstandard is not installed (a GPU machine), ``NAME.trec``."""
    from aheadrank.evaluation import write_run

    plain = path.with_suffix("")
    write_run(plain, run, tag)
    try:
        import zstandard
    except ImportError:
        return
    path.write_bytes(zstandard.ZstdCompressor(level=19).compress(plain.read_bytes()))
    plain.unlink()


def comparison(compare, a: dict, b: dict, qrels: dict) -> dict:
    c = compare(a, b, qrels)
    return {"diff": round(c.mean_diff, 4), "p": c.p}


def diff_p(c: dict) -> str:
    """A :func:`comparison` as a table shows it: ``+0.0123 (p 0.045)``."""
    return f"{c['diff']:+.4f} (p {c['p']:.2g})"


def probe_setup(args, name: str):
    """What a probe of a finished build reads first: (the build's folder, test queries, qrels, BM25 top-DEPTH
    candidates, their label-free features, the judged qids, the baselines' runs, their nDCG@10, the better of RRF
    and the equal-weight fusion). A SystemExit where :func:`build_name`'s build is missing."""
    from benchkit import Bm25Hits, eval_topics

    from aheadrank.baselines import dense_features
    from aheadrank.build import paths
    from aheadrank.evaluation import evaluate

    collection = args.data / name
    build = args.workdir / name / build_name(args, name, args.ranker)
    if not (build / "build.json").is_file():
        raise SystemExit(f"no build at {build}: run bench/label_free.py with the same settings first")
    queries, qrels = eval_topics(collection, getattr(args, "split", "test"), None)
    cands = Bm25Hits(collection, args.workdir, False).hits(queries, getattr(args, "depth", DEPTH))
    feats = dense_features(
        paths(args.workdir / name / "shared")["dense"], queries, cands, qrels, device=args.device
    )
    qids = sorted(q for q in feats if any(r > 0 for r in qrels.get(q, {}).values()))
    baselines = label_free_baselines([(q, feats[q]) for q in qids])
    scores = {k: evaluate(r, qrels, ("nDCG@10",))["nDCG@10"] for k, r in baselines.items()}
    best = max(("rrf", "fusion-equal"), key=scores.get)
    return build, queries, qrels, cands, feats, qids, baselines, scores, best


def pure_and_served(vf: list, qrels: dict, baselines: dict, best: str, extra: dict | None = None) -> dict:
    """``{"pure": row, "served": row}`` of (qid, QueryFeatures with ``neural``): the neural score alone and with BM25
    and the bi-encoder (1/3 each), plus a row per ``extra`` {name: weights}, each row its nDCG@10 and its
    comparisons with BM25 and with ``best``."""
    from aheadrank.evaluation import compare, evaluate

    out = {}
    rows = {
        "pure": {"neural": 1.0},
        "served": {"neural": 1 / 3, "bm25": 1 / 3, "dense": 1 / 3},
        **(extra or {}),
    }
    for kind, w in rows.items():
        run = runs_from(vf, w)
        out[kind] = {
            "ndcg10": evaluate(run, qrels, ("nDCG@10",))["nDCG@10"],
            "vs_bm25": comparison(compare, baselines["bm25"], run, qrels),
            "vs_best_baseline": comparison(compare, baselines[best], run, qrels),
        }
    return out


def window_table(results: list[dict], key: str, label: str) -> str:
    """The probes' table of runs per window (``bench/label_free_window.py``, ``label_free_sentence_windows.py``):
    for each collection its BM25 and better fusion (and ``ranker_window`` where the result has one), then a row per
    run of each ``result[key]`` entry (``{"runs": {name: {"ndcg10", "vs_bm25", "vs_best_baseline"}}}``), its first
    column headed ``label``."""
    lines = []
    for r in results:
        b, best = r["baselines"], r["best_baseline"]
        own = f"the ranker's window {r['ranker_window']}; " if "ranker_window" in r else ""
        lines.append(f"\n### {r['collection']} ({own}BM25 {b['bm25']:.4f}, {best} {b[best]:.4f})\n")
        lines.append(f"| {label} | run | nDCG@10 | vs BM25 (diff, p) | vs better fusion (diff, p) |")
        lines.append("|---:|---|---:|---|---|")
        for window, row in r[key].items():
            for name, x in row["runs"].items():
                lines.append(
                    f"| {window} | {name} | {x['ndcg10']:.4f} | {diff_p(x['vs_bm25'])} | "
                    f"{diff_p(x['vs_best_baseline'])} |"
                )
    return "\n".join(lines)


def neural_features(
    ckpt: Path,
    store: Path,
    queries: dict,
    cands: dict,
    qrels: dict,
    device: str,
    progress: bool,
    aggregation: str,
):
    """(qid, QueryFeatures) over the test candidates: neural (through the store; a document stored as passages
    scored by ``aggregation`` of theirs), BM25, dense."""
    from aheadrank.rerank import collect_features

    qids = sorted(q for q in queries if cands.get(q) and any(r > 0 for r in qrels.get(q, {}).values()))
    feats, _ = collect_features(
        ckpt,
        store,
        {q: queries[q] for q in qids},
        cands,
        qrels,
        device,
        progress,
        aggregation,
    )
    return list(zip(qids, feats, strict=True))


def pseudo_fitted_weights(build_dir: Path, device: str, progress: bool) -> dict:
    """The weights of every feature the build serves (neural, BM25, bi-encoder; its best window where the store has
    sentence windows) fitted on the build's held-out pseudo-queries (not written anywhere)."""
    from aheadrank.build import paths, pseudo_validation
    from aheadrank.priors import fit_priors
    from aheadrank.rerank import collect_features

    p = paths(build_dir)
    val, cands, qrels = pseudo_validation(build_dir)
    feats, dense = collect_features(p["checkpoint"], p["store"], val, cands, qrels, device, progress)
    return fit_priors(feats, dense, {}).widest()


def bench_collection(args, name: str, variants: list[str]) -> dict:
    from benchkit import Bm25Hits, eval_topics

    from aheadrank.baselines import dense_features
    from aheadrank.build import build, paths, read_record
    from aheadrank.evaluation import compare, evaluate

    collection = args.data / name
    work = args.workdir / name
    hits = Bm25Hits(collection, args.workdir, args.progress)
    shared = work / "shared"
    until = "queries" if args.prepare else "dense"  # --prepare: what needs Java only
    build(plan_for(args, collection, variants[0], shared), search=hits.hits, until=until, echo=log.info)
    queries, qrels = eval_topics(collection, args.split, args.max_test_queries)
    cands = hits.hits(queries, args.depth)
    if args.prepare:
        return {}
    out_runs = args.out / name / "runs"
    out_runs.mkdir(parents=True, exist_ok=True)
    feats = dense_features(paths(shared)["dense"], queries, cands, qrels, device=args.device, base=args.base)
    qids = sorted(q for q in feats if any(r > 0 for r in qrels.get(q, {}).values()))
    base_feats = [(q, feats[q]) for q in qids]
    baselines = label_free_baselines(base_feats)
    result = {
        "collection": name,
        "test_queries": len(qids),
        "split": args.split,
        "depth": args.depth,
        "baselines": {},
        "variants": {},
    }
    for run_name, run in baselines.items():
        result["baselines"][run_name] = evaluate(run, qrels, ("nDCG@10",))["nDCG@10"]
        if args.baseline_runs:
            write_zst_run(out_runs / f"{run_name}.trec.zst", run, run_name)
    best = max(("rrf", "fusion-equal"), key=lambda k: result["baselines"][k])
    result["best_label_free_baseline"] = best
    shared_record = read_record(shared)
    result["shared_stages"] = shared_record.stages if shared_record else {}
    for v in variants:
        t0 = time.perf_counter()
        init, source = source_checkpoint(args, name, v) if name in args.sources else (None, None)
        d = work / build_name(args, name, v, transfer=init is not None)
        record = build(
            plan_for(args, collection, v, d, reuse=shared, init=init), search=hits.hits, echo=log.info
        )
        p = paths(d)
        vf = neural_features(
            p["checkpoint"], p["store"], queries, cands, qrels, args.device, args.progress, args.aggregation
        )
        from aheadrank.priors import read_priors

        served_w = read_priors(p["checkpoint"]).widest()
        pseudo_w = pseudo_fitted_weights(d, args.device, args.progress)
        runs = {
            v: runs_from(vf, {"neural": 1.0}),
            f"{v}+priors": runs_from(vf, served_w),
            f"{v}+pseudo-priors": runs_from(vf, pseudo_w),
        }
        source_w = None
        if init is not None:  # the weights fitted on the source collections' held-out judged queries
            source_w = read_priors(init).weights["neural+bm25+dense"]
            runs[f"{v}+source-priors"] = runs_from(vf, source_w)
        rest = [f for f in served_w if f != "neural"]
        for k in (0.2, 0.5):  # sensitivity of the default's neural share (not used to choose anything)
            runs[f"{v}+neural{k}"] = runs_from(vf, {"neural": k, **{f: (1 - k) / len(rest) for f in rest}})
        # a kind whose share saw every collection's judgments: its served score at the share 1/3, which saw none
        equal = equal_share_weights(served_w)
        if equal is not None:
            runs[f"{v}+share1/3"] = runs_from(vf, equal)
        row = {
            "weights": served_w,
            "pseudo_weights": pseudo_w,
            "build": record.stages,
            "runs": {},
            "sources": args.sources.get(name),
            "source_weights": source_w,
            "source_build": source,
        }
        for run_name, run in runs.items():
            row["runs"][run_name] = {
                "ndcg10": evaluate(run, qrels, ("nDCG@10",))["nDCG@10"],
                "vs_bm25": comparison(compare, baselines["bm25"], run, qrels),
                "vs_best_baseline": comparison(compare, baselines[best], run, qrels),
            }
            if run_name in (v, f"{v}+priors"):
                write_zst_run(out_runs / f"{run_name}.trec.zst", run, run_name.replace("+", "_"))
        row["seconds"] = round(time.perf_counter() - t0, 1)
        result["variants"][v] = row
        log.info("%s %s: %s", name, v, {k: round(r["ndcg10"], 4) for k, r in row["runs"].items()})
    return result


def table(results: list[dict]) -> str:
    lines = []
    for r in results:
        b = r["baselines"]
        lines.append(
            f"\n### {r['collection']} ({r['test_queries']} {r.get('split', 'test')} queries, BM25 top-{r.get('depth', DEPTH)})\n"
        )
        for name, row in r["variants"].items():
            if row.get("sources"):
                lines.append(
                    f"{name}: trained on the judgments of {' + '.join(row['sources'])} (never {r['collection']}'s), "
                    f"then {row['build'].get('train', {}).get('steps', 0)} label-free steps on {r['collection']}\n"
                )
        lines.append(
            "| run | nDCG@10 | vs BM25 (diff, p) | vs best label-free fusion (diff, p) | weights n/b/d(/w) |"
        )
        lines.append("|---|---:|---|---|---|")
        for k, v in b.items():
            lines.append(f"| {k} | {v:.4f} | | | |")
        for _name, row in r["variants"].items():
            for run_name, x in row["runs"].items():
                w = (
                    row["weights"]
                    if run_name.endswith("+priors")
                    else row["pseudo_weights"]
                    if "pseudo" in run_name
                    else row.get("source_weights")
                    if "source" in run_name
                    else None
                )
                ws = (
                    "/".join(f"{w[f]:.2f}" for f in ("neural", "bm25", "dense", "window") if f in w)
                    if w
                    else ""
                )
                lines.append(
                    f"| {run_name} | {x['ndcg10']:.4f} | {x['vs_bm25']['diff']:+.4f} ({x['vs_bm25']['p']:.2g}) | "
                    f"{x['vs_best_baseline']['diff']:+.4f} ({x['vs_best_baseline']['p']:.2g}) vs {r['best_label_free_baseline']} | {ws} |"
                )
        lines.append(
            "\nbuild stages (s): "
            + ", ".join(
                f"{n}: "
                + " ".join(
                    f"{s}={i.get('seconds', 0):.0f}" for s, i in row["build"].items() if "reused" not in i
                )
                for n, row in r["variants"].items()
            )
            + "; shared: "
            + " ".join(f"{s}={i.get('seconds', 0):.0f}" for s, i in r["shared_stages"].items())
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from benchkit import machine, write_record

    t0 = time.perf_counter()
    results = []
    for name in args.collections:
        r = bench_collection(args, name, args.rankers)
        if r:
            results.append(r)
            # written after each collection: a run cut off keeps what it finished
            write_record(
                args.out / "label_free.json", "label_free", argv, machine(args.device), t0, results=results
            )
    if args.prepare:
        return 0
    text = table(results)
    print(text)
    (args.out / "label_free.md").write_text("# Label-free builds (bench/label_free.py)\n" + text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
