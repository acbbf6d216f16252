#!/bin/bash
# On a lent GPU machine, from the repo root: the CUDA tests (checks.sh tests), the effectiveness bench (run.sh) and a
# label-free bench (label_free.sh) side by side, so that one start of the machine and one call serve all three
# (the GPU has room for the three; the tests' workers take the CPU cores). Here first: bench/device/make_payload.sh
# with BASE=0 (.gpu), bench/device/label_free_payload.sh (.gpu-lf: the one base), the wheels of checks.sh (.whl).
#   run(command="REG='<bench/effectiveness.py args>' LF='<bench/label_free.py args>' bash bench/device/together.sh",
#       carry=[".gpu", ".gpu-lf", ".whl"])
# REG or LF empty: that bench does not run. Limits: REG_S, LF_S, TESTS_S seconds (WORKERS: the tests' xdist workers).
# Back in $OUT (at most 8 files): setup.log, tests.log, reg.log, reg.tar.xz, reg-meta.tar.xz, lf.log, lf.tar.xz.
set -u
bash bench/device/checks.sh setup > $OUT/setup.log 2>&1 || { cat $OUT/setup.log; exit 1; }
# the float16 base where run.sh and label_free.sh look for it, before either starts
source bench/device/common.sh && unpack_base
pids=()
if [ -n "${LF:-}" ]; then (NAME=lf LIMIT_S=${LF_S:-520} bash bench/device/label_free.sh $LF > /dev/null 2>&1) & pids+=($!); fi
if [ -n "${REG:-}" ]; then (bash bench/device/run.sh reg ${REG_S:-480} $REG > /dev/null 2>&1) & pids+=($!); fi
if [ "${TESTS_S:-300}" != 0 ]; then
  TESTS_S=${TESTS_S:-300} WORKERS=${WORKERS:-6} bash bench/device/checks.sh tests > /dev/null 2>&1
fi
for p in "${pids[@]}"; do wait $p; done
for f in tests reg lf; do [ -f $OUT/$f.log ] && { echo "== $f"; tail -n 40 $OUT/$f.log; }; done
ls -la $OUT
true
