#!/bin/bash
# Builds .gpu/ (git-ignored): what bench/device/run.sh needs on a GPU machine that has torch but no Java,
# no aheadrank install and no ../shared: the base model (float16 safetensors, to fit the 64 MiB transfer
# limit; loaded into float32 parameters), the BEIR collections (xz) and the BM25 hits of every query set
# the bench searches (bench/effectiveness.py's Bm25Hits cache, filled here with Pyserini).
# Then, with this workplace's device tool:  run(command="bash .gpu/run.sh NAME 545 --sim ...", carry=[".gpu"])
# BASE=0: no base in .gpu (run.sh then takes .gpu-lf's, carried beside it: one base within the 64 MiB, not two).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
WORK=${WORK:-work/bench-effectiveness}
mkdir -p .git/info && { grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude; }
rm -rf .gpu && mkdir -p .gpu/work/bm25-hits .gpu/data
HF_HUB_OFFLINE=1 $PY - "$WORK" <<'PY'
import sys
sys.path.insert(0, "bench")
from pathlib import Path
import effectiveness as E
args = E.parse_args(["--val-queries", "100", "--no-progress", "--workdir", sys.argv[1]])
bm = E.Bm25Hits(args.collection, args.workdir, False)
bm.hits(E.eval_topics(args.collection, "test", None)[0], 100)
E.validation_set(E.TrainingDataCache(args.collection, "train", bm), args)  # train + validation queries
for c in args.eval_collections:
    E.Bm25Hits(c, args.workdir, False).hits(E.eval_topics(c, "test", None)[0], 100)
PY
if [ "${BASE:-1}" != 0 ]; then
  mkdir -p .gpu/minilm
  M=$($PY -c "from aheadrank.rankers.base_model import resolve_base; print(resolve_base(None))")
  cp "$M"/{config.json,vocab.txt,tokenizer.json,tokenizer_config.json,special_tokens_map.json} .gpu/minilm/
  $PY -c "
from safetensors.torch import load_file, save_file
sd = load_file('$M/model.safetensors')
save_file({k: v.half().contiguous() for k, v in sd.items()}, '.gpu/minilm/model.safetensors')"
fi
cp "$WORK"/bm25-hits/*.json .gpu/work/bm25-hits/ && xz -T2 .gpu/work/bm25-hits/*.json
for c in scifact vaswani cranfield; do
  mkdir -p .gpu/data/$c/qrels && cp ../shared/data/$c/qrels/* .gpu/data/$c/qrels/
  cp ../shared/data/$c/{queries.jsonl,SOURCE.md} .gpu/data/$c/ && xz -T2 -c ../shared/data/$c/corpus.jsonl > .gpu/data/$c/corpus.jsonl.xz
done
cp bench/device/run.sh .gpu/run.sh
du -sh .gpu
