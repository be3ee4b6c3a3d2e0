"""NSACache: the per-layer KV cache of :class:`nsa.NSAAttention`.

It holds, per branch, the raw keys and values (``slc``, ``win`` and the raw
input of the compression ``cmp``) and the compressed tokens emitted so far.
Buffers are preallocated and grow in whole chunks, so appending a decode step
writes in place (no ``torch.cat`` per step); pass ``capacity`` up front to
never reallocate. Compressed token ``i`` is emitted as soon as position
``i*d + l - 1`` is in the cache, whatever mix of prefill and decode calls
brought it there (the spec's absolute emission schedule).

A ``static`` cache has a fixed capacity and keeps its lengths on the device
(``seq_lens``); its step methods (:meth:`NSACache.positions`,
:meth:`NSACache.write`, :meth:`NSACache.emit`) never read a host value that
changes per step, so a decode step through them can be captured in a CUDA graph
(:mod:`nsa.modules.graph`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Union

import torch

from nsa.config import NSAConfig
from nsa.modules.compression import MLPCompression
from nsa.ops.compressed.reference import visible_cmp_count
from nsa.ops.varlen import host_to_device

RAW_BUFFERS = ("k_slc", "v_slc", "k_win", "v_win", "k_cmp_raw", "v_cmp_raw")
CMP_BUFFERS = ("k_cmp", "v_cmp")
#: Calls of :class:`nsa.NSAAttention` on a static cache with at most this many new tokens take
#: the graph-safe decode path (:meth:`NSACache.write`, :meth:`NSACache.emit`).
DEVICE_STEP_MAX_TOKENS = 16


@dataclass(frozen=True)
class TokenReads:
    """Tokens read per branch by each query of one call (spec "Decode memory reads").

    ``cmp [T]`` visible compressed tokens, ``slc [B, T, H]`` selected positions
    ``<= t`` of each KV group's real blocks, ``win [T]`` window positions; ``cmp`` and
    ``win`` are ``[B, T]`` where the sequences of a batch sit at different positions.
    """

    cmp: torch.Tensor
    slc: torch.Tensor
    win: torch.Tensor

    def last_step(self) -> Dict[str, float]:
        """Reads of the call's last query as Python numbers (averaged over batch and KV heads).
        This syncs with the device: use it for reports, not in a decode loop."""
        last = lambda reads: float(reads[..., -1].double().mean())  # noqa: E731
        out = {"cmp": last(self.cmp), "slc": float(self.slc[:, -1].double().mean()), "win": last(self.win)}
        out["total"] = out["cmp"] + out["slc"] + out["win"]
        return out


def count_reads(block_idx: torch.Tensor, q_offset: Union[int, torch.Tensor], config: NSAConfig) -> TokenReads:
    """Tokens read by queries at ``q_offset ...`` given their selected ``block_idx [B, T, H, n]``.

    ``q_offset`` is the first position (an int), or the positions themselves as a device
    tensor (graph-safe): ``[T]``, or ``[B, T]`` where the batch's sequences differ in length."""
    T = block_idx.shape[1]
    if isinstance(q_offset, torch.Tensor):
        t = q_offset.to(device=block_idx.device, dtype=torch.int64)
    else:
        t = torch.arange(q_offset, q_offset + T, device=block_idx.device)
    starts = block_idx.to(torch.int64) * config.sel_block
    in_block = (t.view(-1, T)[:, :, None, None] + 1 - starts).clamp(0, config.sel_block)
    slc = torch.where(block_idx >= 0, in_block, torch.zeros_like(in_block)).sum(-1)
    return TokenReads(cmp=visible_cmp_count(t, config), slc=slc, win=(t + 1).clamp(max=config.window))


def _check_raw(method: str, raw: Dict[str, torch.Tensor]) -> None:
    """``NSACache.<method>`` takes every raw buffer by name, and nothing else."""
    if set(raw) != set(RAW_BUFFERS):
        raise ValueError(f"NSACache.{method} needs exactly {', '.join(RAW_BUFFERS)}; got {', '.join(sorted(raw))}")


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
        static: fixed ``capacity`` (required), zero-filled buffers that are never
            reallocated, so CUDA graphs may hold their addresses (default False).

    Attributes:
        length: positions cached so far (a host int: reading it never syncs).
        num_cmp: compressed tokens emitted so far.
        seq_lens: int32 ``[B]`` on the cache's device, equal to ``length``; the
            lengths that decode kernels and graph replays read.
        last_block_idx: int32 ``[B, T, H, n]`` blocks selected by the last call.
        last_reads: :class:`TokenReads` of the last call (computed when read).
        ragged: whether its sequences differ in length (:meth:`prefill_packed`): ``length`` is
            then the longest, and only device steps (:meth:`write`, :meth:`emit`) continue it.
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
        static: bool = False,
    ) -> None:
        for name, value in (("batch_size", batch_size), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim), ("chunk", chunk)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"NSACache {name} must be a positive int, got {value!r}")
        if capacity < 0 or (static and capacity == 0):
            raise ValueError(f"NSACache capacity must be >= 0 (> 0 for a static cache), got {capacity}")
        self.static = static
        self.config = config
        self.chunk = chunk
        self.length = 0
        self.num_cmp = 0
        self.last_block_idx: Optional[torch.Tensor] = None
        self._last_positions: Union[int, torch.Tensor] = 0  # the last call's queries (see record)
        self.ragged = False
        v_head_dim = v_head_dim or head_dim
        self._dims = {name: (v_head_dim if name.startswith("v") else head_dim) for name in RAW_BUFFERS + CMP_BUFFERS}
        self._shape = (batch_size, num_kv_heads)
        self._like = dict(device=torch.device(device) if device is not None else torch.device("cpu"), dtype=dtype)
        self.seq_lens = torch.zeros(batch_size, dtype=torch.int32, device=self._like["device"])
        self._buf: Dict[str, torch.Tensor] = {}
        self._allocate(capacity if static else max(capacity, chunk))
        # a step's offsets from the lengths, made once: arange took a kernel of every captured step
        self._offsets = torch.arange(DEVICE_STEP_MAX_TOKENS, device=self.device)
        if static:
            # Addresses that never change, as torch.compile(mode="reduce-overhead") must be told:
            # its CUDA graphs then write the step into these buffers in place, where they would
            # otherwise refuse a graph that mutates its inputs (docs/perf/compile.md).
            for tensor in (self.seq_lens, self._offsets, *self._buf.values()):
                torch._dynamo.mark_static_address(tensor)

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
        # a static cache is zero-filled: a device-side emission may pool a not yet complete block
        alloc = torch.zeros if self.static else torch.empty
        for name, size in sizes.items():
            new = alloc(B, size, H, self._dims[name], **self._like)
            if name in self._buf and used[name]:
                new[:, : used[name]] = self._buf[name][:, : used[name]]
            self._buf[name] = new

    def reset(self) -> None:
        """Empty the cache for new sequences, keeping its buffers where they are (a static cache's
        CUDA graphs stay valid: :class:`nsa.DecodeGraph` captured on it replays for the next
        prompts). The buffers are zeroed in place, as a new static cache's are: a query never
        reads an old value, but an emission may pool a block that is not complete yet."""
        for buffer in self._buf.values():
            buffer.zero_()
        self.length = self.num_cmp = 0
        self.seq_lens.zero_()
        self.ragged = False
        self.last_block_idx = None

    def reserve(self, positions: int) -> None:
        """Make room for ``positions`` more tokens (grows by whole chunks, copying once)."""
        needed = self.length + positions
        if needed > self.capacity and self.static:
            raise ValueError(f"static NSACache is full: {self.length} + {positions} positions exceed capacity {self.capacity}")
        if needed > self.capacity:
            self._allocate(-(-needed // self.chunk) * self.chunk)

    def view(self, name: str) -> torch.Tensor:
        """The filled part ``[B, length (or num_cmp), H, D]`` of buffer ``name`` (a view)."""
        used = self.num_cmp if name in CMP_BUFFERS else self.length
        return self._buf[name][:, :used]

    def append(self, **raw: torch.Tensor) -> None:
        """Write the new positions of every raw buffer (``k_slc=..., v_slc=..., ...``, each
        ``[B, T, H, D]``) and advance ``length`` by T."""
        _check_raw("append", raw)
        if self.ragged:
            raise ValueError("NSACache.append: this cache holds sequences of different lengths (prefill_packed); "
                             "continue it by device steps (write/emit), as NSAAttention does for calls of at most "
                             "DEVICE_STEP_MAX_TOKENS tokens")
        steps = {t.shape[1] for t in raw.values()}
        if len(steps) != 1:
            raise ValueError(f"NSACache.append: all tensors need the same length, got {sorted(steps)}")
        (step,) = steps
        self.reserve(step)
        for name, value in raw.items():
            self._buf[name][:, self.length : self.length + step] = value
        self.length += step
        self.seq_lens.add_(step)

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

    def record(self, block_idx: torch.Tensor, q_offset: Union[int, torch.Tensor]) -> None:
        """Keep the last call's selection and where its queries sit (no sync, no launch: the
        reads follow from them when :attr:`last_reads` is read, off the step's path; in a
        captured step they took about ten small kernels a replay)."""
        self.last_block_idx, self._last_positions = block_idx, q_offset

    @property
    def last_reads(self) -> Optional[TokenReads]:
        """:class:`TokenReads` of the last call, from its selected blocks (None before a call).
        After a replay of a captured step, those of the replayed step."""
        if self.last_block_idx is None:
            return None
        return count_reads(self.last_block_idx, self._last_positions, self.config)

    def buffer(self, name: str) -> torch.Tensor:
        """The whole preallocated buffer ``[B, capacity (or compressed capacity), H, D]``."""
        return self._buf[name]

    def positions(self, steps: int) -> torch.Tensor:
        """int64 ``[B, steps]`` positions of the next ``steps`` tokens, from ``seq_lens`` (no sync).
        One kernel for a device step: the int32 lengths promote in the addition with offsets made
        once (a cast and an ``arange`` took two more kernels of a captured step, 2.4 us, session 39)."""
        offsets = self._offsets[:steps] if steps <= len(self._offsets) else torch.arange(steps, device=self.device)
        return self.seq_lens[:, None] + offsets

    def write(self, positions: torch.Tensor, *, backend: Optional[str] = None, **raw: torch.Tensor) -> None:
        """Graph-safe append: scatter each raw buffer's ``[B, T, H, D]`` at ``positions [B, T]``
        and advance ``seq_lens`` on the device (the host ``length`` follows in :meth:`advance_host`).
        Where the decode op routes to Triton (``backend`` as for :func:`nsa.ops.nsa_decode`), the
        six buffers are written and ``seq_lens`` advanced in one launch
        (:mod:`nsa.ops.decode.cache_write`), else by six assignments and an addition; under
        ``torch.compile`` always the latter, which Inductor fuses.

        The caller keeps ``length + T <= capacity`` (checking device values would sync)."""
        _check_raw("write", raw)
        B, T = positions.shape
        for name, value in raw.items():
            want = (B, T, *self._shape[1:], self._dims[name])
            if tuple(value.shape) != want or value.dtype != self.dtype:
                raise ValueError(f"NSACache.write: {name} must be {self.dtype} {list(want)}, "
                                 f"got {value.dtype} {list(value.shape)}")  # fmt: skip
        if self._triton_rows(backend):
            from nsa.ops.decode.cache_write import write_rows

            write_rows([self._buf[n] for n in RAW_BUFFERS], [raw[n] for n in RAW_BUFFERS], positions, self.seq_lens)
            return
        rows = torch.arange(B, device=positions.device)[:, None]
        for name, value in raw.items():
            self._buf[name][rows, positions] = value
        self.seq_lens.add_(T)

    def prefill_packed(self, rows: torch.Tensor, positions: torch.Tensor, lengths: List[int], **raw: torch.Tensor) -> None:
        """Prompts of different lengths into an empty static cache: each raw buffer's packed
        ``[1, total, H, D]`` scattered to ``(rows, positions)`` (``[total]`` each: a token's
        sequence and its position in it), ``seq_lens`` set to ``lengths`` (host ints, one a row).

        The host ``length`` becomes the longest and the cache :attr:`ragged`; the compressed
        tokens follow from :meth:`emit`."""
        _check_raw("prefill_packed", raw)
        if not self.static or self.length:
            kind = "static" if self.static else "growing"
            raise ValueError("prompts of different lengths go into an empty static cache (new_cache(B, capacity=N, "
                             f"static=True)); this is a {kind} cache holding {self.length} positions")
        if len(lengths) != self._shape[0]:
            raise ValueError(f"the pack holds {len(lengths)} sequences; the cache was made for {self._shape[0]}")
        self.reserve(max(lengths, default=0))
        for name, value in raw.items():
            self._buf[name][rows, positions] = value[0]
        self.seq_lens.copy_(host_to_device(torch.tensor(lengths, dtype=torch.int32), self.device))
        self.length = max(lengths, default=0)
        self.num_cmp = self.config.num_cmp(self.length)
        self.ragged = len(set(lengths)) > 1

    def emit(self, last: torch.Tensor, count: int, phi_k: Callable, phi_v: Callable, *,
             backend: Optional[str] = None) -> None:
        """Graph-safe emission: (re)compute the ``count`` newest compressed tokens complete
        at positions ``last [B]`` and store them.

        Rewriting a token that is already stored writes the same value, so the rule is
        idempotent; a token whose block is not complete yet (``last < l - 1``) is written
        to slot 0, which no query can see until the step that completes it rewrites it.
        ``phi_k``/``phi_v`` map raw blocks ``[N, l, H, D]`` to tokens ``[N, 1, H, D]``.
        Where :meth:`write` takes one launch, the blocks are gathered in one and the tokens
        stored in another (:mod:`nsa.ops.decode.cache_write`); with learnable compressions
        whose :meth:`~nsa.modules.MLPCompression.emission_weights` allow it, the tokens are made
        and stored in three launches (:mod:`nsa.ops.decode.mlp_emission`); else by indexing."""
        cfg, B = self.config, last.shape[0]
        if self._triton_rows(backend):
            from nsa.ops.decode import mlp_emission
            from nsa.ops.decode.cache_write import gather_cmp_blocks, write_rows

            weights = [phi.emission_weights(self.dtype) if isinstance(phi, MLPCompression) else None
                       for phi in (phi_k, phi_v)]  # fmt: skip
            if all(w is not None for w in weights) and B * count * self._shape[1] <= mlp_emission.MAX_ROWS:
                mlp_emission.emit_mlp_tokens(*(self._buf[name] for name in ("k_cmp_raw", "v_cmp_raw", *CMP_BUFFERS)),
                                             last, count, cfg, weights)  # fmt: skip
                return

            k_blocks, v_blocks, slots = gather_cmp_blocks(
                self._buf["k_cmp_raw"], self._buf["v_cmp_raw"], last, count, cfg)
            H = k_blocks.shape[2]
            tokens = [phi(blocks).reshape(B, count, H, -1) for phi, blocks in ((phi_k, k_blocks), (phi_v, v_blocks))]
            write_rows([self._buf[name] for name in CMP_BUFFERS], tokens, slots)
            return
        newest = torch.div(last + 1 - cfg.cmp_block, cfg.cmp_stride, rounding_mode="floor")  # [B]
        index = (newest[:, None] - torch.arange(count - 1, -1, -1, device=last.device)).clamp_min(0)  # [B, count]
        raw_pos = index[..., None] * cfg.cmp_stride + torch.arange(cfg.cmp_block, device=last.device)  # [B, count, l]
        raw_pos = raw_pos.clamp_max(self.capacity - 1)  # only an incomplete (invisible) block reaches past the end
        rows = torch.arange(B, device=last.device)[:, None]
        for raw_name, name, phi in (("k_cmp_raw", "k_cmp", phi_k), ("v_cmp_raw", "v_cmp", phi_v)):
            blocks = self._buf[raw_name][rows[..., None], raw_pos]  # [B, count, l, H, D]
            tokens = phi(blocks.flatten(0, 1))  # [B * count, 1, H, D]
            self._buf[name][rows, index] = tokens.view(B, count, *tokens.shape[2:]).to(self.dtype)

    def _triton_rows(self, backend: Optional[str]) -> bool:
        """Whether a graph-safe step moves rows by the Triton launches of
        :mod:`nsa.ops.decode.cache_write`: where the decode op routes to Triton (``backend`` as
        for :func:`nsa.ops.nsa_decode`), but not under ``torch.compile``, whose Inductor fuses
        the indexing instead."""
        from nsa import routing  # lazily: importing nsa must not load the router (see nsa.ops._dispatch)

        return not torch.compiler.is_compiling() and routing.all_triton(("decode",), self.device, self.dtype, backend)

    def advance_host(self, steps: int) -> None:
        """Host bookkeeping of a step written with :meth:`write`/:meth:`emit` (or replayed
        from a graph): ``length += steps`` and ``num_cmp`` follows the emission schedule."""
        self.length += steps
        self.num_cmp = self.config.num_cmp(self.length)
