#!/bin/bash
# Builds .gpu-lf/ (git-ignored): what bench/device/label_free.sh needs to run bench/label_free.py on a GPU machine
# that has torch but no Java, no aheadrank install and no ../shared: the base in float16 (loaded into float32
# parameters), the BEIR collections (xz), the shared build stages that need Java (`bench/label_free.py --prepare`:
# the BM25 stage and the pseudo-queries with their hits) and and the test queries' BM25 hits (the runs come back plain: zstandard is not there).
# Then, with this workplace's device tool: run(command="bash bench/device/label_free.sh", carry=[".gpu-lf"]).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
WORK=${WORK:-work/label-free}
COLLECTIONS=${COLLECTIONS:-"scifact cranfield vaswani"}
mkdir -p .git/info && { grep -qx "/.gpu-lf/" .git/info/exclude 2>/dev/null || echo "/.gpu-lf/" >> .git/info/exclude; }
rm -rf .gpu-lf && mkdir -p .gpu-lf/minilm .gpu-lf/data .gpu-lf/work/bm25-hits
HF_HUB_OFFLINE=1 $PY bench/label_free.py --prepare --no-progress --workdir "$WORK" --collections $COLLECTIONS
M=$($PY -c "from aheadrank.rankers.base_model import resolve_base; print(resolve_base(None))")
cp "$M"/{config.json,vocab.txt,tokenizer.json,tokenizer_config.json,special_tokens_map.json} .gpu-lf/minilm/
$PY -c "
from safetensors.torch import load_file, save_file
sd = load_file('$M/model.safetensors')
save_file({k: v.half().contiguous() for k, v in sd.items()}, '.gpu-lf/minilm/model.safetensors')"
xz -T2 -9 .gpu-lf/minilm/model.safetensors
# the test queries' hits only (the pseudo-queries' are in each build's queries.json.gz)
HF_HUB_OFFLINE=1 $PY - "$WORK" $COLLECTIONS <<'PY'
import shutil, sys
from pathlib import Path
sys.path.insert(0, "bench")
from benchkit import Bm25Hits, digest, eval_topics
from label_free import DEPTH
work = Path(sys.argv[1])
for c in sys.argv[2:]:
    coll = Path("../shared/data") / c
    hits = Bm25Hits(coll, work, False)
    queries, _ = eval_topics(coll, "test", None)
    name = f"{hits.key}-{digest([sorted(queries.items()), DEPTH])}.json"
    shutil.copy(work / "bm25-hits" / name, Path(".gpu-lf/work/bm25-hits") / name)
PY
for c in $COLLECTIONS; do
  mkdir -p .gpu-lf/data/$c/qrels .gpu-lf/work/$c/shared
  cp ../shared/data/$c/qrels/* .gpu-lf/data/$c/qrels/ && cp ../shared/data/$c/queries.jsonl .gpu-lf/data/$c/
  xz -T2 -c ../shared/data/$c/corpus.jsonl > .gpu-lf/data/$c/corpus.jsonl.xz
  cp "$WORK"/$c/shared/{build.json,queries.json.gz} .gpu-lf/work/$c/shared/
done
xz -T2 .gpu-lf/work/bm25-hits/*.json
cp bench/device/label_free.sh .gpu-lf/
du -sh .gpu-lf
