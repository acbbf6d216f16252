"""``aheadrank build``: from a collection and nothing else to a served ranker, in resumable stages.

    collection -> bm25 -> queries -> dense -> train -> store -> priors

- ``collection``: the collection is read once (BEIR folder, JSONL or TSV, plain or compressed); a collection
  that cannot be used is refused with one clear line.
- ``bm25``: the Lucene index (Pyserini), ``DIR/lucene``.
- ``queries``: training queries. Without judgments (the default when the collection has no
  ``qrels/train.tsv``, or ``labels="none"``): pseudo-queries cut from the collection itself
  (:func:`aheadrank.indexer.pseudo_queries.label_free_queries`: titles, sentences or spans, inverse cloze),
  with their BM25 top-100, saved to ``DIR/queries.json.gz`` so later stages need no Java.
- ``dense``: the base bi-encoder's document embeddings, ``DIR/dense-field`` (the teacher's and the dense prior's).
- ``train``: the measured recipe (:mod:`aheadrank.rankers.recipe`) into ``DIR/checkpoint``; label-free: the
  cross-entropy on each pseudo-query's positive (by default the fusion's best candidate other than its source,
  ``positive="teacher"``; or the source itself) plus listwise KL from the equal-weight BM25 +
  bi-encoder fusion (:data:`aheadrank.baselines.EQUAL_FUSION`), negatives drawn ``spread`` (a document near many
  pseudo-queries is drawn less often, so it does not recur as a negative).
- ``store``: the representation store and its dense field, ``DIR/store``; label-free (or asked), documents longer
  than the ranker's window as passages too (:func:`stores_passages`).
- ``priors``: how the neural score is combined with BM25 and the bi-encoder. With judgments: fitted on the
  judged queries the trainer held out. Without: :func:`label_free_weights` (``priors="default"``), or fitted on
  the held-out pseudo-queries (``priors="pseudo"``); ``bench/label_free.py`` measures both. Either way the served
  ``relevance_score`` is calibrated (:func:`aheadrank.priors.fit_calibration`, saved in ``priors.json``) on the
  held-out queries: judged ones, or the pseudo-queries with their source documents as the relevant ones
  (:func:`pseudo_calibration`; none usable: relative scores and a WARNING). ``bench/calibration.py --build``
  measures it against judgments.

``DIR/build.json`` records the plan and each finished stage with its seconds; a rerun skips what is done (a
stage cut off half-way resumes through the resumable parts underneath it: Lucene's swap into place, the store's
shards, training's ``train-state.pt``, removed once the train stage is done: :func:`drop_train_state`).
``aheadrank serve DIR`` serves the result.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from fractions import Fraction
from pathlib import Path

from aheadrank.devices import check_device
from aheadrank.errors import AheadrankError
from aheadrank.fsfaults import atomic_write, atomic_write_text, describe, exclusive_lock
from aheadrank.indexer.fingerprint import changes, collection_fingerprint
from aheadrank.passages import DEFAULT_AGGREGATION, LABEL_FREE_AGGREGATION

log = logging.getLogger("aheadrank.build")

STAGES = ("collection", "bm25", "queries", "dense", "train", "store", "priors")
SHARED_STAGES = ("collection", "bm25", "queries", "dense")  # the same for every ranker over one collection
BUILD_FILE = "build.json"
BUILD_LOCK = "build.lock"  # held by the process building the directory (aheadrank.fsfaults.exclusive_lock)
BUILD_FORMAT = 1
LABELS = ("auto", "none")  # or the name of a qrels split
PRIORS_MODES = ("default", "pseudo")
# label-free: what each pseudo-query is trained to put first. source: the document it was made from; teacher (the
# default): its source left out of its candidates, the fusion's best other candidate instead
# (:func:`aheadrank.runs.teacher_positives`; measured against source in bench/results/label-free/positive-teacher/)
POSITIVES = ("source", "teacher")
# label-free: the listwise teacher the ranker's last layer is fitted to and trained against (the teachers of
# aheadrank.baselines.label_free_teacher): the equal-weight BM25 + bi-encoder fusion, or that with the
# bi-encoder's best 2-sentence window as a third feature (measured against each other in
# bench/results/label-free/teacher-passages/)
TEACHER_NAMES = {
    "fusion": "equal-weight BM25 + bi-encoder fusion",
    "fusion-passages": "BM25 + bi-encoder + the bi-encoder's best 2-sentence window, 1/3 each",
}
# what a plan field means in a build.json written before the field existed (the behaviour of that time), where
# it differs from today's default
_RECORDED_BEFORE = {"positive": "source"}
# the label-free served score: the neural score beside the label-free fusion it is added to, BM25 and the
# bi-encoder sharing the rest equally (z-scores). The neural share is 1/3 (equal parts) but for the kinds listed
# here: chosen by bench/label_free_loo.py's rule (fixed in b954f8d before it ran) over SciFact's, Cranfield's and
# Vaswani's test judgments, the share in {0, 1/6, 1/3} with the largest mean margin over the better of RRF and the
# equal-weight fusion (bench/results/label-free/loo/): at 1/6 PreTTR l5/e128 serves above that fusion on all three
# and tk-6l-base within 0.0013 of it (at 1/3 PreTTR fell 0.0063 below it on SciFact, TK 0.0107 on Vaswani); these
# saw every collection's judgments: leave-one-out the rule chose 1/3 for those two targets. MORES keeps 1/3
LABEL_FREE_NEURAL_SHARE: dict[str, Fraction] = {"prettr": Fraction(1, 6), "tk": Fraction(1, 6)}
_SUBSETS = (("neural", "bm25", "dense"), ("neural", "bm25"), ("neural", "dense"), ("neural",))
_WINDOW_SUBSETS = (("neural", "bm25", "dense", "window"), ("neural", "dense", "window"))
# the window prior (store/windows.py): the bi-encoder's best window of WINDOW_SENTENCES sentences, title in front,
# joins the label-free served score at the bi-encoder's weight where at least MULTI_WINDOW of the collection's
# documents are two or more windows (a collection of one-window documents would only repeat the bi-encoder). The
# rule was written into bench/label_free_passages.py (6133ddf) before it ran on the label-free defaults
# (bench/results/label-free/window-rule/): SciFact MORES 2xIB S2 / PreTTR l5/e128 / tk-6l-base 0.7480 / 0.7440 /
# 0.7484 against 0.7378 / 0.7345 / 0.7394 without, all significantly above the label-free fusion; Cranfield higher
# for all three; Vaswani's documents are one window each (gate off). Windows of 1 or 3 sentences, each collection's
# size chosen on the others, served no better (bench/results/label-free/window-size/: no difference significant)
WINDOW_SENTENCES = 2
MULTI_WINDOW = 0.5


def label_free_weights(kind: str | None = None, window: bool = False) -> dict[str, dict[str, float]]:
    """The label-free served weights of a ranker ``kind`` (:func:`share_weights` of its neural share), with the
    window prior where the store has sentence windows."""
    return share_weights(LABEL_FREE_NEURAL_SHARE.get(kind or "", Fraction(1, 3)), window)


def share_weights(share: Fraction, window: bool = False) -> dict[str, dict[str, float]]:
    """The neural score at ``share``, BM25 and the bi-encoder the rest in equal parts (and, with ``window``, the
    best window at the bi-encoder's weight: the weights normalised to sum 1), for every feature subset the
    service may have (the full weights restricted to the subset and renormalised: without the dense field,
    ``neural+bm25``; the neural score alone always weighs 1, even at share 0: it is then all there is)."""
    rest = (1 - share) / 2
    full = {"neural": share, "bm25": rest, "dense": rest, "window": rest}
    out = {}
    for names in (*_WINDOW_SUBSETS, *_SUBSETS) if window else _SUBSETS:
        total = sum(full[n] for n in names)
        out["+".join(names)] = {n: float(full[n] / total) if total else 1.0 / len(names) for n in names}
    return out


# the served weights of a kind not in LABEL_FREE_NEURAL_SHARE (MORES, bert): 1/3 each
LABEL_FREE_WEIGHTS = label_free_weights()
DEFAULT_RANKER = "mores-2ib-s2"
# a kind named without a variant in a label-free build: the variant measured best without judgments, where it is
# not the kind's default. TK contextualised by the base's embedding and all its layers (``tk-6l-base`` for the
# packaged 6-layer base), its kernel weights ridge-fitted to the label-free teacher, served above the label-free
# fusion on SciFact and Cranfield where the default ``tk-2l`` (two small layers trained from scratch) served below
# it on Cranfield and Vaswani (bench/results/label-free/tk-base/)
LABEL_FREE_VARIANTS = {"tk": "tk-{layers}l-base"}
# the same for a build with judgments: TK from the base reading each text between [CLS] and [SEP], trained at the
# recipe's rates for TK from the base (rankers.recipe.Recipe.lr_tk_base): judged SciFact pure 0.7299, served 0.7635,
# where the kind's default ``tk-2l`` gave 0.5018 and 0.7362, the label-free fusion's with a fitted neural weight of
# 0 (bench/results/tk-specials/)
JUDGED_VARIANTS = {"tk": "tk-{layers}l-base-specials"}
PSEUDO_LABELS = "pseudo-queries"  # a calibration's fitted_on["labels"] where no judgment was read
# calibrating on pseudo-queries: a candidate whose bi-encoder embedding has a cosine >= NEAR_SOURCE with the source
# document's counts relevant too (a pseudo-query has one known relevant document, a real query often several).
# Chosen for the packaged all-MiniLM-L6-v2 on SciFact's and Cranfield's judgments, Vaswani measured with it
# unchanged (bench/results/calibration-label-free-*.md); None: the source only
NEAR_SOURCE = 0.7

Search = Callable[[dict[str, str], int], dict[str, list]]


@dataclass
class BuildPlan:
    collection: str
    out: str
    ranker: str = DEFAULT_RANKER  # a variant name (rankers/variants.py) or a kind: mores, prettr, tk, bert
    device: str = "cpu"
    labels: str = "auto"  # auto: the collection's qrels/train.tsv when it has one; none; or a split name
    recipe: str = "auto"
    steps: int | None = None  # None: the recipe's
    max_queries: int = 3000  # pseudo-queries made from the collection
    priors: str = "default"  # label-free priors: default weights or fitted on held-out pseudo-queries
    ce_weight: float | None = None  # the cross-entropy on each query's source (None: 1, TrainConfig's)
    lr: float | None = None  # the learning rate (None: the recipe's for the ranker's kind)
    # the rate of what starts from scratch: TK's kernel weights and mix, a score head (None: the recipe's)
    fresh_lr: float | None = None
    # the score head (bert, MORES, PreTTR) ridge-fitted to the teacher before training (rankers/fit.py); None: off
    fit_head: bool | None = None
    seed: int = 0
    base: str | None = None
    reuse: str | None = (
        None  # another build over the same collection: its shared stages are linked, not redone
    )
    progress: bool = True
    # the store stage also stores long documents as passages (aheadrank index --passages); None: only where the
    # build is label-free (measured there: bench/results/label-free/passages-served/), see :func:`stores_passages`
    passages: bool | None = None
    # the store stage also stores the bi-encoder's sentence windows (store/windows.py) and the served score weighs
    # the best one; None: where the build is label-free and the collection's documents are mostly several
    # windows (:func:`stores_windows`)
    windows: bool | None = None
    # a ranker checkpoint the train stage starts from instead of the base model: one trained elsewhere (another
    # collection's judgments, say); with steps=0 it is used as it is and only the store and the priors are this
    # collection's
    init: str | None = None
    positive: str = "teacher"  # label-free: POSITIVES
    teacher: str = "fusion"  # label-free: the listwise teacher, TEACHER_NAMES
    # how the store holds the ranker's document side (store.spec.DTYPES; aheadrank index --dtype): float16, or
    # int8 / book4 / book2, 2x / 4x / 8x smaller; the dense field stays float16
    dtype: str = "float16"
    # BM25's analyzer (indexer.language.BM25_LANGUAGES); auto: the collection stage's guess where it is one of
    # them, else English
    language: str = "auto"
    # where the dense and store stages encode their shards (aheadrank index --scheduler / --workers): a Dask
    # scheduler's address (its workers write to this build's folder, so they must see it at the same path), or a
    # local cluster of that many worker processes; neither: this process. Not pinned: the shards are the same
    scheduler: str | None = None
    workers: int | None = None

    def directory(self) -> Path:
        return Path(self.out)


@dataclass
class BuildRecord:
    plan: dict
    stages: dict = field(default_factory=dict)
    format: int = BUILD_FORMAT

    def stages_left(self) -> list[str]:
        """The stages not yet done, in build order (none: the build is finished and can be served)."""
        return [s for s in STAGES if s not in self.stages]


def _variant(name: str):
    from aheadrank.rankers.variants import DEFAULTS, parse_variant

    return parse_variant(DEFAULTS.get(name, name))


def plan_variant(plan: BuildPlan):
    """The ranker variant a build makes: ``plan.ranker`` (a variant, or a kind: its default variant), except that a
    kind in :data:`LABEL_FREE_VARIANTS` (a label-free build) or :data:`JUDGED_VARIANTS` (a build with judgments) is
    that entry's variant (for the plan's base)."""
    judged = judged_split(plan.collection, plan.labels) is not None
    pattern = (JUDGED_VARIANTS if judged else LABEL_FREE_VARIANTS).get(plan.ranker)
    if pattern is not None:
        from aheadrank.rankers.base_model import base_config

        return _variant(pattern.format(layers=base_config(plan.base)["num_hidden_layers"]))
    return _variant(plan.ranker)


def check_plan(plan: BuildPlan) -> None:
    """What the build would otherwise find wrong only at its queries or train stage, minutes in: the ranker (and its
    options within bounds on this base: its config only, no weights), the recipe, the labels' split, the base and
    the ``--init`` checkpoint (a build folder is pointed at its ``checkpoint/``)."""
    from aheadrank.rankers.checkpoint import load_config
    from aheadrank.rankers.recipe import recipe_for

    variant = plan_variant(plan)
    judged_split(plan.collection, plan.labels)
    recipe_for(plan.device, plan.recipe)
    try:
        variant.field_dims(plan.base)
    except AheadrankError:
        raise
    except (ValueError, OSError) as exc:
        raise AheadrankError(
            f"--ranker {plan.ranker} on --base {plan.base or 'the packaged base'}: {exc}"
        ) from exc
    if plan.init:
        init = Path(plan.init)
        if (init / BUILD_FILE).is_file() and (init / "checkpoint").is_dir():
            raise AheadrankError(
                f"--init {init} is a build folder: give its checkpoint, --init {init / 'checkpoint'}"
            )
        load_config(init)  # a CheckpointError naming what is missing


def paths(out: str | Path) -> dict[str, Path]:
    d = Path(out)
    return {
        "lucene": d / "lucene",
        "dense": d / "dense-field",
        "queries": d / "queries.json.gz",
        "checkpoint": d / "checkpoint",
        "store": d / "store",
        "windows": d / "window-field",
    }


def missing_output(stage: str, out: str | Path, info: dict) -> str | None:
    """What a stage recorded done wrote that is no longer there (a folder deleted or moved by hand), or None: the
    build redoes the stage instead of saying "done before" over nothing (``serve`` then failed)."""
    from aheadrank.indexer.bm25 import is_lucene_index
    from aheadrank.store.manifest import DENSE_DIR
    from aheadrank.store.passages import PASSAGES_DIR
    from aheadrank.store.windows import WINDOWS_DIR

    p = paths(out)
    wanted: list[Path] = []
    if stage == "bm25":
        return None if is_lucene_index(p["lucene"]) else "lucene/"
    if stage == "dense":
        wanted = [p["dense"] / "manifest.json"]
    elif stage == "queries" and "pseudo_queries" in info:
        wanted = [p["queries"]]
    elif stage == "train":
        wanted = [p["checkpoint"] / "config.json", p["checkpoint"] / "model.safetensors"]
    elif stage == "store":
        subs = [
            DENSE_DIR,
            *([PASSAGES_DIR] if info.get("passages") else []),
            *([WINDOWS_DIR] if info.get("windows") else []),
        ]
        wanted = [p["store"] / "manifest.json", *(p["store"] / d / "manifest.json" for d in subs)]
    gone = [f for f in wanted if not f.is_file()]
    return str(gone[0].relative_to(Path(out))) if gone else None


def read_record(out: str | Path) -> BuildRecord | None:
    path = Path(out) / BUILD_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        record = BuildRecord(data["plan"], data.get("stages", {}), data.get("format", BUILD_FORMAT))
        if not (
            isinstance(record.plan, dict)
            and isinstance(record.stages, dict)
            and isinstance(record.format, int)
        ):
            raise TypeError("plan and stages are objects, format a number")
    except (OSError, ValueError, KeyError, TypeError) as exc:  # ValueError: JSON and UTF-8 errors too
        raise AheadrankError(
            f"{path} is not a build record `aheadrank build` can read ({type(exc).__name__}: {exc}); restore it "
            "from a copy, or build into another --out"
        ) from None
    if record.format > BUILD_FORMAT:
        raise AheadrankError(
            f"{path} is of build format {record.format}, newer than this aheadrank reads ({BUILD_FORMAT}): upgrade it"
        )
    return record


def _write_record(out: Path, record: BuildRecord) -> None:
    atomic_write_text(out / BUILD_FILE, json.dumps(asdict(record), indent=2) + "\n")


# the plan's fields that decide what the stages make: a rerun that changes one a finished stage depends on is refused
_SHARED_PINS = ("collection", "labels", "max_queries", "seed", "base", "language")
_MODEL_PINS = (
    *_SHARED_PINS,
    *("ranker", "recipe", "steps", "ce_weight", "lr", "fresh_lr", "init", "positive", "fit_head"),
    *("teacher", "dtype"),
)


def _plan_defaults() -> dict:
    """What a recorded plan without a field did: the field's default, or what builds did before it existed."""
    return {f.name: f.default for f in fields(BuildPlan)} | _RECORDED_BEFORE


def _check_same_plan(old: dict, plan: BuildPlan, done: dict) -> None:
    new = asdict(plan)
    pins = _MODEL_PINS if any(s not in SHARED_STAGES for s in done) else _SHARED_PINS
    # a field newer than the build reads as what the build did before the field existed
    defaults = _plan_defaults()
    was = {k: old.get(k, defaults[k]) for k in pins}
    changed = [k for k in pins if str(was[k]) != str(new.get(k))]
    if changed:
        # None is "not given" (the recipe's or the default), not a value to type
        def shown(value: object) -> str:
            return "not given" if value is None else repr(value)

        diff = ", ".join(f"{k}: built with {shown(was[k])}, now {shown(new.get(k))}" for k in changed)
        raise AheadrankError(
            f"{plan.out} was built with other settings ({diff}); give another --out, or the same settings to resume"
        )
    # passages and windows are pinned by what the store stage did (the plan's None means "where label-free"...); a
    # store stage recorded before it said reads as unknown and passes
    for key, wanted, what in (
        ("passages", stores_passages, "its long documents as passages"),
        ("windows", stores_windows, "the sentence windows"),
    ):
        made = done.get("store", {}).get(key)
        if made is not None and made != wanted(plan):
            raise AheadrankError(
                f"{plan.out} stored {what if made else 'no ' + key}; give another --out, or "
                f"--{'' if made else 'no-'}{key} to resume"
            )


def stores_windows(plan: BuildPlan, multi: float | None = None) -> bool:
    """Whether the build stores the bi-encoder's sentence windows and serves the window prior: as asked, else
    (``windows=None``) where the build is label-free and at least :data:`MULTI_WINDOW` of the documents are two
    or more windows (``multi``, else the collection stage's ``multi_window``, else counted now; measured:
    bench/results/label-free/window-rule/)."""
    if plan.windows is not None:
        return plan.windows
    if judged_split(plan.collection, plan.labels) is not None:
        return False
    share = multi
    if share is None:
        record = read_record(plan.out)
        share = (record.stages.get("collection", {}) if record else {}).get("multi_window")
    if share is None:
        share = multi_window(plan.collection)
    return share >= MULTI_WINDOW


def multi_window(collection: str | Path, sentences: int = WINDOW_SENTENCES) -> float:
    """The share of the collection's documents that are two or more windows of ``sentences`` sentences."""
    from aheadrank.indexer.collections import Collection
    from aheadrank.indexer.pseudo_queries import stored_windows

    n = multi = 0
    for _, title, body in Collection(collection).titled():
        n += 1
        multi += bool(stored_windows(title, body, sentences))
    return multi / n if n else 0.0


def stores_passages(plan: BuildPlan) -> bool:
    """Whether the store stage stores long documents as passages too: as asked, else (``passages=None``) where the
    build is label-free. Measured there on SciFact, Cranfield and Vaswani (bench/results/label-free/passages-served/):
    the label-free MORES read through its passages serves above the label-free fusion; a judged build's priors were
    fitted and measured without passages, so it keeps them off unless asked."""
    if plan.passages is not None:
        return plan.passages
    return judged_split(plan.collection, plan.labels) is None


# ``--labels auto`` trains on a collection's judgments only where qrels/train.tsv holds at least this many judged
# queries (with a relevant document); with fewer it builds label-free. A MORES 2×IB S2 build trained by the judged
# recipe on 50 of SciFact's judged train queries served 0.6477 against the label-free build's 0.7486 (p 4e-9; below
# BM25's 0.6789), on 200 0.7353 (p 0.067), on 400 0.7693 (+0.0206, p 0.037) (bench/few_judged_training.py,
# bench/results/few-judged-training/); on all 809, 0.7817 (bench/results/judged-weights/). ``--labels train`` trains on
# any number.
MIN_JUDGED_QUERIES = 400
# another minimum (1: any judgments), read by build and train
MIN_JUDGED_VARIABLE = "AHEADRANK_MIN_JUDGED_QUERIES"


def min_judged_queries() -> int:
    """:data:`MIN_JUDGED_QUERIES`, or the whole number ``AHEADRANK_MIN_JUDGED_QUERIES`` gives (read at each call)."""
    given = os.environ.get(MIN_JUDGED_VARIABLE, "").strip()
    if not given:
        return MIN_JUDGED_QUERIES
    try:
        value = int(given)
    except ValueError:
        value = -1
    if value < 1:
        raise AheadrankError(f"{MIN_JUDGED_VARIABLE}={given!r}: give a whole number of queries, 1 or more")
    return value


def relevant_queries(collection: str | Path, split: str) -> int:
    """How many queries ``qrels/<split>`` of a BEIR folder judges with a relevant document (0 where it has none)."""
    from aheadrank.indexer.topics import qrels_file

    path = qrels_file(collection, split)
    if path is None:
        return 0
    st = path.stat()
    return _relevant_queries(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _relevant_queries(path: str, size: int, mtime_ns: int) -> int:  # keyed by the file's size and time
    from aheadrank.evaluation import evaluated_qids
    from aheadrank.indexer.topics import read_qrels

    return len(evaluated_qids(read_qrels(path)))


def auto_labels_note(collection: str | Path, labels: str, flag: str = "--labels") -> str | None:
    """Why ``auto`` (``flag``'s value) is label-free over a collection that has judgments (too few), or None."""
    if labels != "auto":
        return None
    n = relevant_queries(collection, "train")
    least = min_judged_queries()
    if not 0 < n < least:
        return None
    return (
        f"qrels/train.tsv judges {n} queries, fewer than the {least} a ranker trained on judgments "
        'needs to serve above the label-free recipe (docs/training.md, "How many judged queries"): label-free '
        f"it is; {flag} train trains on them anyway, and `aheadrank fit-priors --split train --all-queries` "
        "calibrates a label-free build's scores on them"
    )


def judged_split(collection: str | Path, labels: str, flag: str = "--labels") -> str | None:
    """The qrels split the build (or ``aheadrank train``, ``flag="--split"``) trains on, or None for the label-free
    recipe; the test split, and a split given that ``qrels/`` does not hold, are refused naming ``flag``. ``auto``
    is ``train`` where qrels/train.tsv judges at least :func:`min_judged_queries` queries, else label-free."""
    from aheadrank.indexer.topics import qrels_file, qrels_splits

    if labels == "none":
        return None
    if labels == "test":
        raise AheadrankError(
            f"{flag} test: refusing to train on the test split (a ranker trained and fitted on the queries it is "
            "then evaluated on); give the training split, or none for the label-free recipe"
        )
    split = "train" if labels == "auto" else labels
    found = qrels_file(collection, split) is not None
    if labels != "auto" and not found:
        held = ", ".join(qrels_splits(collection)) or "none"
        raise AheadrankError(
            f"{flag} {labels}: {collection} has no qrels/{split}.tsv (its qrels/ holds: {held})"
        )
    if labels == "auto" and found and relevant_queries(collection, split) < min_judged_queries():
        return None
    return split if found else None


# ---- the stages ---------------------------------------------------------------------------------------------
def stage_collection(plan: BuildPlan) -> dict:
    from aheadrank.buildtime import ProbeSample
    from aheadrank.indexer.collections import Collection, join_title_text
    from aheadrank.indexer.language import LanguageCounts, language_warning
    from aheadrank.indexer.pseudo_queries import stored_windows
    from aheadrank.rankers.training import cpu_bf16_native

    coll = Collection(plan.collection)
    docs = titled = words = multi = windows = 0
    sample = ProbeSample()
    language = LanguageCounts()
    for _, title, body in coll.titled():
        docs += 1
        titled += bool(title)
        words += len(body.split()) + len(title.split())
        n = len(stored_windows(title, body, WINDOW_SENTENCES))
        multi += n > 0
        windows += n
        text = join_title_text(title, body)
        sample.add(text)
        language.add(text)
    if docs == 0:
        raise AheadrankError(f"{plan.collection}: no usable document ({coll.report.summary()})")
    warning = language_warning(language, plan.collection, bm25_language_of(plan, language.guess()))
    if warning:
        log.warning(warning)
    probe = _speed_probe(plan, sample.texts)
    return {
        **({"probe": probe} if probe else {}),
        "documents": docs,
        "format": coll.format_name,
        "titled": titled,
        "mean_words": round(words / docs, 1),
        "language": language.summary(),  # a guess from function words (indexer/language.py): warned of if not English
        "skipped": coll.report.skipped,
        # TSV first lines naming the columns (`docid<TAB>text`), read as no document (indexer.collections)
        **({"headers": coll.report.headers} if coll.report.headers else {}),
        "multi_window": round(multi / docs, 4),  # documents of two or more sentence windows (stores_windows)
        "windows": windows,  # their windows: what the window field embeds (aheadrank.buildtime)
        "cpu_bf16_native": cpu_bf16_native(),  # whether training on this CPU autocasts (the estimate's step rate)
        # what the build reads of the collection: a resumed build whose collection changed is refused
        "fingerprint": collection_fingerprint(plan.collection, fingerprint_split(plan)),
    }


def fingerprint_split(plan: BuildPlan) -> str | None:
    """The qrels split whose files the collection's fingerprint covers: the one ``--labels`` trains on, listed
    even while absent (``auto``: ``train``, which would be trained on once added); None for ``--labels none``."""
    return None if plan.labels == "none" else "train" if plan.labels == "auto" else plan.labels


def collection_changes(plan: BuildPlan, recorded: dict) -> tuple[dict, list[str]]:
    """The collection's fingerprint now (reading only files whose size or time moved since ``recorded``) and how
    its content differs from ``recorded`` (:func:`aheadrank.indexer.fingerprint.changes`; empty: the same)."""
    now = collection_fingerprint(plan.collection, fingerprint_split(plan), recorded)
    return now, changes(recorded, now)


def check_same_collection(plan: BuildPlan, record: BuildRecord, out: Path) -> None:
    """Refuse to go on with a build whose collection changed since its collection stage read it (its BM25 index,
    dense field and store would hold other documents than the stages still to run). The same content with newer
    modification times is recorded, so that the next run need not read it again. A build recorded before the
    fingerprint existed is not checked."""
    done = record.stages.get("collection") or {}
    if "fingerprint" not in done:
        return
    now, said = collection_changes(plan, done["fingerprint"])
    if said:
        raise AheadrankError(
            f"{plan.collection} has changed since {out} was built from it ({'; '.join(said)}): the stages done "
            f"would not match it. Give another --out (or remove {out}) to build the collection as it is now"
        )
    if now != done["fingerprint"]:
        done["fingerprint"] = now
        _write_record(out, record)


def _speed_probe(plan: BuildPlan, texts: list[str]) -> dict | None:
    """The bi-encoder timed on a few of the collection's documents (:func:`aheadrank.buildtime.speed_probe`), what
    the first ``[estimate]`` scales the reference rates by; None when it cannot run (an estimate never stops a
    build: a base that cannot load fails the dense stage with its own error)."""
    from aheadrank.buildtime import speed_probe
    from aheadrank.indexer.build import get_ranker

    try:
        return speed_probe(texts, get_ranker(str(plan.base or ""), None, plan.device, None, "dense"))
    except (AheadrankError, OSError, RuntimeError, ValueError) as exc:
        log.debug("no speed probe: %s", exc)
        return None


def bm25_language_of(plan: BuildPlan, guess: str | None) -> str:
    """BM25's analyzer for the build: ``plan.language``, or for ``auto`` the collection's ``guess``
    (:func:`aheadrank.indexer.language.bm25_language`)."""
    from aheadrank.indexer.language import bm25_language

    return bm25_language(guess) if plan.language == "auto" else plan.language


def stage_bm25(plan: BuildPlan) -> dict:
    from aheadrank.indexer.bm25 import build_bm25_index, is_lucene_index, read_index_meta

    target = paths(plan.out)["lucene"]
    if is_lucene_index(target):  # built before the stage was recorded done
        return {"language": read_index_meta(target).get("language", "en")}
    record = read_record(plan.out)
    guess = (record.stages.get("collection", {}).get("language") or {}).get("guess") if record else None
    language = bm25_language_of(plan, guess)
    build_bm25_index(plan.collection, target, progress=plan.progress, language=language)
    return {"language": language}


def dask_record(plan: BuildPlan) -> dict:
    """Where a stage's shards were encoded, for its record: a Dask scheduler or a local cluster (else nothing)."""
    if plan.scheduler:
        return {"scheduler": plan.scheduler}
    return {"workers": plan.workers} if plan.workers else {}


def stage_dense(plan: BuildPlan, documents: int | None = None) -> dict:
    from aheadrank.indexer.build import ensure_dense_field

    summary = ensure_dense_field(
        plan.collection,
        paths(plan.out)["dense"],
        plan.base,
        plan.device,
        plan.progress,
        documents,
        scheduler=plan.scheduler,
        workers=plan.workers,
    )
    info = {"docs_per_s": round(summary.docs_per_s, 1), **dask_record(plan)} if summary else {}
    if summary and summary.documents_reused:  # resumed: this run's time is part of the stage's work
        info["documents_reused"] = summary.documents_reused
    if stores_windows(plan):
        t0 = time.perf_counter()
        windows = _window_field(plan)
        info["windows"] = {"seconds": round(time.perf_counter() - t0, 1), **windows}
    return info


def _window_field(plan: BuildPlan) -> dict:
    """The collection's sentence windows embedded once (``DIR/window-field``), beside its dense field."""
    from aheadrank.indexer.build import ensure_window_field

    p = paths(plan.out)
    summary = ensure_window_field(
        plan.collection,
        p["windows"],
        p["dense"],
        plan.base,
        WINDOW_SENTENCES,
        plan.device,
        plan.progress,
        scheduler=plan.scheduler,
        workers=plan.workers,
    )
    if summary is None:
        return {}
    info = {"windows": summary.documents, "windows_per_s": round(summary.docs_per_s, 1)}
    return info | ({"windows_reused": summary.documents_reused} if summary.documents_reused else {})


def dense_timed(stage: dict) -> bool:
    """Whether a dense stage's record times all of its work: its field (and its windows, where it stores them)
    encoded in the run that recorded it. A field found complete (resumed after the stage's work, or linked into
    the build folder) takes no time, and one found in part takes part of it: neither scales an estimate."""
    if "docs_per_s" not in stage or stage.get("documents_reused"):
        return False
    windows = stage.get("windows")
    return windows is None or ("windows_per_s" in windows and not windows.get("windows_reused"))


def stage_queries(plan: BuildPlan, search: Search | None = None) -> dict:
    p = paths(plan.out)
    split = judged_split(plan.collection, plan.labels)
    if split is not None:
        return {"judged_split": split}  # judged queries: searched when training (aheadrank train's data)
    from aheadrank.runs import build_label_free_training_data

    try:
        data, hits, pq = build_label_free_training_data(
            plan.collection, p["lucene"], max_queries=plan.max_queries, seed=plan.seed, search=search
        )
    except AheadrankError as exc:
        # too little text for pseudo-queries: where auto set judgments aside, say they can train it
        if auto_labels_note(plan.collection, plan.labels) is None:
            raise
        n = relevant_queries(plan.collection, "train")
        raise AheadrankError(f"{exc}; its {n} judged queries can: --labels train") from None
    alias_texts = {a: pq.texts[a] for a in pq.aliases}
    blob = {"queries": pq.queries, "qrels": pq.qrels, "aliases": pq.aliases, "alias_texts": alias_texts}
    blob.update(kinds=pq.kinds, hits={q: [(d, round(float(x), 4)) for d, x in h] for q, h in hits.items()})
    atomic_write(p["queries"], lambda fh: fh.write(gzip.compress(json.dumps(blob).encode(), mtime=0)))
    return {"pseudo_queries": len(pq.queries), "kinds": pq.counts()}


def load_label_free(plan: BuildPlan):
    """(TrainingData, hits, aliases) of the queries stage (no Java needed)."""
    from aheadrank.indexer.collections import Collection
    from aheadrank.rankers.training import TrainingData
    from aheadrank.runs import alias_candidates

    blob = read_queries(plan.out)
    texts = {d.docid: d.text for d in Collection(plan.collection)}
    texts.update(blob["alias_texts"])
    cands = alias_candidates(blob["hits"], blob["qrels"], blob["aliases"])
    data = TrainingData(texts, blob["queries"], blob["qrels"], cands, copies=frozenset(blob["aliases"]))
    return data, blob["hits"], blob["aliases"]


def read_queries(out: str | Path) -> dict:
    """What the queries stage saved: queries, qrels, aliases, alias_texts, kinds and the BM25 hits (as tuples)."""
    with gzip.open(paths(out)["queries"], "rt") as f:
        blob = json.load(f)
    blob["hits"] = {q: [tuple(h) for h in hits] for q, hits in blob["hits"].items()}
    return blob


def stage_train(plan: BuildPlan, search: Search | None = None) -> dict:
    from dataclasses import asdict

    from aheadrank.rankers.dense import base_of
    from aheadrank.rankers.recipe import recipe_for, resolve_training, train_recipe

    p = paths(plan.out)
    variant = plan_variant(plan)
    rec = recipe_for(plan.device, plan.recipe)
    split = judged_split(plan.collection, plan.labels)
    if plan.init:
        model, source = start_from(plan.init, variant, plan.device)
    else:
        options = rec.init_options(label_free=split is None)
        model = variant.init(base=plan.base, seed=plan.seed, **options).to(plan.device)
    given = {
        "seed": plan.seed,
        "steps": plan.steps,
        "ce_weight": plan.ce_weight,
        "lr": plan.lr,
        "fresh_lr": plan.fresh_lr,
        "fit_head": plan.fit_head,
    }
    resolved = resolve_training(rec, model.kind, given, ranker=asdict(model.config), label_free=split is None)
    cfg = resolved.train
    if split is None:
        from aheadrank.baselines import label_free_teacher

        data, hits, aliases = load_label_free(plan)
        titled = None
        if plan.teacher == "fusion-passages":
            from aheadrank.indexer.collections import Collection

            titled = {d: (t, b) for d, t, b in Collection(plan.collection).titled()}
        data.teacher = label_free_teacher(
            p["dense"],
            data.queries,
            hits,
            aliases,
            data.qrels,
            base=base_of(model.config),
            device=plan.device,
            titled=titled,
            progress=plan.progress,
        )
        if plan.positive == "teacher":
            from aheadrank.runs import teacher_positives

            teacher_positives(data, aliases)
        extra = {
            "label_free": {
                "teacher": TEACHER_NAMES[plan.teacher],
                "queries": len(data.queries),
                "positive": plan.positive,
            }
        }
    else:
        from aheadrank.baselines import fusion_teacher
        from aheadrank.rankers.training import split_queries
        from aheadrank.runs import build_training_data

        data = build_training_data(plan.collection, split, p["lucene"], search=search)
        _, val_q = split_queries(data, cfg.val_queries, cfg.seed)
        data.teacher, _ = fusion_teacher(p["dense"], p["lucene"], data, val_q, base=base_of(model.config))
        extra = {}
    if plan.init:  # adapted from a trained ranker: its compressor and kernel weights are kept
        extra["init"] = init_record(plan.init, source)
        if plan.steps == 0:  # used as it is: this collection's store and priors only
            from aheadrank.rankers.checkpoint import save_checkpoint
            from aheadrank.rankers.training import split_queries

            # none of this collection's queries was trained on: the recipe's validation share is held out for
            # the priors stage (fitting or calibrating on them)
            _, val_q = split_queries(data, cfg.val_queries, cfg.seed)
            extra["train"] = {"steps": 0, "val_qids": val_q}
            save_checkpoint(model, p["checkpoint"], overwrite=True, extra=extra)
            return {"variant": variant.name, "steps": 0, "init": plan.init}
    done = train_recipe(
        model,
        data,
        p["checkpoint"],
        cfg,
        compressor_steps=0 if plan.init else resolved.compressor_steps,
        compressor_init="random" if plan.init else resolved.compressor_init,
        progress=plan.progress,
        fit_kernels=resolved.fit_kernels and not plan.init,
        fit_head=resolved.fit_head and not plan.init,
        extra=extra,
    )
    r = done.result
    return {
        "variant": variant.name,
        "steps": r.steps,
        "best_step": r.best_step,
        "val_ndcg10": r.best_metric,
        "train_seconds": round(r.seconds, 1),
    }


# a checkpoint's records of its own training (config.extra), not of the model: a build started from it keeps them
# under "init"
TRAINING_RECORDS = ("train", "label_free", "pseudo", "init")


def start_from(init: str | Path, variant, device: str):
    """The ranker of checkpoint ``init`` (fingerprint verified), refused unless it is of ``variant``, and its
    training records (taken out of its config)."""
    from aheadrank.rankers.checkpoint import load_ranker

    model = load_ranker(init, device=device)
    cfg = model.config
    # what the checkpoint was trained on moves into this build's init record: its held-out queries are another
    # collection's
    source = {k: cfg.extra.pop(k) for k in TRAINING_RECORDS if k in cfg.extra}
    wrong = [k for k, v in variant.options.items() if getattr(cfg, k, v) != v]
    if model.kind != variant.kind or wrong:
        got = ", ".join(f"{k}={getattr(cfg, k, None)!r}" for k in wrong)
        raise AheadrankError(
            f"--init {init} is a {model.kind} ranker{' with ' + got if got else ''}, not {variant.name}: "
            "give --ranker the checkpoint's variant"
        )
    return model, source


def init_record(init: str | Path, source: dict) -> dict:
    """Where a build's ranker started: the checkpoint, its fingerprint and its training records (``source``)."""
    from aheadrank.rankers.checkpoint import read_fingerprint

    train = {k: v for k, v in source.get("train", {}).items() if k != "val_qids"}
    return {"checkpoint": str(init), "fingerprint": read_fingerprint(init), **source, "train": train}


def stage_store(plan: BuildPlan, documents: int | None = None) -> dict:
    from aheadrank.indexer.build import (
        BuildOptions,
        build_dense,
        build_passages,
        build_store,
        existing_shard_size,
        store_disk_bytes,
    )

    p = paths(plan.out)
    passages = stores_passages(plan)
    opts = BuildOptions(
        str(p["checkpoint"]),
        plan.collection,
        str(p["store"]),
        strategy=plan_variant(plan).strategy,
        # the store in the shards of its dense field (they share them); a store begun before goes on in its own
        shard_size=existing_shard_size(p["store"]) or existing_shard_size(p["dense"]),
        device=plan.device,
        progress=plan.progress,
        passages=passages,
        dtype=plan.dtype,
        documents=documents,  # the progress bars' total
        scheduler=plan.scheduler,
        workers=plan.workers,
    )
    summary = build_store(opts)
    if passages:
        build_passages(opts)
    build_dense(opts, p["dense"])
    windows = stores_windows(plan)
    if windows:
        from aheadrank.indexer.build import build_windows

        _window_field(plan)  # made by the dense stage (a build whose dense stage was done before: here)
        build_windows(opts, p["windows"])
    sizes = store_disk_bytes(p["store"])
    return {
        "documents": summary.documents,
        "tokens": summary.tokens,
        "docs_per_s": round(summary.docs_per_s, 1),
        "passages": passages,
        "windows": windows,
        "dtype": plan.dtype,
        "store_bytes": sizes["all"],
        **({"passages_bytes": sizes["passages"]} if passages else {}),
        **({"windows_bytes": sizes["windows"]} if windows else {}),
        **dask_record(plan),
    }


def piece_bytes(plan: BuildPlan, checkpoint: Path | None = None) -> float:
    """Bytes the store keeps a word piece: the fields of the plan's ranker at its dtype, those of ``checkpoint``'s
    config where it is given (the train stage's; before it, the variant's on the plan's base). No weights read."""
    from aheadrank.buildtime import VALUE_BYTES
    from aheadrank.rankers.checkpoint import config_field_dims, load_config

    variant = plan_variant(plan)
    if checkpoint is None:
        dims = variant.field_dims(plan.base)
    else:
        dims = config_field_dims(load_config(checkpoint), variant.strategy)
    return sum(dims.values()) * VALUE_BYTES[plan.dtype]


def store_room(plan: BuildPlan, record: BuildRecord) -> tuple[str, float] | None:
    """The store stage's room, checked before it writes: (one line with the bytes it has still to write and those
    free where it writes them, the bytes estimated). The estimate is :func:`aheadrank.buildtime.store_bytes` for
    the ranker's fields at the plan's dtype (:func:`piece_bytes`), less what a stopped store stage wrote. Where
    they cannot fit (free under ``DISK_REFUSE`` of the estimate) :func:`aheadrank.buildtime.check_room`'s
    AheadrankError says so and names the smaller dtypes' sizes: nothing is written and the stages done are kept.
    None where the record cannot tell (an estimate never stops a build)."""
    from aheadrank.buildtime import check_room, store_bytes
    from aheadrank.indexer import build as indexing

    p = paths(plan.out)
    try:
        estimate = store_bytes(
            workload(plan, record.stages["collection"]), piece_bytes(plan, p["checkpoint"])
        )
        need = max(estimate - indexing.store_disk_bytes(p["store"])["all"], 0.0)
        free = indexing.free_bytes(plan.out)
    except (AheadrankError, OSError, KeyError, TypeError, ValueError) as exc:
        log.debug("no store estimate: %s", exc)
        return None
    return check_room(need, free, plan.dtype, plan.out), estimate


def label_free_priors(checkpoint: str | Path, fitted_on: dict, window: bool = False):
    """:func:`label_free_weights` of the checkpoint's kind as its priors (with its dense encoder's identity);
    ``window``: with the window prior (a store with sentence windows)."""
    from aheadrank.priors import Priors
    from aheadrank.rankers import load_config
    from aheadrank.rankers.dense import base_of, dense_encoder

    config = load_config(checkpoint)
    enc = dense_encoder(base_of(config))
    return Priors(
        weights=label_free_weights(config.kind, window),
        dense={"fingerprint": enc.fingerprint, "max_len": enc.max_len},
        fitted_on=fitted_on,
    )


def pseudo_validation(out: str | Path) -> tuple[dict, dict, dict]:
    """The pseudo-queries the trainer held out, their BM25 candidates and their source documents as the
    judgments: (queries, candidates, qrels)."""
    from aheadrank.rankers import load_config

    blob = read_queries(out)
    held_out = load_config(paths(out)["checkpoint"]).extra.get("train", {}).get("val_qids") or []
    val = {q: blob["queries"][q] for q in held_out}
    qrels = {q: {blob["aliases"][a]: 1 for a in blob["qrels"][q]} for q in val}
    cands = {q: blob["hits"][q] for q in val}
    return val, cands, qrels


def stage_priors(plan: BuildPlan, search: Search | None = None) -> dict:
    from aheadrank.rankers import load_config
    from aheadrank.rankers.checkpoint import write_priors
    from aheadrank.rerank import fit_checkpoint_priors

    p = paths(plan.out)
    ckpt = p["checkpoint"]
    held_out = load_config(ckpt).extra.get("train", {}).get("val_qids") or []
    split = judged_split(plan.collection, plan.labels)
    # recorded in the priors, read by serve and rerank-run (aheadrank.passages.served_aggregation)
    aggregation = DEFAULT_AGGREGATION if split is not None else LABEL_FREE_AGGREGATION
    if split is not None or plan.priors == "pseudo":
        if split is not None:
            from aheadrank.indexer.topics import read_beir_split
            from aheadrank.runs import _bm25_search

            queries, qrels = read_beir_split(plan.collection, split)
            val = {q: queries[q] for q in held_out if q in queries}
            cands = (search or _bm25_search(p["lucene"]))(val, 100)
            fitted_on = {"split": split, "held_out": True}
        else:
            val, cands, qrels = pseudo_validation(plan.out)
            fitted_on = {"label_free": "held-out pseudo-queries", "labels": PSEUDO_LABELS}
        priors = fit_checkpoint_priors(
            ckpt,
            p["store"],
            val,
            cands,
            qrels,
            fitted_on,
            plan.device,
            plan.progress,
            aggregation=aggregation,
        )
        if split is None:  # the calibration as the default priors' (near-source labels), weights its own
            cal, why = pseudo_calibration(plan.out, None, plan.device, plan.progress, aggregation=aggregation)
            priors.calibration = None if cal is None else cal.to_dict()
            if cal is None:
                priors.fitted_on["calibration"] = f"none: {why}"
            write_priors(ckpt, priors.to_dict())
    else:
        from aheadrank.priors import LABEL_FREE_DEFAULTS
        from aheadrank.store import read_manifest

        priors = label_free_priors(
            ckpt,
            {
                "label_free": LABEL_FREE_DEFAULTS,
                "passage_aggregation": aggregation,
            },
            window=read_manifest(p["store"]).windows is not None,
        )
        cal, why = pseudo_calibration(
            plan.out, priors.weights, plan.device, plan.progress, aggregation=aggregation
        )
        if cal is not None:
            priors.calibration = cal.to_dict()
        else:
            priors.fitted_on["calibration"] = f"none: {why}"
        write_priors(ckpt, priors.to_dict())
    cal = priors.calibrated()
    return {
        "weights": priors.widest(),
        "fitted_on": priors.fitted_on,
        "calibration": "none (relative scores)"
        if cal is None
        else {k: cal.fitted_on.get(k) for k in ("labels", "queries", "candidates", "relevant")},
    }


def pseudo_calibration(
    out: str | Path,
    weights: dict | None,
    device: str = "cpu",
    progress: bool = False,
    near: float | None = NEAR_SOURCE,
    aggregation: str = LABEL_FREE_AGGREGATION,
) -> tuple:
    """(the served score's calibration, None) fitted by :func:`aheadrank.priors.fit_calibration` on the
    held-out pseudo-queries (:func:`pseudo_validation`): each one's source document is relevant, and so is a
    candidate near it (:func:`near_source_labels`), the others count as not relevant; the features combined by
    ``weights`` (the label-free defaults; None: fitted). Or (None, why) with a WARNING where they cannot be
    used: scores are then served relative to each request's documents."""
    from aheadrank.priors import fit_calibration
    from aheadrank.rerank import collect_features

    p = paths(out)
    val, cands, qrels = pseudo_validation(out)
    if not val:
        why = "the trainer held out no pseudo-query"
    else:
        feats, _ = collect_features(
            p["checkpoint"], p["store"], val, cands, qrels, device, progress, aggregation
        )
        feats, near = near_source_labels(p["store"], feats, near)
        fitted_on = {"labels": PSEUDO_LABELS, "label_free": "held-out pseudo-queries", "near_source": near}
        try:
            return fit_calibration(feats, fitted_on, weights=weights), None
        except ValueError as exc:
            why = f"{len(val)} held-out pseudo-queries: {exc}"
    log.warning(
        "no calibration: %s; /rerank's relevance_score will be relative to each request's documents, not a "
        "probability (a build with more --max-queries holds enough out to calibrate on)",
        why,
    )
    return None, why


def near_source_labels(
    store: str | Path, feats: list, near: float | None = NEAR_SOURCE
) -> tuple[list, float | None]:
    """``feats`` (pseudo-queries' :class:`~aheadrank.priors.QueryFeatures`, the source document relevant) with
    every candidate whose dense embedding (the store's dense field) has a cosine >= ``near`` with its source's
    relevant too; returns (them, ``near``), or (``feats``, None) where ``near`` is None or the store has no
    dense field."""
    from aheadrank.priors import QueryFeatures
    from aheadrank.rerank import DENSE_DIR, dense_cosines
    from aheadrank.store import StoreReader

    dense_dir = Path(store) / DENSE_DIR
    if near is None or not (dense_dir / "manifest.json").is_file():
        return feats, None
    out = []
    with StoreReader(dense_dir) as reader:
        for q in feats:
            sources = [d for d, g in q.qrels.items() if g > 0]
            found = reader.fetch(sources)
            rel = dict(q.qrels)
            for v in [] if found.unknown else found.fields["dense"][:, 0, :]:
                cos = dense_cosines(reader, v, q.docids)
                rel.update({d: 1 for d, c in zip(q.docids, cos, strict=True) if c >= near})
            out.append(QueryFeatures(q.docids, q.features, rel))
    return out, near


# ---- the driver ---------------------------------------------------------------------------------------------
def judged_queries(collection: str | Path, split: str) -> int:
    """Distinct judged queries of ``qrels/<split>`` (0 when they cannot be read: the estimate only)."""
    from aheadrank.indexer.topics import read_qrels

    try:
        return len(read_qrels(collection, split))
    except (AheadrankError, OSError):
        return 0


def workload(plan: BuildPlan, collection: dict):
    """What the build has to do (:class:`aheadrank.buildtime.Workload`), from the plan and the collection stage's
    record (its documents and their mean length)."""
    from aheadrank.buildtime import Workload, cost_key
    from aheadrank.rankers.recipe import POOL_DOCS, recipe_for, resolve_training
    from aheadrank.rankers.training import held_out_count, saved_step

    variant = plan_variant(plan)
    split = judged_split(plan.collection, plan.labels)
    rec = recipe_for(plan.device, plan.recipe)
    docs = int(collection["documents"])
    # the steps and the window the train stage will resolve (rankers.recipe: the one place they are decided)
    cfg = resolve_training(rec, variant.kind, {"steps": plan.steps}, label_free=split is None).train
    steps = cfg.steps
    given = {"max_doc_len": variant.options.get("max_doc_len")}
    window = rec.init_options(given, label_free=split is None)["max_doc_len"]
    fresh_map = variant.kind == "prettr" and bool(variant.options.get("compress", 1)) and not plan.init
    queries = min(plan.max_queries, docs) if split is None else judged_queries(plan.collection, split)
    return Workload(
        documents=docs,
        mean_words=float(collection["mean_words"]),
        queries=queries,
        steps=steps,
        cost=cost_key(variant.kind, variant.options),
        window=window,
        passages=stores_passages(plan),
        pool_docs=min(POOL_DOCS, docs) if fresh_map else 0,
        # a record from before the window prior has no count: it stored none
        windows=int(collection["windows"])
        if collection.get("windows") and stores_windows(plan, collection.get("multi_window"))
        else 0,
        # on the CPU: bfloat16 autocast only where asked and in hardware (rankers.training.autocast_context), as
        # the collection stage found it (a record from before it said nothing: the reference's bfloat16)
        float32_steps=not str(plan.device).startswith("cuda")
        and not (cfg.cpu_amp and collection.get("cpu_bf16_native", True)),
        # a train stage stopped part-way resumes from its saved state: only the steps after it are left
        steps_done=min(saved_step(paths(plan.out)["checkpoint"]), steps),
        held_out=held_out_count(queries, cfg.val_queries),
    )


def estimate(
    plan: BuildPlan, record: BuildRecord, after: str, until: str | None, earlier: bool = False
) -> str | None:
    """The ``[estimate]`` line printed after stage ``after`` (collection: the reference rates scaled by the
    collection stage's speed probe, or as they are where it has none; dense: scaled by how long the dense stage
    took against its estimate where that time is all of its work (:func:`dense_timed`), else as after the
    collection), ``earlier`` when that time is not this run's (done before or linked from another build), for the
    stages still to run up to ``until``; None when there are none or the record cannot tell (an estimate never
    stops a build)."""
    from aheadrank.buildtime import estimate_line, reference_seconds, store_bytes

    if after == "collection" and "dense" in record.stages:  # the line after the dense stage says it better
        return None
    probe = None
    try:
        work = workload(plan, record.stages["collection"])
        ref = reference_seconds(work)
        scale = None
        if after != "collection" and dense_timed(record.stages["dense"]):
            scale = max(float(record.stages["dense"].get("seconds", 0)), 1.0) / max(ref["dense"], 1.0)
        elif record.stages["collection"].get("probe"):
            timed = record.stages["collection"]["probe"]
            scale, probe = float(timed["scale"]), int(timed["documents"])
    except (AheadrankError, KeyError, TypeError, ValueError) as exc:
        log.debug("no estimate: %s", exc)
        return None
    ahead = STAGES[STAGES.index(after) + 1 : (STAGES.index(until) + 1) if until else None]
    left = {s: ref[s] * (scale or 1.0) for s in ahead if s not in record.stages}
    resumed = (work.steps_done, work.steps) if work.steps_done else None
    disk = None
    if "store" in left:
        try:
            disk = (store_bytes(work, piece_bytes(plan)), plan.dtype)
        except (AheadrankError, OSError, KeyError, TypeError, ValueError) as exc:
            log.debug("no store estimate: %s", exc)
    return (
        estimate_line(left, scale, earlier, probe, refined=after == "collection", resumed=resumed, store=disk)
        if left
        else None
    )


# what each shared stage's output depends on: a --reuse build links a stage only where these are the same
_REUSE_PINS = {
    "collection": ("labels",),  # a judged build's fingerprint holds its queries and qrels too
    "bm25": ("language",),
    "queries": ("labels", "max_queries", "seed", "language"),
    "dense": ("base",),
}


def _link_shared(plan: BuildPlan, record: BuildRecord, echo: Callable[[str], object] = print) -> None:
    """Take the shared stages a ``reuse`` build has finished: symbolic links to its outputs. A stage whose
    settings differ (:data:`_REUSE_PINS`: a judged build reusing a label-free one makes its own queries) is done
    here, saying why; a build of another collection, or of another version of it, is refused."""
    other = read_record(plan.reuse)
    if other is None:
        raise AheadrankError(f"--reuse {plan.reuse}: not a build directory ({BUILD_FILE} missing)")
    defaults = _plan_defaults()
    theirs_plan = {k: other.plan.get(k, defaults[k]) for k in defaults}
    mine_plan = asdict(plan)
    # the judgments each trains on, as resolved ("auto" is "train" or "none"): what the queries stage made
    queries = other.stages.get("queries")
    if queries is not None:
        theirs_plan["labels"] = queries.get("judged_split") or "none"
    else:
        with contextlib.suppress(AheadrankError):
            theirs_plan["labels"] = judged_split(plan.collection, str(theirs_plan["labels"])) or "none"
    mine_plan["labels"] = judged_split(plan.collection, plan.labels) or "none"

    def differs(keys: tuple[str, ...]) -> list[str]:
        return [k for k in keys if str(theirs_plan[k]) != str(mine_plan[k])]

    def said(k: str) -> str:
        return f"{k}={theirs_plan[k]!r}, not {mine_plan[k]!r}"

    if differs(("collection",)):
        raise AheadrankError(f"--reuse {plan.reuse} was built with {said('collection')}")
    read = other.stages.get("collection", {}).get("fingerprint")
    # its documents as they are now (the judgments are the queries stage's, not lent where they differ)
    if read is not None:
        now = collection_fingerprint(plan.collection, None, read)
        said_now = changes({k: read.get(k) for k in now}, now)
        if said_now:
            raise AheadrankError(
                f"--reuse {plan.reuse} was built from another version of {plan.collection} ({'; '.join(said_now)}): "
                "give --reuse a build of the collection as it is now, or none"
            )
    lendable = [s for s in SHARED_STAGES if s in other.stages and s not in record.stages]
    mine, theirs = paths(plan.out), paths(plan.reuse)

    def link(key: str) -> None:
        if theirs[key].exists() and not mine[key].exists():
            mine[key].symlink_to(theirs[key].resolve())

    for stage in lendable:
        if differs(_REUSE_PINS[stage]):
            echo(f"[{stage}] not reused: {plan.reuse} was built with {said(differs(_REUSE_PINS[stage])[0])}")
            continue
        info = {**other.stages[stage], "reused": str(plan.reuse)}
        if stage == "bm25":
            link("lucene")
        elif stage == "queries":
            link("queries")
        elif stage == "dense":
            link("dense")
            multi = other.stages.get("collection", {}).get("multi_window")
            if not stores_windows(plan, multi):
                # this build serves no window prior: the other's windows are not its
                info.pop("windows", None)
            elif "windows" in info and theirs["windows"].exists():
                link("windows")
            else:  # the stage runs: it finds the field linked complete and embeds only the windows
                echo(f"[dense] its field reused from {plan.reuse}; the sentence windows are embedded here")
                continue
        record.stages[stage] = info


def drop_train_state(out: Path, echo=print) -> int:
    """Remove a finished train stage's resumable state (``rankers.training.state_file``): nothing reads it again,
    since ``build.json`` marks the stage done and pins every setting a retraining would change (a rerun with other
    steps, rate or teacher is refused). It holds the weights three times over, the model and its optimizer's two
    moments (556 MB for MORES 2x IB S2). Also removes one an older build left behind. Returns the bytes freed."""
    from aheadrank.rankers.training import state_file

    state = state_file(paths(out)["checkpoint"])
    try:
        size = state.stat().st_size
        state.unlink()
    except FileNotFoundError:
        return 0
    echo(f"[train] removed its resumable state {state.name} ({size / 2**20:.0f} MB): the stage is done")
    return size


def peak_summary(stages: dict) -> str:
    """The build's last words on memory: the largest resident peak of the stages this build ran (not reused)
    and the largest anonymous one (:mod:`aheadrank.memory`), each with its stage; "" where none was measured."""
    own = {k: s for k, s in stages.items() if "reused" not in s}
    said = []
    for field_, what in (("peak_rss_mb", "resident"), ("peak_anon_mb", "anonymous")):
        peaks = {k: s[field_] for k, s in own.items() if field_ in s}
        if peaks:
            top = max(peaks, key=peaks.get)
            said.append(f"{peaks[top]:,} MB {what} ({top} stage)")
    return f"; peak memory {', '.join(said)}" if said else ""


def build(
    plan: BuildPlan, *, search: Search | None = None, until: str | None = None, echo=print
) -> BuildRecord:
    """Run (or resume) every stage not yet done, up to and including ``until``; returns the record.
    ``search``: BM25 hits {qid: [(docid, score)]} for given queries (a cache, e.g. on a machine without Java)."""
    if plan.labels not in LABELS and not plan.labels.strip():
        raise AheadrankError("--labels is auto, none or a qrels split name")
    if plan.priors not in PRIORS_MODES:
        raise AheadrankError(f"--priors is {' or '.join(PRIORS_MODES)}, not {plan.priors!r}")
    if plan.positive not in POSITIVES:
        raise AheadrankError(f"--positive is {' or '.join(POSITIVES)}, not {plan.positive!r}")
    if plan.teacher not in TEACHER_NAMES:
        raise AheadrankError(f"--teacher is {' or '.join(TEACHER_NAMES)}, not {plan.teacher!r}")
    from aheadrank.indexer.build import check_dask

    check_dask(plan.scheduler, plan.workers)
    from aheadrank.store.spec import DTYPES

    if plan.dtype not in DTYPES:
        raise AheadrankError(f"--dtype is {', '.join(DTYPES)}, not {plan.dtype!r}")
    if plan.language != "auto":
        from aheadrank.indexer.language import BM25_LANGUAGES

        if plan.language not in BM25_LANGUAGES:
            raise AheadrankError(
                f"--language is auto or one of {', '.join(BM25_LANGUAGES)}, not {plan.language!r}"
            )
    if until is not None and until not in STAGES:
        raise AheadrankError(f"unknown stage {until!r}: one of {', '.join(STAGES)}")
    check_plan(plan)  # an unknown ranker, recipe, labels split, base or --init fails before any work
    check_device(plan.device)
    out = plan.directory()
    made = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file in the way, a read-only parent: one line, nothing written
        raise AheadrankError(f"cannot make the build folder --out {out}: {describe(exc)}") from exc
    if not made and not (out / BUILD_FILE).is_file() and paths(out)["checkpoint"].exists():
        # the train stage writes checkpoint/ over what is there: never over a checkpoint no build recorded
        raise AheadrankError(
            f"--out {out} holds a checkpoint/ but no {BUILD_FILE}: not a build's, and the train stage would replace "
            "it; give a new or empty --out (or the folder of the build to resume)"
        )
    try:
        # one build of a directory at a time: a second would redo the stages the first has not recorded yet (BM25
        # and the pseudo-queries rewritten under it) and the two would overwrite each other's build.json
        with exclusive_lock(out / BUILD_LOCK, f"the build {out}"):
            return _build_locked(plan, out, search, until, echo)
    except BaseException:
        if made:  # a build that failed before writing anything (an unusable collection) leaves no empty --out
            with contextlib.suppress(OSError):
                out.rmdir()  # only when empty: what a stage wrote stays for the resume
        raise


def documents(record: BuildRecord) -> int | None:
    """The collection's documents as its stage counted them (None before it ran)."""
    return record.stages.get("collection", {}).get("documents")


def _build_locked(
    plan: BuildPlan, out: Path, search: Search | None, until: str | None, echo: Callable[[str], object]
) -> BuildRecord:
    from aheadrank.indexer.bm25 import release_java_memory
    from aheadrank.memory import StageMemory

    record = read_record(out) or BuildRecord(asdict(plan))
    _check_same_plan(record.plan, plan, record.stages)
    check_same_collection(plan, record, out)
    split = judged_split(plan.collection, plan.labels)
    made = record.stages.get("queries")
    # a build begun where --labels auto meant another recipe (before MIN_JUDGED_QUERIES, or under another minimum)
    if made is not None and made.get("judged_split") != split:
        was = (
            f"on the judgments of qrels/{made['judged_split']}" if made.get("judged_split") else "label-free"
        )
        n = relevant_queries(plan.collection, "train")
        least = 1 if made.get("judged_split") else n + 1  # auto trained on any number before the minimum
        raise AheadrankError(
            f"{out} was built {was}; --labels {plan.labels} now builds "
            f"{'label-free' if split is None else 'on qrels/' + split}: resume it with "
            f"{MIN_JUDGED_VARIABLE}={least}, or build into another --out"
        )
    # a kind means the variant of its day (LABEL_FREE_VARIANTS, JUDGED_VARIANTS): a build trained as another
    # variant is refused before a later stage stores or serves under the new one
    trained = record.stages.get("train", {}).get("variant")
    if trained is not None and trained != (now := plan_variant(plan).name):
        raise AheadrankError(
            f"{out} trained {trained}; --ranker {plan.ranker} now builds {now}: build into another --out "
            f"(--reuse {out} keeps its shared stages), with --ranker {trained} for the same ranker"
        )
    note = auto_labels_note(plan.collection, plan.labels)
    if note is not None and made is None:
        echo(f"[labels] {note}")
    record.plan = asdict(plan)
    if plan.reuse:
        _link_shared(plan, record, echo)
        _write_record(out, record)  # what it linked is recorded even where no stage runs after it
    # a stage whose output was deleted is done again, with the stages after it
    for i, stage in enumerate(STAGES):
        gone = missing_output(stage, out, record.stages[stage]) if stage in record.stages else None
        if gone:
            redo = [s for s in STAGES[i:] if s in record.stages]
            echo(f"[{stage}] recorded done, but {out / gone} is gone: doing {', '.join(redo)} again")
            store = paths(out)["store"]
            if "train" in redo and "store" in redo and store.exists():  # bound to the lost checkpoint
                shutil.rmtree(store)
                echo(f"[store] removed {store}: it was written by the checkpoint the train stage makes again")
            for s in redo:
                del record.stages[s]
            _write_record(out, record)
            break
    runners = {
        "collection": lambda: stage_collection(plan),
        "bm25": lambda: stage_bm25(plan),
        "dense": lambda: stage_dense(plan, documents(record)),
        "queries": lambda: stage_queries(plan, search),
        "train": lambda: stage_train(plan, search),
        "store": lambda: stage_store(plan, documents(record)),
        "priors": lambda: stage_priors(plan, search),
    }
    t_all = time.perf_counter()
    ran: set[str] = set()
    for stage in STAGES:
        if stage in record.stages:
            echo(f"[{stage}] done before ({record.stages[stage].get('seconds', 0):.0f} s)")
        else:
            # also between stages: a collection edited while the build runs
            check_same_collection(plan, record, out)
            # from the stage's first line on: an interrupt right after "[stage] ..." is said too
            try:
                echo(f"[{stage}] ...")
                # refuses a store that cannot fit
                room = store_room(plan, record) if stage == "store" else None
                if room:
                    echo(room[0])
                t0 = time.perf_counter()
                with StageMemory() as memory:
                    info = runners[stage]()
            except KeyboardInterrupt:  # Ctrl-C, SIGTERM: say where it stopped and how to go on, then stop
                echo(f"[{stage}] interrupted: what is done is kept (shards too); the same command resumes it")
                raise
            info["seconds"] = round(time.perf_counter() - t0, 1)
            if room:
                info["store_bytes_estimate"] = round(room[1])  # beside what it wrote: store_bytes
            info.update(memory.record())
            release_java_memory()  # BM25's JVM heap is not carried into the next stage
            record.stages[stage] = info
            ran.add(stage)
            _write_record(out, record)
            echo(
                f"[{stage}] {info['seconds']:.0f} s  {json.dumps({k: v for k, v in info.items() if k != 'seconds'})}"
            )
        if stage == "train":
            drop_train_state(out, echo)
        if stage in ("collection", "dense") and stage != until:
            line = estimate(plan, record, stage, until, earlier=stage not in ran)
            if line:
                echo(line)
        if stage == until:
            break
    total = sum(s.get("seconds", 0) for s in record.stages.values() if "reused" not in s)
    echo(
        f"build {out}: {total / 60:.1f} min of stages in all ({(time.perf_counter() - t_all) / 60:.1f} min this run)"
        + peak_summary(record.stages)
    )
    return record
