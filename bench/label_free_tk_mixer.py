"""TK's mix of embedding and context, label-free: ``t̂ = α·t + (1−α)·context(t)`` at other starting α.

A ``tk-6l-base`` ranker starts from the base model: ``t`` its embedding, ``context`` its six layers, α (the
``mixer``, a trained parameter) 0.5. A label-free build does not fine-tune (``LABEL_FREE_STEPS``), so α stays at
its start, and the term vectors are half the base's embedding. The base's own last-layer token states matched by
MaxSim score far above TK's pure score (``bench/results/label-free/maxsim/``: Vaswani 0.5362 against 0.4466), which
asks whether the embedding half or the kernel pooling holds TK back. Here each collection is built again with every
default of ``aheadrank build --labels none`` but α's start (TK's kernel weights fitted to the teacher as always, its
store and priors its own), by ``bench/label_free.py`` in folders named ``tk-6l-base...-mixer<α>`` beside its
shared stages; the α = 0.5 rows are the committed default builds (``maxp-scifact/``, ``maxp-cranfield-vaswani/``).

Each collection's α is chosen on the other two, before its own judgments are read: the α with the largest mean
served nDCG@10 over the other two collections, 0.5 (the default) unless another beats it (``window-size/``'s
rule). The default changes only if every collection's held-out choice is the same α and none serves worse at it.

``--specials [ALPHA ...]`` adds the settings ``<α>+specials`` (α 0.5 unless given): each text encoded between [CLS] and [SEP] as the base was
trained (TK reads a text without them), their own vectors left out of the match (TK's ``tk_specials``, ``--tk-specials``).
``--maxsim`` adds rows that choose nothing: the α = 0 builds' stored vectors (with ``0+specials``, those too) scored by MaxSim in the kernels' place
(the same store, passages and aggregation), pure and served at that build's weights, to tell the kernels' part from
the vectors'.

    .venv/bin/python bench/label_free_tk_mixer.py --collections vaswani cranfield scifact --mixers 0 0.25 [--maxsim] [--specials [ALPHA ...]]

Writes ``--out`` (``bench/results/label-free/tk-mixer``): ``label_free_tk_mixer.{json,md}`` and, per setting,
``mixer<α>[-specials]/<collection>/`` (``bench/label_free.py``'s own JSON, table and runs of that build; the baselines' runs,
the same for every setting, kept under the first one's folder only).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

from torch import Tensor

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

log = logging.getLogger("bench.label_free_tk_mixer")

LF = ROOT / "bench" / "results" / "label-free"
TK = "tk-6l-base"
DEFAULT = 0.5
DEFAULT_LABEL = "0.5"  # the default setting's row: α = 0.5, the text without [CLS] and [SEP]
# the builds whose stored vectors --maxsim scores: (setting, its key in the results)
MAXSIM_ROWS = (("0", "maxsim_alpha0"), ("0+specials", "maxsim_alpha0_specials"))
# the committed default builds (α = 0.5, MaxP passages): {collection: results folder}
COMMITTED = {"scifact": LF / "maxp-scifact", "cranfield": LF / "maxp-cranfield-vaswani", "vaswani": LF / "maxp-cranfield-vaswani"}  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--collections", nargs="+", default=list(COMMITTED), choices=list(COMMITTED))
    ap.add_argument("--mixers", nargs="+", type=float, default=[0.0, 0.25], help="α's starts besides 0.5")
    ap.add_argument("--workdir", type=Path, default=ROOT / "work" / "label-free")
    ap.add_argument("--out", type=Path, default=LF / "tk-mixer")
    ap.add_argument(
        "--maxsim",
        action="store_true",
        help="also score the α = 0 builds' stored term vectors by MaxSim instead of TK's kernels (chooses nothing)",
    )
    ap.add_argument(
        "--specials",
        nargs="*",
        type=float,
        default=None,
        metavar="ALPHA",
        help="also build at each ALPHA (none given: 0.5) with each text encoded between [CLS] and [SEP] (as the base "
        "was trained; their own vectors left out of the match), settings like the others",
    )
    ap.add_argument("--no-progress", dest="progress", action="store_false")
    return ap.parse_args(argv)


def mixer_name(alpha: float, specials: bool = False) -> str:
    """The folders of a setting (its results, the suffix of its build)."""
    return f"mixer{alpha:g}" + ("-specials" if specials else "")


def label(alpha: float, specials: bool = False) -> str:
    """A setting's row."""
    return f"{alpha:g}" + ("+specials" if specials else "")


def build_at(args, name: str, alpha: float, specials: bool = False, baseline_runs: bool = True) -> Path:
    """``bench/label_free.py`` for ``name`` × ``tk-6l-base`` with α started at ``alpha`` (and with ``specials``, each
    text encoded between [CLS] and [SEP]); its results folder (the baselines' runs in it only with
    ``baseline_runs``)."""
    import label_free as lf

    out = args.out / mixer_name(alpha, specials) / name
    if (out / "label_free.json").is_file():
        return out
    argv = ["--data", str(args.data), "--collections", name, "--rankers", TK]
    argv += ["--workdir", str(args.workdir), "--out", str(out)]
    argv += [] if args.progress else ["--no-progress"]
    argv += [] if baseline_runs else ["--no-baseline-runs"]
    with started_at(alpha, specials):
        lf.main(argv)
        checkpoint_alpha(args.workdir / name / lf.build_name(recipe_args(), name, TK), alpha, specials)
    return out


@contextmanager
def started_at(alpha: float, specials: bool = False):
    """Within: every new TK ranker starts with α = ``alpha`` (a loaded checkpoint then overwrites it with what it
    saved), with ``specials`` every ``tk_base`` TK reads a text between [CLS] and [SEP] (its ``tk_specials`` option),
    and ``bench/label_free.py`` names its build folders ``...-mixer<α>[-specials]``."""
    import label_free as lf
    from aheadrank.rankers.tk import TkRanker

    first_init, first_name = TkRanker.__init__, lf.build_name

    def init(self, *a, **k):
        first_init(self, *a, **k)
        self.mixer.data.fill_(alpha)
        if specials and self.config.tk_base:
            self.config.tk_specials = True

    def build_name(*a, **k):
        return f"{first_name(*a, **k)}-{mixer_name(alpha, specials)}"

    with mock.patch.object(TkRanker, "__init__", init), mock.patch.object(lf, "build_name", build_name):
        yield


def recipe_args() -> argparse.Namespace:
    """The settings ``label_free.build_name`` reads, as ``bench/label_free.py``'s defaults make them."""
    import label_free as lf

    return lf.parse_args(["--rankers", TK])


def checkpoint_alpha(build: Path, alpha: float, specials: bool = False) -> None:
    """Refuse a build whose checkpoint does not hold α = ``alpha`` and TK's ``tk_specials`` as ``specials``."""
    from aheadrank.rankers.checkpoint import load_config
    from safetensors.torch import load_file

    from aheadrank.build import paths

    checkpoint = paths(build)["checkpoint"]
    got = float(load_file(str(checkpoint / "model.safetensors"))["mixer"])
    if abs(got - alpha) > 1e-6:
        raise SystemExit(f"{build}: the checkpoint's mixer is {got}, not {alpha}")
    if bool(load_config(checkpoint).tk_specials) != specials:
        raise SystemExit(f"{build}: the checkpoint's tk_specials is not {specials}")
    log.info("%s: mixer %.2f as asked, tk_specials %s", build.name, got, specials)


def rows_of(folder: Path, name: str) -> dict:
    """(pure, served) nDCG@10 and the served run's path of ``tk-6l-base`` in ``bench/label_free.py``'s output."""
    result = next(
        r for r in json.loads((folder / "label_free.json").read_text())["results"] if r["collection"] == name
    )
    runs = result["variants"][TK]["runs"]
    return {
        "pure": runs[TK]["ndcg10"],
        "served": runs[f"{TK}+priors"]["ndcg10"],
        "weights": result["variants"][TK]["weights"],
        "runs": folder / name / "runs",
        "baselines": result["baselines"],
    }


def maxsim_score(q: Tensor, q_mask: Tensor, d: Tensor, d_mask: Tensor) -> Tensor:
    """MaxSim in ``TkRanker.kernel_score``'s place: q [1 or B, Tq, n], d [B, Td, n] (unit rows) -> [B], the mean over
    the query's terms of each one's best cosine with the document's."""
    import torch

    if not isinstance(d, torch.Tensor):
        raise SystemExit("MaxSim reads a float store only")
    m = torch.matmul(q, d.to(q.dtype).transpose(1, 2)).masked_fill(~d_mask.bool()[:, None, :], float("-inf"))
    qm = q_mask.to(q.dtype)
    return (m.max(-1).values.nan_to_num(0.0, neginf=0.0) * qm).sum(1) / qm.sum(1).clamp(min=1.0)


def maxsim_rows(args, name: str, weights: dict, specials: bool = False) -> dict:
    """Pure and served runs of the α = 0 build of ``name`` (with ``specials``: its ``0+specials`` build, queries encoded
    as it encodes them) with MaxSim over its stored vectors as its score."""
    import label_free as lf
    from aheadrank.rankers.tk import TkRanker
    from benchkit import Bm25Hits, eval_topics

    from aheadrank.build import paths

    build = args.workdir / name / f"{lf.build_name(recipe_args(), name, TK)}-{mixer_name(0.0, specials)}"
    checkpoint_alpha(build, 0.0, specials)
    queries, qrels = eval_topics(args.data / name, "test", None)
    cands = Bm25Hits(args.data / name, args.workdir, args.progress).hits(queries, lf.DEPTH)
    calls = []

    def score(self, q, q_mask, d, d_mask):
        calls.append(1)
        return maxsim_score(q, q_mask, d, d_mask)

    p, aggregation = paths(build), recipe_args().aggregation
    # the checkpoint holds α and tk_specials: the queries are encoded as the build encoded its documents
    with mock.patch.object(TkRanker, "kernel_score", score):
        vf = lf.neural_features(
            p["checkpoint"], p["store"], queries, cands, qrels, "cpu", args.progress, aggregation
        )
    if not calls:
        raise SystemExit(f"{name}: the store was not scored through TkRanker.kernel_score")
    return {"pure": lf.runs_from(vf, {"neural": 1.0}), "served": lf.runs_from(vf, weights)}


def chosen(served: dict[str, dict[str, float]], held_out: str) -> str:
    """The setting with the largest mean served nDCG@10 over the collections other than ``held_out``; the default unless
    another beats it."""
    others = [c for c in served if c != held_out]
    alphas = sorted(next(iter(served.values())))
    mean = {a: sum(served[c][a] for c in others) / len(others) for a in alphas}
    best = max(alphas, key=lambda a: (mean[a], a == DEFAULT_LABEL))
    return best if mean[best] > mean[DEFAULT_LABEL] else DEFAULT_LABEL


def bench(args) -> dict:
    import label_free as lf
    from benchkit import eval_topics

    from aheadrank.evaluation import compare, evaluate, read_run

    specials = (args.specials or [DEFAULT]) if args.specials is not None else []
    settings = [(alpha, False) for alpha in args.mixers] + [(alpha, True) for alpha in specials]
    table: dict[str, dict[str, dict]] = {}
    for name in args.collections:
        table[name] = {DEFAULT_LABEL: rows_of(COMMITTED[name], name)}
        for alpha, special in settings:
            # the baselines' runs, the same for every setting, written into the first setting's folder only
            first = (alpha, special) == settings[0]
            table[name][label(alpha, special)] = rows_of(build_at(args, name, alpha, special, first), name)
    served = {c: {a: r["served"] for a, r in rows.items()} for c, rows in table.items()}
    out: dict = {"collections": {}}
    for name, rows in table.items():
        _, qrels = eval_topics(args.data / name, "test", None)
        # the baselines' runs of this run (the committed SciFact MaxP folder holds none); the same as committed
        fresh = next(r for a, r in rows.items() if a != DEFAULT_LABEL)
        for k, v in fresh["baselines"].items():
            if abs(v - rows[DEFAULT_LABEL]["baselines"][k]) > 5e-4:
                raise SystemExit(
                    f"{name}: {k} gives {v:.4f} here, {rows[DEFAULT_LABEL]['baselines'][k]:.4f} committed"
                )
        # the better label-free fusion
        best = max(("rrf", "fusion-equal"), key=lambda k: fresh["baselines"][k])
        fusion = read_run(fresh["runs"] / f"{best}.trec.zst")
        default = read_run(rows[DEFAULT_LABEL]["runs"] / f"{TK}+priors.trec.zst")
        entry = {"alphas": {}, "chosen": chosen(served, name) if len(table) > 1 else None}
        for setting, r in sorted(rows.items()):
            run = read_run(r["runs"] / f"{TK}+priors.trec.zst")
            entry["alphas"][setting] = {
                "pure": r["pure"],
                "served": r["served"],
                "weights": r["weights"],
                "vs_default": lf.comparison(compare, default, run, qrels),
                "vs_fusion": lf.comparison(compare, fusion, run, qrels),
            }
        entry["best_fusion"] = {"run": best, "ndcg10": fresh["baselines"][best]}
        for setting, key in MAXSIM_ROWS:
            if not (args.maxsim and setting in rows):
                continue
            ms = maxsim_rows(args, name, rows[setting]["weights"], specials=setting.endswith("+specials"))
            entry[key] = {
                "pure": evaluate(ms["pure"], qrels, ("nDCG@10",))["nDCG@10"],
                "served": evaluate(ms["served"], qrels, ("nDCG@10",))["nDCG@10"],
                "weights": rows[setting]["weights"],
                "vs_default": lf.comparison(compare, default, ms["served"], qrels),
                "vs_fusion": lf.comparison(compare, fusion, ms["served"], qrels),
            }
        out["collections"][name] = entry
    return out


def table_of(result: dict) -> str:
    import label_free as lf

    lines = [
        "| collection | α | pure | served | vs α = 0.5 (diff, p) | vs the better fusion (diff, p) | chosen on the others |"
    ]
    lines.append("|---|---:|---:|---:|---|---|---|")
    for name, entry in result["collections"].items():
        alphas = dict(entry["alphas"])
        for setting, key in MAXSIM_ROWS:
            if key in entry:
                alphas[f"{setting}, MaxSim for the kernels"] = entry[key]
        for alpha, r in alphas.items():
            mark = "**chosen**" if entry["chosen"] == alpha else ""
            lines.append(
                f"| {name} | {alpha} | {r['pure']:.4f} | {r['served']:.4f} | {lf.diff_p(r['vs_default'])} | "
                f"{lf.diff_p(r['vs_fusion'])} vs {entry['best_fusion']['run']} | {mark} |"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    import label_free as lf

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(argv)
    t0 = time.perf_counter()
    result = bench(args)
    lf.write_outputs(args.out, "label_free_tk_mixer", table_of(result), argv, result, t0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
