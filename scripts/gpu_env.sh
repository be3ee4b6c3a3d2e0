# Sourced by scripts/gpu_sessionNN.sh: strict pipes, the repository root as the working folder,
# nsa and its pytest plugin importable from the checkout (the GPU machine has no install), and
# $OUT, the folder whose files the device tool brings back.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH=$PWD/src:$PWD/scripts PYTEST_PLUGINS=pytest_nsa.plugin PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/nsa_out}"
mkdir -p "$OUT"

# GPU tests on 3 workers with a validation report in $OUT: gpu_tests REV FILE... (report named
# after REV; at most 300 s, the tail of the output shown).
gpu_tests() {
    local rev="${1:?gpu_tests needs the commit to name the report after}"
    shift
    timeout 300 python -m pytest -q -n 3 -m "not benchmark" --gpu-profile auto --nsa-report "$OUT" \
        --nsa-report-commit "$rev" "$@" 2>&1 | tail -8
}

# The decode GPU tests (kernels, graph, cache, module), the report named after $1.
decode_gpu_tests() {
    gpu_tests "${1:?the decode tests need the commit to name the report after}" \
        tests/ops/test_decode_kernel.py tests/test_decode_graph.py tests/test_cache.py tests/test_module.py
}
