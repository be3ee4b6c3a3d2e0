"""Comparison helpers for tests: relative errors against a higher-precision reference, and
selections compared on their own terms (near-ties may swap blocks) with outputs compared given
the same blocks.

Every :func:`assert_close` is also handed to the recorders open at the time
(:func:`record_comparisons`): pytest_nsa opens one around each test, so its report shows how
close each comparison came to its bound, not only whether it passed.

:func:`recorded_cuda_graphs` counts what ``mode="reduce-overhead"`` recorded (GPU tests, scripts).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, List, Optional, Tuple

import torch

from nsa.config import NSAConfig


def rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||actual - expected|| / ||expected||`` in float64 (NaN anywhere gives ``inf``).

    A zero reference compares by the absolute norm of ``actual``.
    """
    a, e = actual.detach().double(), expected.detach().double()
    if a.shape != e.shape:
        raise ValueError(f"shapes differ: {tuple(a.shape)} vs {tuple(e.shape)}")
    if not torch.isfinite(a).all() or not torch.isfinite(e).all():
        return float("inf")
    denom = e.norm().item()
    diff = (a - e).norm().item()
    return diff / denom if denom > 0 else diff


@dataclass(frozen=True)
class Comparison:
    """One :func:`assert_close`: what was compared, its relative error and the bound it had.

    Attributes:
        name: the ``name`` given to :func:`assert_close` (``"o"``, ``"dq"``...).
        error: :func:`rel_error` (``inf`` where either side held a NaN or an infinity).
        bound: the tolerance it was held to.
        dtype: the dtype of ``actual``, the side under test (``"bfloat16"``...).
    """

    name: str
    error: float
    bound: float
    dtype: str = ""

    @property
    def share(self) -> float:
        """``error / bound``: 1.0 is the bound itself, above 1 a failure (``inf`` when not finite)."""
        return self.error / self.bound if math.isfinite(self.error) else math.inf


_RECORDERS: List[List[Comparison]] = []


@contextmanager
def record_comparisons() -> Iterator[List[Comparison]]:
    """Collect every :func:`assert_close` made inside the block, passed or failed, in order.

    ``with record_comparisons() as found: ...`` leaves the :class:`Comparison` list in ``found``;
    blocks nest (each open recorder gets every comparison)."""
    found: List[Comparison] = []
    _RECORDERS.append(found)
    try:
        yield found
    finally:
        # By identity: two recorders that saw nothing compare equal.
        del _RECORDERS[next(i for i, r in enumerate(_RECORDERS) if r is found)]


def assert_close(name: str, actual: torch.Tensor, expected: torch.Tensor, tol: float) -> None:
    """Fail with the relative error when ``rel_error(actual, expected) > tol``; the comparison
    goes to every open :func:`record_comparisons` first."""
    err = rel_error(actual, expected)
    for found in _RECORDERS:
        found.append(Comparison(name, err, float(tol), str(actual.dtype).replace("torch.", "")))
    if not err <= tol:
        raise AssertionError(f"{name}: relative error {err:.3e} exceeds {tol:.1e}")


#: ``eps`` of :func:`assert_valid_selection` for an implementation whose inputs are of this dtype,
#: against a reference of higher precision. 16-bit inputs round the compressed keys, which moves
#: scores by about 1e-4 of their size (blocks swapped at T 4173, G 16 lay within 1.5e-4); float32
#: only sums in another order (about 1e-7).
SELECTION_EPS = {torch.float64: 1e-9, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-3}


def block_scores(q: torch.Tensor, k_cmp: torch.Tensor, config: NSAConfig, *, q_offset: int = 0) -> torch.Tensor:
    """float64 ``[B, Tq, H, nblk]``: the group score of every block for every query and KV group
    (spec Eq. 10, the reference's definition), ``-inf`` past each query's own block; what
    :func:`nsa.select_blocks` ranks. Holds all rows at once (8 bytes a block a row)."""
    from nsa.ops.select.reference import block_scores as reference_scores

    return reference_scores(q.double(), k_cmp.double(), config, config.softmax_scale(q.shape[-1]), q_offset)


def assert_valid_selection(
    block_idx: torch.Tensor,
    ref_idx: torch.Tensor,
    scores: torch.Tensor,
    config: NSAConfig,
    *,
    q_offset: int = 0,
    eps: float = 1e-5,
) -> int:
    """Check ``block_idx`` against the reference's ``ref_idx`` and ``scores`` (:func:`block_scores`);
    returns how many rows differ from ``ref_idx``.

    A top-n is discontinuous: two blocks whose scores agree to rounding may swap between two
    correct implementations, and the outputs then differ by a whole block's share. So the
    selection is checked on its own terms: ``block_idx`` holds the forced blocks, ascends, pads
    with -1 last, chooses as many blocks as ``ref_idx``, leaves out no block that scores above a
    chosen one by more than ``eps`` (relative), and equals ``ref_idx`` on every row whose weakest
    chosen and strongest rejected free blocks are further apart than that. Outputs are then
    compared given the same blocks (:func:`nsa_attention_with_blocks`).
    """
    if block_idx.dtype != torch.int32 or block_idx.shape != ref_idx.shape:
        raise AssertionError(f"block_idx: {block_idx.dtype} {tuple(block_idx.shape)}, want int32 {tuple(ref_idx.shape)}")
    if block_idx.numel() == 0:  # no query (or no KV head): nothing was chosen
        return 0
    own = (torch.arange(block_idx.shape[1], device=block_idx.device) + q_offset) // config.sel_block
    j = torch.arange(scores.shape[-1], device=block_idx.device)
    forced = (j <= own[:, None]) & ((j < config.init_blocks) | (j > own[:, None] - config.local_blocks))
    forced = forced[None, :, None, :]
    key = scores.masked_fill(forced, float("inf"))
    chosen = torch.zeros(*block_idx.shape[:3], scores.shape[-1] + 1, dtype=torch.bool, device=block_idx.device)
    chosen.scatter_(-1, torch.where(block_idx >= 0, block_idx.long(), scores.shape[-1]), True)
    chosen = chosen[..., :-1]
    valid = block_idx >= 0
    _require((valid.sum(-1) == (ref_idx >= 0).sum(-1)).all(), "a row chose another number of blocks than the reference")
    _require((valid[..., :-1] | ~valid[..., 1:]).all(), "padding -1 must come last")
    _require(torch.where(valid[..., 1:], block_idx[..., 1:] > block_idx[..., :-1], True).all(), "indices must ascend")
    _require((chosen | ~forced).all(), "a forced block is missing")
    worst_in = key.masked_fill(~chosen, float("inf")).amin(-1)
    best_out = key.masked_fill(chosen | (key == float("-inf")), float("-inf")).amax(-1)
    contested = torch.isfinite(worst_in) & torch.isfinite(best_out)  # a free pick and a block left out
    gap = torch.where(contested, best_out - worst_in, torch.zeros_like(best_out))
    tol = eps * torch.where(contested, torch.maximum(worst_in.abs(), best_out.abs()), torch.ones_like(best_out))
    above = gap > tol
    if above.any():
        rel = torch.where(above, gap / (tol / eps), torch.zeros_like(gap))
        worst = [int(i) for i in torch.unravel_index(rel.argmax(), rel.shape)]
        raise AssertionError(f"{int(above.sum())} rows left out a block scoring above a chosen one by more than "
                             f"{eps:.0e}; the most by {float(rel.max()):.2e} (relative), at [b, t, h] = {worst}")
    differ = ~(block_idx == ref_idx).all(-1)
    untied = differ & ~(contested & (gap.abs() <= tol))
    _require(not untied.any(), f"{int(untied.sum())} rows differ from the reference without a near-tie (eps {eps:.0e})")
    return int(differ.sum())


def _require(ok, message: str) -> None:
    if not bool(ok):
        raise AssertionError(message)


def nsa_attention_with_blocks(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: torch.Tensor,
    config: NSAConfig,
    block_idx: torch.Tensor,
    *,
    kv_cmp: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    kv_win: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    q_offset: int = 0,
) -> torch.Tensor:
    """The reference's :func:`nsa.nsa_attention` with the selected branch reading ``block_idx``
    instead of its own top-n (differentiable; the selection carries no gradient anyway).

    Compare an implementation's output and gradients with this at its own ``block_idx`` (after
    :func:`assert_valid_selection`), so that a near-tie that swapped one block, legitimately,
    does not count as that block's whole share of error.
    """
    from nsa import ops

    ref = dict(q_offset=q_offset, backend="reference")
    k_cmp, v_cmp = kv_cmp if kv_cmp is not None else (
        ops.mean_compress(k, config, backend="reference"), ops.mean_compress(v, config, backend="reference"))
    k_win, v_win = kv_win if kv_win is not None else (k, v)
    o_cmp, _ = ops.compressed_attention(q, k_cmp, v_cmp, config, **ref)
    o_slc = ops.selected_attention(q, k, v, block_idx, config, **ref)
    o_win = ops.sliding_window_attention(q, k_win, v_win, config, **ref)
    return ops.combine_branches(gates, o_cmp, o_slc, o_win, backend="reference")


def decode_row_reference(
    b: int,
    n: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: torch.Tensor,
    k_cmp: torch.Tensor,
    v_cmp: torch.Tensor,
    k_win: torch.Tensor,
    v_win: torch.Tensor,
    block_idx: torch.Tensor,
    ref_idx: torch.Tensor,
    config: NSAConfig,
    *,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Row ``b`` of a decode step over caches holding ``n`` tokens, its ``Tq = q.shape[1]`` queries
    at positions ``n - Tq .. n - 1``, checked and recomputed: its blocks ``block_idx[b]`` are a valid
    top-n (:func:`assert_valid_selection`) of the reference's scores against the reference's own
    ``ref_idx[b]``, and the return is the reference prefill's ``o [1, Tq, HQ, Dv]`` in ``dtype``
    given those blocks (:func:`nsa_attention_with_blocks` over the caches cut to the row's length).
    ``q``... ``v_win`` are the decode step's own (``[B, Tq, ...]`` queries and gates,
    ``[B, capacity, ...]`` caches)."""
    row, nc, start = slice(b, b + 1), config.num_cmp(n), n - q.shape[1]
    scores = block_scores(q[row], k_cmp[row, :nc], config, q_offset=start)
    try:
        assert_valid_selection(block_idx[row], ref_idx[row], scores, config, q_offset=start, eps=SELECTION_EPS[q.dtype])
    except AssertionError as err:
        raise AssertionError(f"row {b}: {err}") from None
    cut = [t[row, :n].to(dtype) for t in (k, v, k_win, v_win)]
    return nsa_attention_with_blocks(q[row].to(dtype), *cut[:2], gates[row].to(dtype), config, block_idx[row],
                                     q_offset=start, kv_win=tuple(cut[2:]),
                                     kv_cmp=(k_cmp[row, :nc].to(dtype), v_cmp[row, :nc].to(dtype)))


def recorded_cuda_graphs(device: Optional[torch.device] = None) -> int:
    """How many CUDA graphs ``torch.compile(mode="reduce-overhead")`` (Inductor's cudagraph trees)
    has recorded on ``device`` (default: the current one): the trees' roots and their children (a
    backward's graph is a child of its forward's). 0 before any."""
    from torch._inductor import cudagraph_trees

    def count(nodes_by_function) -> int:
        return sum(1 + count(node.children) for nodes in nodes_by_function.values() for node in nodes)

    index = torch.cuda.current_device() if device is None or device.index is None else device.index
    manager = cudagraph_trees.get_manager(index, create_if_none_exists=False)
    return 0 if manager is None else count(manager.roots)
