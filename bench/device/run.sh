#!/bin/bash
# (copied to .gpu/run.sh by bench/device/make_payload.sh; .gpu/seed.tar.xz, when there, is a previous run's
# NAME-meta.tar.xz: the checkpoints' and stores' metadata and runs, so that the bench reuses what it trained)
# usage: bash .gpu/run.sh NAME TIMEOUT_S [bench args...]   (on the device machine, from the repo root)
# The base: .gpu/minilm, or .gpu-lf's when make_payload.sh ran with BASE=0 (common.sh, unpack_base).
set -u
name=$1; limit=$2; shift 2
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
G=$PWD/.gpu; W=/tmp/work P=/tmp/pkg
source bench/device/common.sh
layout_package
unpack_base
if [ ! -d /tmp/data ]; then
  mkdir -p $W/bm25-hits /tmp/data
  cp $G/work/bm25-hits/*.xz $W/bm25-hits/ && xz -d -f $W/bm25-hits/*.xz
  for c in $(ls $G/data); do cp -r $G/data/$c /tmp/data/; xz -d /tmp/data/$c/corpus.jsonl.xz; done
  [ -f $G/seed.tar.xz ] && tar -C /tmp -xJf $G/seed.tar.xz && echo "seeded: $(ls $W/ckpt $W/runs | wc -l) cache entries"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch,transformers,h5py,numpy;print('torch',torch.__version__,'transformers',transformers.__version__,'h5py',h5py.__version__,'numpy',numpy.__version__,'cuda',torch.cuda.is_available())"
fi
# the working directory off sys.path (its aheadrank/ holds no rankers/ and would shadow the laid-out package);
# bench/ on it for benchkit
export PYTHONPATH=/tmp/site:$P:$PWD/bench PYTHONSAFEPATH=1
t0=$(date +%s)
timeout $limit python3 bench/effectiveness.py --device cuda --base /tmp/minilm --collection /tmp/data/scifact \
  --workdir $W --out-dir /tmp/out-$name --no-progress "$@" > $OUT/$name.log 2>&1
echo "rc=$? after $(( $(date +%s) - t0 )) s" >> $OUT/$name.log
tail -n 45 $OUT/$name.log
du -sh $W/stores/* 2>/dev/null | tail -n 20
[ -d /tmp/out-$name ] && tar -C /tmp -cJf $OUT/$name.tar.xz out-$name
(cd /tmp && find work/ckpt work/stores work/runs work/bm25-hits \( -path '*/ckpt/*.json' -o -path '*/ckpt/*/fingerprint.json' \
  -o -path '*/ckpt/*/priors.json' -o -path '*/stores/*.json' -o -path '*/stores/*/manifest.json' \
  -o -path '*/stores/*/dense/manifest.json' -o -path '*/runs/*' -o -path '*/bm25-hits/*' \) -type f 2>/dev/null \
  | tar -cJf $OUT/$name-meta.tar.xz -T -)
ls -la $OUT
true
