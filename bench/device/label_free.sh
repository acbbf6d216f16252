#!/bin/bash
# On a lent GPU machine, from the repo root (bench/device/label_free_payload.sh made .gpu-lf here first):
#   run(command="bash bench/device/label_free.sh [bench args...]", carry=[".gpu-lf"])
# Lays the package out as pyproject.toml maps it, unpacks the payload into /tmp, points the prepared builds at it
# (the dense stage and everything after it run here), then bench/label_free.py --device cuda; results in $OUT
# ($NAME.log and $NAME.tar.xz, NAME=lf unless given: several runs in one call keep theirs).
set -u
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
G=$PWD/.gpu-lf S=/tmp/site P=/tmp/pkg W=/tmp/lf-work D=/tmp/lf-data N=${NAME:-lf}
source bench/device/common.sh
layout_package
unpack_base
if [ ! -d $D ]; then
  cp -r $G/data $D && xz -d $D/*/corpus.jsonl.xz
  cp -r $G/work $W && xz -d $W/bm25-hits/*.xz
  python3 - "$D" "$W" <<'PY'
import json, sys
from pathlib import Path
data, work = Path(sys.argv[1]), Path(sys.argv[2])
for rec in work.glob("*/shared/build.json"):
    r = json.loads(rec.read_text())
    r["plan"].update(collection=str(data / rec.parent.parent.name), base="/tmp/minilm", device="cuda", recipe="cpu")
    r["stages"] = {k: v for k, v in r["stages"].items() if k in ("collection", "bm25", "queries")}
    rec.write_text(json.dumps(r, indent=2))
PY
fi
export PYTHONPATH=$S:$P
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
t0=$(date +%s)
timeout ${LIMIT_S:-540} ${PYBIN:-python3} -P bench/label_free.py --device ${DEVICE:-cuda} --recipe cpu --base /tmp/minilm --data $D \
  --workdir $W --out $OUT/$N --no-progress "$@" > $OUT/$N.log 2>&1
echo "rc=$? after $(( $(date +%s) - t0 )) s" >> $OUT/$N.log
tail -n 60 $OUT/$N.log
tar -C $OUT -cJf $OUT/$N.tar.xz $N && rm -rf $OUT/$N
ls -la $OUT
