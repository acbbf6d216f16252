#!/usr/bin/env bash
# One-shot index job (docker-compose service `index`): BM25 index -> ranker checkpoint -> representation store,
# all under $AHEADRANK_DATA. Every step is skipped when its output is already complete, so re-running the job
# (or restarting it after a crash) resumes where it stopped and a finished volume costs a second.
#
# Environment (defaults in brackets):
#   AHEADRANK_COLLECTION   collection to index [the bundled SciFact sample]; a BEIR directory with
#                          qrels/train.tsv is needed to train, anything else gets an untrained checkpoint
#   AHEADRANK_DATA         output folder [/data]: lucene/, ckpt/, store/
#   AHEADRANK_RANKER       bert | mores | prettr | tk [tk] (tk gets --layers 2 unless AHEADRANK_LAYERS is set)
#   AHEADRANK_TRAIN_STEPS  training steps [200]; 0 = no training (untrained checkpoint)
#   any other AHEADRANK_*  read by the aheadrank commands themselves (AHEADRANK_BASE, AHEADRANK_DEVICE,
#                          AHEADRANK_BATCH_SIZE, AHEADRANK_DTYPE, AHEADRANK_EVAL_EVERY, ...; see `aheadrank <cmd> --help`)
set -euo pipefail

log() { printf '[index-job] %s\n' "$*"; }
warn() { printf '[index-job] WARNING: %s\n' "$*" >&2; }
die() {
    printf '[index-job] error: %s\n' "$*" >&2
    exit 2
}

DATA="${AHEADRANK_DATA:-/data}"
RANKER="${AHEADRANK_RANKER:-tk}"
STEPS="${AHEADRANK_TRAIN_STEPS:-200}"
COLLECTION="${AHEADRANK_COLLECTION:-}"
if [[ -z "$COLLECTION" ]]; then
    COLLECTION="$(python -c "import aheadrank, pathlib; print(pathlib.Path(aheadrank.__file__).parent / 'data' / 'scifact-sample')")"
fi

LUCENE="$DATA/lucene"
CKPT="$DATA/ckpt"
STORE="$DATA/store"
TRAIN_STATE="$DATA/ckpt.train-state.pt" # written by `aheadrank train` next to --out (its resume point)

[[ -e "$COLLECTION" ]] || die "collection $COLLECTION does not exist (AHEADRANK_COLLECTION; mounted?)"
[[ "$STEPS" =~ ^[0-9]+$ ]] || die "AHEADRANK_TRAIN_STEPS must be a whole number, got '$STEPS'"
case "$RANKER" in
bert | mores | prettr | tk) ;;
*) die "AHEADRANK_RANKER must be bert, mores, prettr or tk, got '$RANKER'" ;;
esac
mkdir -p "$DATA" || die "cannot create $DATA"
[[ -w "$DATA" ]] || die "$DATA is not writable by uid $(id -u)"

ranker_opts=()
if [[ "$RANKER" == tk && -z "${AHEADRANK_LAYERS:-}" ]]; then
    ranker_opts=(--layers 2)
fi

log "collection $COLLECTION -> $DATA (ranker $RANKER, $STEPS training steps)"

# (a) BM25 Lucene index: bm25-index builds into lucene.partial and swaps it in, so segments_* means complete
if compgen -G "$LUCENE/segments_*" >/dev/null; then
    log "bm25: skipped, $LUCENE is already a Lucene index"
else
    log "bm25: indexing the collection into $LUCENE"
    aheadrank bm25-index --collection "$COLLECTION" --index "$LUCENE"
fi

# (b) checkpoint. `aheadrank train` writes the best checkpoint at every validation that improves and
# train-history.json only when it finishes, so a fingerprint alone is not "done" while a resume point exists.
checkpoint_complete() {
    [[ -f "$CKPT/fingerprint.json" ]] && { [[ -f "$CKPT/train-history.json" ]] || [[ ! -e "$TRAIN_STATE" ]]; }
}
if checkpoint_complete; then
    log "checkpoint: skipped, $CKPT is complete"
elif ((STEPS > 0)) && [[ -f "$COLLECTION/qrels/train.tsv" ]]; then
    log "checkpoint: training $RANKER for $STEPS steps on $COLLECTION into $CKPT$([[ -e "$TRAIN_STATE" ]] && echo ' (resuming)')"
    aheadrank train --ranker "$RANKER" --collection "$COLLECTION" --index "$LUCENE" --out "$CKPT" \
        --steps "$STEPS" ${ranker_opts[@]+"${ranker_opts[@]}"}
    rm -f "$TRAIN_STATE" # finished: the resume point is dead weight (and would block a later retrain)
else
    if ((STEPS == 0)); then
        why="AHEADRANK_TRAIN_STEPS=0"
    else
        why="$COLLECTION is not a BEIR directory with qrels/train.tsv"
    fi
    warn "$why: writing an UNTRAINED $RANKER checkpoint (initialised from the base model)."
    warn "Its rankings will be worse than BM25's. Mount a BEIR collection with qrels/train.tsv to train one."
    log "checkpoint: initialising an untrained $RANKER checkpoint at $CKPT"
    rm -f "$TRAIN_STATE"
    aheadrank init-ranker "$RANKER" --out "$CKPT" --overwrite ${ranker_opts[@]+"${ranker_opts[@]}"}
fi

# (c) representation store: `aheadrank index` resumes a partial store by itself; a store built by another
# checkpoint (the checkpoint was replaced) is rebuilt, since the service refuses a mismatched pair.
store_state="$(
    python - "$STORE" "$CKPT" <<'PY'
import json
import sys
from pathlib import Path

from aheadrank.store.manifest import read_manifest

store, ckpt = Path(sys.argv[1]), Path(sys.argv[2])
if not (store / "manifest.json").is_file():
    print("missing")
    sys.exit()
try:
    manifest = read_manifest(store)
except Exception:  # unreadable: let `aheadrank index` say what is wrong
    print("partial")
    sys.exit()
if manifest.spec.fingerprint != json.loads((ckpt / "fingerprint.json").read_text())["sha256"]:
    print("stale")
else:
    print("complete" if manifest.complete else "partial")
PY
)"
case "$store_state" in
complete)
    log "store: skipped, $STORE is complete and matches the checkpoint"
    ;;
stale)
    log "store: $STORE was built by another checkpoint; rebuilding it"
    aheadrank index --checkpoint "$CKPT" --collection "$COLLECTION" --store "$STORE" --overwrite
    ;;
*)
    log "store: encoding the collection into $STORE$([[ "$store_state" == partial ]] && echo ' (resuming)')"
    aheadrank index --checkpoint "$CKPT" --collection "$COLLECTION" --store "$STORE"
    ;;
esac

log "done: serve with aheadrank serve --checkpoint $CKPT --store $STORE --index $LUCENE"
