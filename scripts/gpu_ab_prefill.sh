#!/usr/bin/env bash
# A/B of the whole prefill (forward, forward+backward) between this checkout's code and another
# tree's, on one GPU in one call, each side run twice in turn so that drift shows:
#
#   git archive <rev> src | (mkdir -p ab_base && tar -x -C ab_base)   # the "before" side
#   scripts/gpu_ab_prefill.sh ab_base [LENGTHS] [ROUNDS]              # default 8192,65536 and 2
#
# Each run is `python -m nsa.bench prefill` (do_bench medians, L2 flushed, dense SDPA in the same
# run), so the figures compare with the committed tables. Delete the base tree afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE="${1:?usage: scripts/gpu_ab_prefill.sh BASE_TREE [LENGTHS] [ROUNDS]}"
LENGTHS="${2:-8192,65536}"
ROUNDS="${3:-2}"
[ -d "$BASE/src/nsa" ] || { echo "no $BASE/src/nsa: extract a tree there first" >&2; exit 2; }
for round in $(seq "$ROUNDS"); do
    for side in base new; do
        if [ "$side" = base ]; then src="$(cd "$BASE/src" && pwd)"; else src="$PWD/src"; fi
        echo "== $side, round $round ($src)"
        PYTHONPATH="$src" PYTHONUNBUFFERED=1 "${PYTHON:-python3}" -m nsa.bench prefill \
            --lengths "$LENGTHS" --budget "${BUDGET:-4}" --baseline none
    done
done
