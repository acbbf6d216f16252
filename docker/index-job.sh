#!/usr/bin/env bash
# One-shot index job (docker-compose service `index`): `aheadrank build` turns the collection into everything the
# reranker serves, in $AHEADRANK_DATA/build (BM25 index, training queries, the bi-encoder's dense field, a ranker
# adapted to the collection, the representation store, the priors); the reranker runs `aheadrank serve /data/build`.
# The build records each finished stage in build.json and skips it when run again, so restarting the job (or
# re-running it after a crash) resumes where it stopped and a finished volume costs seconds.
#
# A collection without judgments (no qrels/train.tsv) is built label-free: the ranker starts from the base model
# (TK's kernel weights and PreTTR's compressor fitted to the collection), is checked on pseudo-queries cut from its
# own texts against the BM25 + bi-encoder fusion (fine-tuned on them only with AHEADRANK_TRAIN_STEPS), and is served
# with BM25 and the bi-encoder (the label-free weights: a share of 1/3 for MORES, 1/6 for TK and PreTTR; the
# bi-encoder's best sentence window too where the texts have them). A BEIR folder whose qrels/train.tsv judges 400
# queries or more trains on them (AHEADRANK_LABELS=none: not; =train: on however few; the build says which).
#
# Environment (defaults in brackets):
#   AHEADRANK_COLLECTION   collection to build from [the bundled SciFact sample]: a BEIR folder, or one JSONL or
#                          TSV file (plain, .gz or .zst)
#   AHEADRANK_DATA         output folder [/data]: the build goes to $AHEADRANK_DATA/build
#   AHEADRANK_RANKER       mores | prettr | tk | bert, or a variant (mores-2ib-s2, prettr-l5-e128, tk-2l) [mores,
#                          `aheadrank build`'s default: MORES 2xIB S2]; tk is tk-6l-base-specials with judgments
#                          and tk-6l-base without (aheadrank build --help)
#   AHEADRANK_TRAIN_STEPS  training steps, 1 or more [the recipe's: 360 on CPU with judgments, none without]
#   AHEADRANK_LABELS       auto: the collection's qrels/train.tsv where it judges 400 queries or more
#                          (AHEADRANK_MIN_JUDGED_QUERIES), else label-free; none: label-free even with judgments;
#                          train or another qrels split name: its judgments, however few [auto]
#   AHEADRANK_LANGUAGE     BM25's analyzer: auto (the collection's language where it is French, German, Spanish,
#                          Italian, Portuguese or Dutch, else English) or en, fr, de, es, it, pt, nl [auto]
#   any other AHEADRANK_*  read by `aheadrank build` itself (AHEADRANK_BASE, AHEADRANK_DEVICE, AHEADRANK_MAX_QUERIES,
#                          AHEADRANK_BUILD_PRIORS, AHEADRANK_SEED, ...; see `aheadrank build --help`)
set -euo pipefail

log() { printf '[index-job] %s\n' "$*"; }
die() {
    printf '[index-job] error: %s\n' "$*" >&2
    exit 2
}

DATA="${AHEADRANK_DATA:-/data}"
OUT="$DATA/build"
RANKER="${AHEADRANK_RANKER:-mores}"
STEPS="${AHEADRANK_TRAIN_STEPS:-}"
COLLECTION="${AHEADRANK_COLLECTION:-}"
if [[ -z "$COLLECTION" ]]; then
    COLLECTION="$(python -c "import aheadrank, pathlib; print(pathlib.Path(aheadrank.__file__).parent / 'data' / 'scifact-sample')")"
fi

[[ -e "$COLLECTION" ]] || die "collection $COLLECTION does not exist (AHEADRANK_COLLECTION; mounted?)"
[[ -z "$STEPS" || "$STEPS" =~ ^[1-9][0-9]*$ ]] ||
    die "AHEADRANK_TRAIN_STEPS must be a whole number of 1 or more (or empty: the recipe's), got '$STEPS'"
case "$RANKER" in
bert | mores | prettr | tk | mores-* | prettr-* | tk-*) ;;
*) die "AHEADRANK_RANKER must be bert, mores, prettr, tk or one of their variants, got '$RANKER'" ;;
esac
mkdir -p "$DATA" || die "cannot create $DATA"
[[ -w "$DATA" ]] || die "$DATA is not writable by uid $(id -u)"

steps_opt=()
steps_text="the recipe's"
if [[ -n "$STEPS" ]]; then
    steps_opt=(--steps "$STEPS")
    steps_text="$STEPS"
fi
if [[ "${AHEADRANK_LABELS:-auto}" == auto && ! -f "$COLLECTION/qrels/train.tsv" &&
    ! -f "$COLLECTION/qrels/train.tsv.gz" && ! -f "$COLLECTION/qrels/train.tsv.zst" ]]; then
    how="label-free: no qrels/train.tsv"
else
    how="labels ${AHEADRANK_LABELS:-auto}"
fi
log "collection $COLLECTION -> $OUT (ranker $RANKER, $steps_text training steps, $how)"

# every stage is skipped when build.json says it is done; a changed setting on a finished build is refused.
# exec: the build replaces this shell, so `docker compose stop` (SIGTERM) reaches it and it stops where it is,
# keeping the stages done (a shell in between died and left the build running, or, as PID 1, ignored the signal)
exec aheadrank build --collection "$COLLECTION" --out "$OUT" --ranker "$RANKER" ${steps_opt[@]+"${steps_opt[@]}"}
