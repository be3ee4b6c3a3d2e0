"""Repeated real-size decode steps against the reference's selection: where the bf16 Triton step
picks other blocks than the float32 reference, are the two near a tie (a valid top-n either way)
or is the kernel wrong?

Each draw: fresh random bf16 caches (``gpu_decode.make_inputs``), one default step, the float32
reference's blocks; every row whose blocks differ is checked with
:func:`nsa.testing.assert_valid_selection` against the float64 block scores (``SELECTION_EPS``
for bf16), and the relative score gap between the blocks it swapped is printed. A gap near
float32 rounding is a near-tie; an invalid selection raises.

Usage: ``python scripts/gpu_decode_selection_check.py [--batch 64] [--context 65536] [--draws 8]``.
"""

from __future__ import annotations

import argparse

import torch

from gpu_decode import CONFIG, make_inputs, run_nsa, run_reference
from nsa.testing import SELECTION_EPS, assert_valid_selection, block_scores


def swapped_gap(idx: torch.Tensor, ref_idx: torch.Tensor, scores: torch.Tensor) -> float:
    """The largest relative gap between the scores of the blocks only one of ``idx``/``ref_idx``
    holds (one row-group's ``[n]`` blocks, ``scores [nblk]``)."""
    ours, refs = set(idx.tolist()), set(ref_idx.tolist())
    mine, theirs = ours - refs, refs - ours
    worst = 0.0
    for a in mine - {-1}:
        for b in theirs - {-1}:
            sa, sb = float(scores[a]), float(scores[b])
            worst = max(worst, abs(sa - sb) / max(abs(sa), abs(sb), 1e-30))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=65536)
    parser.add_argument("--draws", type=int, default=8)
    args = parser.parse_args()
    eps = SELECTION_EPS[torch.bfloat16]
    print(f"batch {args.batch}, context {args.context}, {args.draws} draws; selection eps {eps:g}")
    for draw in range(args.draws):
        t = make_inputs(args.batch, args.context)
        _, idx = run_nsa(t)
        _, ref_idx = run_reference(t)
        rows = (idx != ref_idx).flatten(1).any(1).nonzero().flatten().tolist()  # [B, 1, H, n] -> sequences
        gaps = []
        for b in rows:
            n = int(t["seq_lens"][b])
            scores = block_scores(t["q"][b : b + 1], t["k_cmp"][b : b + 1, : CONFIG.num_cmp(n)], CONFIG, q_offset=n - 1)
            assert_valid_selection(idx[b : b + 1], ref_idx[b : b + 1], scores, CONFIG, q_offset=n - 1, eps=eps)
            for h in range(idx.shape[2]):
                if not torch.equal(idx[b, 0, h], ref_idx[b, 0, h]):
                    gaps.append(swapped_gap(idx[b, 0, h].cpu(), ref_idx[b, 0, h].cpu(), scores[0, 0, h].cpu()))
        shown = ", ".join(f"{g:.1e}" for g in gaps) or "-"
        print(f"draw {draw}: {len(rows)} sequences with other blocks, all valid; swapped blocks' relative gaps: {shown}",
              flush=True)
        del t
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
