#!/usr/bin/env bash
# Record the GPU benchmark baseline, tables and plots in one go, on the GPU machine, from a checkout.
#
#   scripts/gpu_record.sh                      # everything at the profile's sizes (about 10 minutes)
#   STEPS=pytest scripts/gpu_record.sh         # only the baseline; STEPS=cli only the tables and plots
#   CONTEXTS=4k,16k LENGTHS=8k PYTEST_ARGS="-k 'S4096 or T8192'" scripts/gpu_record.sh   # a quick check
#
# Each benchmark spends at most about 30 s (pytest) or BUDGET=10 s (tables) measuring; slow
# points get fewer rounds (never fewer than 3), which their records say. On the lent GPU
# machine (10 minutes a command) run the two STEPS as two commands if one does not fit, and
# copy $OUT/benchmarks.json into gpu_profiles/baselines/<profile>/ before the cli step so its
# plots draw the new baseline.
#
# Writes into the repository:
#   gpu_profiles/baselines/<profile>/benchmarks.json   (pytest tests/benchmarks --nsa-baseline=save)
#   docs/img/decode_<profile>.png, docs/img/prefill_<profile>.png, docs/img/packed_<profile>.png
# and copies them, with decode.csv, prefill.csv, packed.csv, routing.txt and pytest.log, into $OUT
# (default ./bench-out). The profile is the one matching the GPU (PROFILE=... to force one).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/bench-out}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT" docs/img

# nsa and its pytest plugin must be importable; the GPU machine is offline, so no build isolation.
PLUGIN=()
if ! "$PY" -c "import nsa.bench, pytest_nsa.benchmarks" 2>/dev/null; then
    if ! "$PY" -m pip install -q --no-build-isolation --no-deps -e . >"$OUT/install.log" 2>&1; then
        export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
        PLUGIN=(-p pytest_nsa.plugin)  # no entry point without an install: load the plugin by name
    fi
fi

PROFILE="${PROFILE:-$("$PY" - <<'PYEOF'
from pytest_nsa import hardware
from pytest_nsa.profiles import SHIPPED_DIR, Catalog
from pytest_nsa.selection import auto

profile, why = auto(Catalog([SHIPPED_DIR]), hardware.detect())
if profile is None or profile.device.kind != "cuda":
    raise SystemExit(f"no GPU profile matches this machine: {why}")
print(profile.name)
PYEOF
)}"
echo "profile: $PROFILE" >&2
export PYTHONUNBUFFERED=1

"$PY" -c "import torch; from nsa.routing import explain; print(explain('cuda', torch.bfloat16))" | tee "$OUT/routing.txt"

STEPS="${STEPS:-pytest cli}"
status=0

# 1. The baseline: the pytest suites at the profile's contexts, batch sizes and lengths.
if [[ " $STEPS " == *" pytest "* ]]; then
    eval "set -- ${PYTEST_ARGS:-}"
    set +e
    "$PY" -m pytest tests/benchmarks "${PLUGIN[@]}" --gpu-profile "$PROFILE" --nsa-baseline=save \
        -p no:cacheprovider -q "$@" 2>&1 | tee "$OUT/pytest.log"
    status=${PIPESTATUS[0]}
    set -e
    cp "gpu_profiles/baselines/$PROFILE/benchmarks.json" "$OUT/" 2>/dev/null || echo "no baseline was written" >&2
fi

# 2. The tables and the plots (the stored baseline of the profile is drawn in).
if [[ " $STEPS " == *" cli "* ]]; then
    "$PY" -m nsa.bench decode --profile "$PROFILE" ${CONTEXTS:+--contexts "$CONTEXTS"} --batch "${BATCHES:-1,16}" \
        --graph --budget "${BUDGET:-10}" --csv "$OUT/decode.csv" --plot "docs/img/decode_$PROFILE.png"
    "$PY" -m nsa.bench prefill --profile "$PROFILE" ${LENGTHS:+--lengths "$LENGTHS"} --budget "${BUDGET:-10}" \
        --csv "$OUT/prefill.csv" --plot "docs/img/prefill_$PROFILE.png"
    "$PY" -m nsa.bench packed --profile "$PROFILE" --budget "${BUDGET:-10}" --csv "$OUT/packed.csv" \
        --plot "docs/img/packed_$PROFILE.png"
    cp "docs/img/decode_$PROFILE.png" "docs/img/prefill_$PROFILE.png" "docs/img/packed_$PROFILE.png" "$OUT/"
fi
echo "pytest exit status: $status; outputs in $OUT" >&2
exit "$status"
