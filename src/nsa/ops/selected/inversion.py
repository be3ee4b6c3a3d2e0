"""The selection inverted: for every (batch, KV head, block), the queries that chose it.

The selected branch's ``dK``/``dV`` kernel walks, for each block, the queries that hold it
(:func:`nsa.ops.selected.kernel.selected_bwd_dkdv`), so that every gradient row has one
writer and no float atomics are needed. The lists are built on the device without a host
sync, sizes coming from shapes alone:

1. :func:`owner_keys_kernel`, one pass over ``block_idx``: each entry's owner, ``(b * H + h)
   * NB + block``, or ``B * H * NB`` for an entry that does not count (-1, past its query, a
   repeat in its row, one of its query's ``skip_local`` local blocks);
2. a stable sort of the owners (entries are laid out query-major, so each owner's queries come
   out ascending), then each owner's slice and its segments of at most ``qseg`` queries.

Step 1 used to be a sort of every row (to find repeats next to each other) and a dozen
elementwise passes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nsa.ops._triton.launch import LAUNCH_OPTIONS, cdiv, next_power_of_2


@triton.jit(do_not_specialize=["ROWS", "T", "q_offset", "NB"])
def owner_keys_kernel(
    block_idx,  # [B * T * H, N] int32/int64, rows in any order
    owner,  # [B * T * H, N] int32/int64: written
    ROWS, T, q_offset, NB,
    H: tl.constexpr, N: tl.constexpr, NP: tl.constexpr, BS: tl.constexpr, SKIP_LOCAL: tl.constexpr,
    BR: tl.constexpr,
):
    """Grid ``(cdiv(ROWS, BR),)``: ``BR`` rows of ``(b, t, h)`` a program. A repeat is any
    entry equal to an earlier entry of its row, so the first of equal entries is the one that counts."""
    o_r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)  # [BR]
    m_r = o_r < ROWS
    o_n = tl.arange(0, NP)
    m_e = m_r[:, None] & (o_n < N)[None, :]
    b_idx = tl.load(block_idx + o_r[:, None] * N + o_n[None, :], mask=m_e, other=-1).to(tl.int64)  # [BR, NP]
    t = q_offset + (o_r // H) % T  # [BR] position of the row's query
    ok = m_e & (b_idx >= 0) & (b_idx * BS <= t[:, None])
    if SKIP_LOCAL > 0:
        ok = ok & (b_idx <= (t // BS)[:, None] - SKIP_LOCAL)
    same = b_idx[:, :, None] == b_idx[:, None, :]  # [BR, NP, NP]: entry n against entry n'
    earlier = (o_n[None, :] < o_n[:, None])[None, :, :]
    ok = ok & (tl.max((same & earlier).to(tl.int32), 2) == 0)
    bh = (o_r // (H * T)) * H + o_r % H  # [BR] batch * H + KV head
    key = tl.where(ok, bh[:, None] * NB + b_idx, (ROWS // T) * NB)  # ROWS // T = B * H
    tl.store(owner + o_r[:, None] * N + o_n[None, :], key.to(owner.dtype.element_ty), mask=m_e)


def invert_selection(block_idx: torch.Tensor, sel_block: int, q_offset: int, num_blocks: int, qseg: int,
                     skip_local: int = 0, with_slots: bool = False) -> dict:
    """For every (batch, KV head, block) owner, the ascending list of queries that chose it.

    Entries that do not count (-1, past the query, repeats) are dropped, and so are a query's
    ``skip_local`` local blocks (its own and those just before it), whose share another kernel
    computes. Everything runs on the device without a host sync: sizes come from shapes only.

    Returns:
        ``t_sorted`` int32 ``[E]`` query indices grouped by owner; ``starts``/``counts``
        ``[B*H*NB]`` int32 of each owner's slice; ``seg_first``/``seg_count`` int32
        segments of at most ``qseg`` queries per owner; ``seg_owner`` int32 ``[S]``
        owner of each of the ``S`` launched programs (``B*H*NB`` past the end). With
        ``with_slots`` also ``n_sorted`` int32 ``[E]``: each entry's place in its row of
        ``block_idx`` (of equal entries, the first), beside ``t_sorted``.
    """
    B, T, H, N = block_idx.shape
    dev = block_idx.device
    n_owner = B * H * num_blocks
    owner = torch.empty(B, T, H, N, device=dev, dtype=torch.int32 if n_owner < 2**31 - 1 else torch.int64)
    rows = B * T * H
    if rows:
        np_ = next_power_of_2(N)
        br = max(1, 4096 // (np_ * np_))  # the repeat test compares BR * NP * NP entries
        owner_keys_kernel[(cdiv(rows, br),)](
            block_idx.contiguous(), owner, rows, T, q_offset, num_blocks,
            H=H, N=N, NP=np_, BS=sel_block, SKIP_LOCAL=skip_local, BR=br, **LAUNCH_OPTIONS,
        )
    owner_sorted, order = torch.sort(owner.flatten(), stable=True)
    t_sorted = ((order // (H * N)) % T).to(torch.int32)  # flat entry ((b*T + t)*H + h)*N + n -> t
    ids = torch.arange(n_owner, device=dev, dtype=owner_sorted.dtype)
    starts = torch.searchsorted(owner_sorted, ids)
    counts = torch.searchsorted(owner_sorted, ids, right=True) - starts
    seg_count = (counts + qseg - 1) // qseg
    seg_end = torch.cumsum(seg_count, 0)
    n_prog = n_owner + cdiv(owner.numel(), qseg)  # >= sum(seg_count) for any selection
    seg_owner = torch.searchsorted(seg_end, torch.arange(n_prog, device=dev, dtype=seg_end.dtype), right=True)
    i32 = torch.int32
    inv = dict(
        t_sorted=t_sorted, starts=starts.to(i32), counts=counts.to(i32), seg_first=(seg_end - seg_count).to(i32),
        seg_count=seg_count.to(i32), seg_owner=seg_owner.to(i32),
    )
    if with_slots:
        inv["n_sorted"] = (order % N).to(i32)
    return inv
