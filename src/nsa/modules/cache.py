"""NSACache: the per-layer KV cache of :class:`nsa.NSAAttention`.

It holds, per branch, the raw keys and values (``slc``, ``win`` and the raw
input of the compression ``cmp``) and the compressed tokens emitted so far.
Buffers are preallocated and grow in whole chunks, so appending a decode step
writes in place (no ``torch.cat`` per step); pass ``capacity`` up front to
never reallocate. Compressed token ``i`` is emitted as soon as position
``i*d + l - 1`` is in the cache, whatever mix of prefill and decode calls
brought it there (the spec's absolute emission schedule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import torch

from nsa.config import NSAConfig
from nsa.ops.compressed.reference import visible_cmp_count

RAW_BUFFERS = ("k_slc", "v_slc", "k_win", "v_win", "k_cmp_raw", "v_cmp_raw")
CMP_BUFFERS = ("k_cmp", "v_cmp")


@dataclass(frozen=True)
class TokenReads:
    """Tokens read per branch by each query of one call (spec "Decode memory reads").

    ``cmp [T]`` visible compressed tokens, ``slc [B, T, H]`` selected positions
    ``<= t`` of each KV group's real blocks, ``win [T]`` window positions.
    """

    cmp: torch.Tensor
    slc: torch.Tensor
    win: torch.Tensor

    def last_step(self) -> Dict[str, float]:
        """Reads of the call's last query as Python numbers (``slc`` averaged over batch and
        KV heads). This syncs with the device: use it for reports, not in a decode loop."""
        out = {"cmp": float(self.cmp[-1]), "slc": float(self.slc[:, -1].double().mean()), "win": float(self.win[-1])}
        out["total"] = out["cmp"] + out["slc"] + out["win"]
        return out


def count_reads(block_idx: torch.Tensor, q_offset: int, config: NSAConfig) -> TokenReads:
    """Tokens read by queries at ``q_offset ...`` given their selected ``block_idx [B, T, H, n]``."""
    T = block_idx.shape[1]
    t = torch.arange(q_offset, q_offset + T, device=block_idx.device)
    starts = block_idx.to(torch.int64) * config.sel_block
    in_block = (t[None, :, None, None] + 1 - starts).clamp(0, config.sel_block)
    slc = torch.where(block_idx >= 0, in_block, torch.zeros_like(in_block)).sum(-1)
    return TokenReads(cmp=visible_cmp_count(t, config), slc=slc, win=(t + 1).clamp(max=config.window))


class NSACache:
    """Preallocated KV cache for one :class:`nsa.NSAAttention` layer.

    Args:
        config: the layer's :class:`nsa.NSAConfig`.
        batch_size: B.
        num_kv_heads: H.
        head_dim: Dk.
        v_head_dim: Dv (default Dk).
        device, dtype: of the buffers (default CPU float32).
        capacity: positions to preallocate (default one chunk).
        chunk: growth step in positions (default 4096).

    Attributes:
        length: positions cached so far (a host int: reading it never syncs).
        num_cmp: compressed tokens emitted so far.
        last_block_idx: int32 ``[B, T, H, n]`` blocks selected by the last call.
        last_reads: :class:`TokenReads` of the last call.
    """

    def __init__(
        self,
        config: NSAConfig,
        batch_size: int,
        num_kv_heads: int,
        head_dim: int,
        v_head_dim: Optional[int] = None,
        *,
        device: Optional[torch.device] = None,
        dtype: torch.dtype = torch.float32,
        capacity: int = 0,
        chunk: int = 4096,
    ) -> None:
        for name, value in (("batch_size", batch_size), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim), ("chunk", chunk)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"NSACache {name} must be a positive int, got {value!r}")
        if capacity < 0:
            raise ValueError(f"NSACache capacity must be >= 0, got {capacity}")
        self.config = config
        self.chunk = chunk
        self.length = 0
        self.num_cmp = 0
        self.last_block_idx: Optional[torch.Tensor] = None
        self.last_reads: Optional[TokenReads] = None
        v_head_dim = v_head_dim or head_dim
        self._dims = {name: (v_head_dim if name.startswith("v") else head_dim) for name in RAW_BUFFERS + CMP_BUFFERS}
        self._shape = (batch_size, num_kv_heads)
        self._like = dict(device=torch.device(device) if device is not None else torch.device("cpu"), dtype=dtype)
        self._buf: Dict[str, torch.Tensor] = {}
        self._allocate(max(capacity, chunk))

    @property
    def capacity(self) -> int:
        return self._buf["k_slc"].shape[1]

    @property
    def device(self) -> torch.device:
        return self._like["device"]

    @property
    def dtype(self) -> torch.dtype:
        return self._like["dtype"]

    def _allocate(self, capacity: int) -> None:
        sizes = {name: capacity for name in RAW_BUFFERS}
        sizes.update({name: self.config.num_cmp(capacity) + 1 for name in CMP_BUFFERS})
        used = {name: self.length for name in RAW_BUFFERS}
        used.update({name: self.num_cmp for name in CMP_BUFFERS})
        B, H = self._shape
        for name, size in sizes.items():
            new = torch.empty(B, size, H, self._dims[name], **self._like)
            if name in self._buf and used[name]:
                new[:, : used[name]] = self._buf[name][:, : used[name]]
            self._buf[name] = new

    def reserve(self, positions: int) -> None:
        """Make room for ``positions`` more tokens (grows by whole chunks, copying once)."""
        needed = self.length + positions
        if needed > self.capacity:
            self._allocate(-(-needed // self.chunk) * self.chunk)

    def view(self, name: str) -> torch.Tensor:
        """The filled part ``[B, length (or num_cmp), H, D]`` of buffer ``name`` (a view)."""
        used = self.num_cmp if name in CMP_BUFFERS else self.length
        return self._buf[name][:, :used]

    def append(self, **raw: torch.Tensor) -> None:
        """Write the new positions of every raw buffer (``k_slc=..., v_slc=..., ...``, each
        ``[B, T, H, D]``) and advance ``length`` by T."""
        if set(raw) != set(RAW_BUFFERS):
            raise ValueError(f"NSACache.append needs exactly {', '.join(RAW_BUFFERS)}; got {', '.join(sorted(raw))}")
        steps = {t.shape[1] for t in raw.values()}
        if len(steps) != 1:
            raise ValueError(f"NSACache.append: all tensors need the same length, got {sorted(steps)}")
        (step,) = steps
        self.reserve(step)
        for name, value in raw.items():
            self._buf[name][:, self.length : self.length + step] = value
        self.length += step

    def pending_cmp(self) -> int:
        """Compressed tokens complete in the cache but not emitted yet."""
        return self.config.num_cmp(self.length) - self.num_cmp

    def append_compressed(self, k_cmp: torch.Tensor, v_cmp: torch.Tensor) -> None:
        """Store newly emitted compressed tokens ``[B, N, H, D]``."""
        count = k_cmp.shape[1]
        if count != v_cmp.shape[1] or self.num_cmp + count > self._buf["k_cmp"].shape[1]:
            raise ValueError(f"NSACache.append_compressed: bad count {count} (have {self.num_cmp} tokens)")
        self._buf["k_cmp"][:, self.num_cmp : self.num_cmp + count] = k_cmp
        self._buf["v_cmp"][:, self.num_cmp : self.num_cmp + count] = v_cmp
        self.num_cmp += count

    def record(self, block_idx: torch.Tensor, q_offset: int) -> None:
        """Keep the last call's selection and its per-branch token reads (no sync)."""
        self.last_block_idx = block_idx
        self.last_reads = count_reads(block_idx, q_offset, self.config)
