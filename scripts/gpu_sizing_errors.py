"""Relative errors of the bf16 prefill against the float32 reference, with the launches sized for
this GPU and for the other shipped GPUs (``nsa.ops._triton.device.sized_as``), on the same inputs;
and whether each sized run equals this GPU's bitwise. Prints a markdown table.

The errors are taken against the reference given the kernels' own blocks
(``nsa.testing.nsa_attention_with_blocks``), once their blocks passed
``nsa.testing.assert_valid_selection``; the table also gives the rows whose blocks near-ties
swapped against the reference's own, and ``o``'s error against the reference's own selection.

    PYTHONPATH=src python scripts/gpu_sizing_errors.py [--shapes T:HQ:H:DK:DV ...] [--gpus a100 rtx4090]
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import torch

sys.path.insert(0, "tests/ops")
from _kernel_inputs import nsa_run, reference_selection  # noqa: E402

from nsa import NSAConfig  # noqa: E402
from nsa.ops._triton.device import sized_as  # noqa: E402
from nsa.testing import SELECTION_EPS, assert_valid_selection, rel_error  # noqa: E402

NAMES = ("o", "dq", "dk", "dv", "dgates")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["4173:16:1:128:128", "4173:64:4:128:128", "2053:16:1:192:128"])
    parser.add_argument("--gpus", nargs="+", default=["a100", "rtx4090"])
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    print("| shape | launches sized for | swapped rows | o rel. error, own blocks | "
          + " | ".join(f"{n} rel. error" for n in NAMES) + " | bitwise = own |")
    print("|---|---|---:|---:|" + "---:|" * len(NAMES) + "---|")
    for shape in args.shapes:
        T, HQ, H, DK, DV = (int(x) for x in shape.split(":"))
        torch.manual_seed(0)
        dev = "cuda"
        q = torch.randn(1, T, HQ, DK, device=dev, dtype=torch.bfloat16)
        k = torch.randn(1, T, H, DK, device=dev, dtype=torch.bfloat16)
        v = torch.randn(1, T, H, DV, device=dev, dtype=torch.bfloat16)
        gates = torch.rand(1, T, HQ, 3, device=dev, dtype=torch.bfloat16)
        do = torch.randn(1, T, HQ, DV, device=dev, dtype=torch.float64)
        config = NSAConfig()
        up = [x.float() for x in (q, k, v, gates)]
        ref_blocks, scores = reference_selection(up[0], up[1], config)
        ref_own, _, _ = nsa_run(*up, config, "reference", do)
        own = ref = None
        for gpu in [None, *args.gpus]:
            with sized_as(gpu) if gpu else contextlib.nullcontext():
                o, blocks, grads = nsa_run(q, k, v, gates, config, "triton", do)
            got = [o, *grads]
            swapped = assert_valid_selection(blocks, ref_blocks, scores, config, eps=SELECTION_EPS[q.dtype])
            if ref is None or not torch.equal(blocks, ref[0]):
                ref_o, _, ref_grads = nsa_run(*up, config, "reference", do, block_idx=blocks)
                ref = (blocks, [ref_o, *ref_grads])
            errors = " | ".join(f"{rel_error(a, b):.3e}" for a, b in zip(got, ref[1]))
            if own is None:
                own, same = got, "-"
            else:
                same = ", ".join(n for n, a, b in zip(NAMES, got, own) if torch.equal(a, b)) or "none"
            print(f"| {shape} | {gpu or 'this GPU'} | {swapped} of {blocks[..., 0].numel()} | "
                  f"{rel_error(o, ref_own):.3e} | {errors} | {same} |", flush=True)
        del ref, own, scores, ref_own
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
