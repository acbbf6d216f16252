#!/bin/bash
# One ranker through the user's commands, as docs/training.md runs them: train (the CPU recipe unless
# told otherwise) -> store -> BM25 top-100 of SciFact test re-ranked by the pure neural score -> nDCG@10.
# No bert, no baselines, no priors: for quick single-lever experiments (bench/results/ablation.md rows 9-10);
# bench/effectiveness.py is the full, cached comparison.
#
#   bench/train_eval.sh NAME KIND [aheadrank train options...]
#   bench/train_eval.sh tk-base tk --layers 2 --tk-base --lr 2e-5 --fresh-lr 1e-3
#
# Environment: WORK (default work/train-eval), COLLECTION (default ../shared/data/scifact), THREADS (2).
# BM25 index and the listwise teacher's dense field are built once into WORK and reused.
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=$1
KIND=$2
shift 2
B=.venv/bin/aheadrank
C=${COLLECTION:-../shared/data/scifact}
W=${WORK:-work/train-eval}
export OMP_NUM_THREADS=${THREADS:-2} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
mkdir -p "$W/$NAME"
[ -f "$W/bm25/.done" ] || { $B bm25-index --collection "$C" --index "$W/bm25" && touch "$W/bm25/.done"; }
t0=$(date +%s)
DENSE=()
[ -d "$W/dense" ] && DENSE=(--dense-store "$W/dense")  # the first run builds it (into ckpt.dense, kept as WORK/dense)
# train-history.json is written when training ends; the checkpoint exists from step 0 on (the initial weights are
# saved as the first candidate), so a run stopped part-way is run again and resumes from its saved state
[ -f "$W/$NAME/ckpt/train-history.json" ] || $B train --ranker "$KIND" --collection "$C" --index "$W/bm25" \
    --out "$W/$NAME/ckpt" "${DENSE[@]}" --no-progress "$@"
[ -d "$W/dense" ] || { [ -d "$W/$NAME/ckpt.dense" ] && mv "$W/$NAME/ckpt.dense" "$W/dense"; }
t1=$(date +%s)
$B index --checkpoint "$W/$NAME/ckpt" --collection "$C" --store "$W/$NAME/store" --no-dense --no-progress
$B rerank-run --checkpoint "$W/$NAME/ckpt" --store "$W/$NAME/store" --queries "$C" --index "$W/bm25" \
    --split test --pure --out "$W/$NAME/run.trec"
t2=$(date +%s)
echo "$NAME: train $((t1 - t0)) s, store + rerank $((t2 - t1)) s"
$B evaluate --run "$W/$NAME/run.trec" --qrels "$C" --split test --metrics nDCG@10,MRR@10
