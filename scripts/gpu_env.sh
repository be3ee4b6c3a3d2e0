# Sourced by scripts/gpu_sessionNN.sh: strict pipes, the repository root as the working folder,
# nsa and its pytest plugin importable from the checkout (the GPU machine has no install), and
# $OUT, the folder whose files the device tool brings back.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH=$PWD/src:$PWD/scripts PYTEST_PLUGINS=pytest_nsa.plugin PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/nsa_out}"
mkdir -p "$OUT"
