#!/bin/bash
# The served score of a checkpoint bench/train_eval.sh made: a store with the dense field (WORK/NAME/store-served;
# the field copied from WORK/dense, the bi-encoder's, not encoded again), the priors fitted on the queries the
# trainer held out (never test), as `aheadrank build` fits a judged build's, and SciFact test's BM25 top-100
# re-ranked by the served score.
#
#   bench/train_eval_served.sh NAME        (after bench/train_eval.sh NAME ...; same WORK and COLLECTION)
#
# Writes WORK/NAME/run+priors.trec and prints its nDCG@10 and MRR@10 and the fitted weights.
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=$1
B=.venv/bin/aheadrank
C=${COLLECTION:-../shared/data/scifact}
W=${WORK:-work/train-eval}
export OMP_NUM_THREADS=${THREADS:-2} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
[ -f "$W/$NAME/run.trec" ] || { echo "run bench/train_eval.sh $NAME first" >&2; exit 2; }
[ -d "$W/dense" ] || { echo "$W/dense: no dense field to copy (bench/train_eval.sh keeps the first one it builds)" >&2; exit 2; }
t0=$(date +%s)
$B index --checkpoint "$W/$NAME/ckpt" --collection "$C" --store "$W/$NAME/store-served" --dense-from "$W/dense" --no-progress
$B fit-priors --checkpoint "$W/$NAME/ckpt" --store "$W/$NAME/store-served" --collection "$C" --index "$W/bm25" --no-progress
$B rerank-run --checkpoint "$W/$NAME/ckpt" --store "$W/$NAME/store-served" --queries "$C" --index "$W/bm25" \
    --split test --out "$W/$NAME/run+priors.trec"
echo "$NAME served: dense + priors + rerank $(($(date +%s) - t0)) s"
$B evaluate --run "$W/$NAME/run+priors.trec" --qrels "$C" --split test --metrics nDCG@10,MRR@10
