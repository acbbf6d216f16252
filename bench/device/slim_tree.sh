#!/bin/bash
# The device tool sends the tracked tree, and bench/results/ alone is over its 64 MiB: take the results out of the
# index for a call and put them back after (the files stay on disk; nothing the device scripts run reads them).
#   bash bench/device/slim_tree.sh out    # before run(...)
#   bash bench/device/slim_tree.sh back   # after it, before any commit
set -euo pipefail
cd "$(dirname "$0")/../.."
EXCLUDE=.git/info/exclude
case "${1:-}" in
  out)
    if [ -n "$(git status --porcelain -- bench/results)" ]; then
      echo "bench/results has uncommitted changes: commit them first (back restores the committed index)" >&2
      exit 1
    fi
    git rm -r -q --cached bench/results
    mkdir -p .git/info && { grep -qx "/bench/results/" $EXCLUDE 2>/dev/null || echo "/bench/results/" >> $EXCLUDE; }
    git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {printf "tracked tree now %.1f MiB\n", s / 1048576}'
    ;;
  back)
    sed -i '\#^/bench/results/$#d' $EXCLUDE
    git reset -q HEAD -- bench/results
    git status --short -- bench/results | head -5
    ;;
  *)
    echo "usage: $0 out|back" >&2
    exit 2
    ;;
esac
