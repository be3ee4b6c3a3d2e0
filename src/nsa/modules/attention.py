"""NSAAttention: a Native Sparse Attention layer (projections, RoPE, phi, gates, cache)."""

from __future__ import annotations

from typing import Dict, Optional, Tuple, Union

import torch
from torch import nn

from nsa.config import NSAConfig
from nsa.modules.cache import DEVICE_STEP_MAX_TOKENS, NSACache
from nsa.modules.compression import MeanCompression, MLPCompression
from nsa.modules.rotary import RotaryEmbedding
from nsa.ops import nsa_attention, varlen
from nsa.ops._dispatch import needs_grad
from nsa.ops.decode import nsa_decode
from nsa.ops.gates.projection import GateProjection

BRANCHES = ("cmp", "slc", "win")
RAW_NAME = {"k": {"slc": "k_slc", "win": "k_win", "cmp": "k_cmp_raw"}, "v": {"slc": "v_slc", "win": "v_win", "cmp": "v_cmp_raw"}}


class NSAAttention(nn.Module):
    """Hidden states ``[B, T, hidden]`` -> ``[B, T, hidden]`` through NSA.

    One query projection serves the three branches; each branch has its own key
    and value projections (paper section 3.3.3). RoPE rotates queries and every
    branch's raw keys at their absolute positions before compression. The gate
    projection gives one sigmoid gate per query head and branch.

    The query, key and value projections are the rows of one weight, ``in_proj``
    (:meth:`projection_rows` names them), so that one matrix product computes them
    all: at batch 1, a decode step's seven separate products took about 43 of its 207 us
    (H200, docs/perf/compile.md). State dicts saved with separate ``q_proj``,
    ``k_proj.<branch>`` and ``v_proj.<branch>`` weights load into it.

    Args:
        hidden_size: model width.
        num_heads: query heads HQ.
        num_kv_heads: key/value heads H (``num_heads % num_kv_heads == 0``).
        head_dim: Dk (even, for RoPE).
        v_head_dim: Dv (default Dk).
        config: :class:`NSAConfig` (default: paper defaults).
        compression: ``"mlp"`` (learnable phi, default) or ``"mean"``.
        rope_theta: RoPE base (default 10000).
        backend: passed to :func:`nsa.nsa_attention` and, with ``compression="mean"``, to
            :func:`nsa.ops.mean_compress` (default: routing decides).
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        v_head_dim: Optional[int] = None,
        config: Optional[NSAConfig] = None,
        *,
        compression: str = "mlp",
        rope_theta: float = 10000.0,
        backend: Optional[str] = None,
    ) -> None:
        super().__init__()
        if num_kv_heads <= 0 or num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} must be a positive multiple of num_kv_heads={num_kv_heads}")
        if compression not in ("mlp", "mean"):
            raise ValueError(f"compression must be 'mlp' or 'mean', got {compression!r}")
        self.config = config or NSAConfig()
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim, self.v_head_dim = head_dim, v_head_dim or head_dim
        self.backend = backend
        self._split_sizes = [rows.stop - rows.start for rows in self.projection_rows().values()]  # in_proj's parts
        self.in_proj = nn.Linear(hidden_size, sum(self._split_sizes), bias=False)
        self.gate_proj = nn.Linear(hidden_size, num_heads * 3)
        self.o_proj = nn.Linear(num_heads * self.v_head_dim, hidden_size, bias=False)
        self.rotary = RotaryEmbedding(head_dim, rope_theta)
        if compression == "mlp":
            self.compress_k: nn.Module = MLPCompression(head_dim, self.config)
            self.compress_v: nn.Module = MLPCompression(self.v_head_dim, self.config)
        else:
            self.compress_k, self.compress_v = (MeanCompression(self.config, backend) for _ in range(2))

    def projection_rows(self) -> Dict[str, slice]:
        """The rows of ``in_proj.weight`` that make each projection, in order: ``q``, then
        ``k_<branch>`` for each branch (cmp, slc, win), then ``v_<branch>``."""
        widths = {"q": self.num_heads * self.head_dim}
        widths.update({f"k_{b}": self.num_kv_heads * self.head_dim for b in BRANCHES})
        widths.update({f"v_{b}": self.num_kv_heads * self.v_head_dim for b in BRANCHES})
        rows, start = {}, 0
        for name, width in widths.items():
            rows[name], start = slice(start, start + width), start + width
        return rows

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # a state dict of the separate projections (before in_proj: q_proj, k_proj.<branch>,
        # v_proj.<branch>): their weights, stacked in projection_rows' order
        separate = [f"{prefix}{name[0]}_proj{name[1:].replace('_', '.')}.weight" for name in self.projection_rows()]
        if f"{prefix}in_proj.weight" not in state_dict and all(key in state_dict for key in separate):
            state_dict[f"{prefix}in_proj.weight"] = torch.cat([state_dict.pop(key) for key in separate])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def new_cache(
        self, batch_size: int, *, capacity: int = 0, device=None, dtype: Optional[torch.dtype] = None, chunk: int = 4096,
        static: bool = False,
    ) -> NSACache:
        """An empty :class:`NSACache` shaped for this layer; ``static=True`` gives the fixed-capacity
        cache of graph-capturable decode. Device: the weights' by default. Dtype: that of the keys
        the layer computes there, by default: under ``torch.autocast`` on that device, autocast's
        (create the cache where the calls will run), else the weights'."""
        device = torch.device(device) if device is not None else self.in_proj.weight.device
        dtype = dtype or self._compute_dtype(device)
        if dtype is None:
            raise TypeError(f"in_proj's weight is {self.in_proj.weight.dtype} (quantized?), so the keys' dtype is not "
                            f"known here: pass new_cache(dtype=...), the dtype the projections compute in")  # fmt: skip
        return NSACache(
            self.config, batch_size, self.num_kv_heads, self.head_dim, self.v_head_dim,
            device=device, dtype=dtype, capacity=capacity, chunk=chunk, static=static,
        )  # fmt: skip

    def _compute_dtype(self, device: torch.device) -> Optional[torch.dtype]:
        """The dtype of the layer's projections on ``device``: autocast's where it is on, else the
        weights' (None where they are not floating point: a quantized layer computes in a dtype of
        its own)."""
        if torch.is_autocast_enabled(device.type):
            return torch.get_autocast_dtype(device.type)
        weight = self.in_proj.weight.dtype
        return weight if weight.is_floating_point else None

    def _check_cache_dtype(self, x: torch.Tensor, cache: NSACache) -> None:
        """Refuse, before anything is written, a cache whose dtype is not the projections'."""
        computed = self._compute_dtype(x.device)
        if computed is not None and cache.dtype != computed:
            autocast = " (torch.autocast)" if torch.is_autocast_enabled(x.device.type) else ""
            raise TypeError(
                f"cache holds {cache.dtype} but this call's keys are {computed}{autocast}; create the cache "
                f"where the calls run (new_cache follows autocast) or pass new_cache(dtype={computed})"
            )

    def _project(self, x: torch.Tensor, positions: torch.Tensor):
        q, keys, values = self._queries_keys_values(x, positions)
        return q, keys, values, self._gates(x)

    def _gates(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return torch.sigmoid(self.gate_proj(x)).view(B, T, self.num_heads, 3)

    def _step_gates(self, x: torch.Tensor) -> Union[torch.Tensor, GateProjection]:
        """A device step's gates: as their projection where the decode op's last Triton launch
        computes them (:mod:`nsa.ops.gates.projection`; a product, a sigmoid and their launches
        fewer), else computed here. Only where that computes what the modules do: a plain
        ``nn.Linear`` of ``x``'s dtype, no autocast, no gradient wanted, and not under
        ``torch.compile`` (which fuses the modules its own way)."""
        from nsa import routing  # lazily: importing nsa must not load the router (see nsa.ops._dispatch)

        proj = self.gate_proj
        params = [t for t in (proj.weight, proj.bias) if t is not None]
        fused = (not torch.compiler.is_compiling() and type(proj) is nn.Linear and x.is_contiguous()
                 and all(t.dtype == x.dtype and t.is_contiguous() for t in params)
                 and not torch.is_autocast_enabled(x.device.type) and not needs_grad(x, *params)
                 and routing.all_triton(("decode",), x.device, x.dtype, self.backend))  # fmt: skip
        return GateProjection(x, proj.weight, proj.bias) if fused else self._gates(x)

    def _rotation_on_triton(self, x: torch.Tensor) -> bool:
        """Whether RoPE routes to its Triton kernels for this layer's keys (a device step then
        rotates at the cache's lengths in one launch)."""
        from nsa import routing  # lazily: importing nsa must not load the router (see nsa.ops._dispatch)

        return routing.all_triton(("rotary",), x.device, x.dtype, None, self.head_dim)

    def _queries_keys_values(self, x: torch.Tensor, positions: torch.Tensor, *, views: bool = False,
                             lengths: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, dict, dict]:
        """Queries ``[B, T, HQ, Dk]`` and each branch's keys and values ``[B, T, H, D]``, from one
        product, queries and keys rotated to ``positions``. Each comes out contiguous (the rotation
        writes a new tensor; the values are copied): on views of the product the layer ran 6 %
        (forward) to 13 % (forward+backward) slower, the kernels reading tokens 19-22 KB apart and
        the backward of each slice filling a gradient of the whole product (H200, 4k-16k,
        docs/perf/compile.md). ``torch.split`` keeps that backward one concatenation.

        With ``views`` (a decode step, no gradient) everything is a view: the queries' and keys'
        columns, adjacent in the product, are rotated as one tensor of ``HQ + 3 H`` heads (one
        launch instead of four), and the values stay in the product. The step's consumers read
        them where they are (the cache's writes, the decode kernels). With ``lengths`` too (a
        device step on the Triton route) the rotation computes the positions ``lengths + t``
        itself and writes them into ``positions`` (:func:`nsa.ops.rotary.kernel.rotate_at_lengths`:
        one launch where the positions, the tables and the rotation took three)."""
        HQ, H, Dk, Dv = self.num_heads, self.num_kv_heads, self.head_dim, self.v_head_dim
        product = self.in_proj(x)
        if views:
            rotated_heads = HQ + len(BRANCHES) * H
            heads = product[..., : rotated_heads * Dk].unflatten(-1, (rotated_heads, Dk))
            if lengths is not None:
                from nsa.ops.rotary.kernel import rotate_at_lengths

                rotated = rotate_at_lengths(heads, lengths, self.rotary.inv_freq(x.device), positions)
            else:  # one (cos, sin) for the queries and every key
                rotated = self.rotary.rotate(heads, self.rotary.tables(positions, product.dtype))
            q, *kv = torch.split(rotated, [HQ] + [H] * len(BRANCHES), dim=2)
            keys = dict(zip(BRANCHES, kv))
            values = product[..., rotated_heads * Dk :].unflatten(-1, (len(BRANCHES) * H, Dv))
            return q, keys, dict(zip(BRANCHES, torch.split(values, H, dim=2)))
        tables = self.rotary.tables(positions, product.dtype)  # one (cos, sin) for the queries and every key
        q, *kv = torch.split(product, self._split_sizes, dim=-1)  # q, k per branch, v per branch
        q = self.rotary.rotate(q.unflatten(-1, (HQ, Dk)), tables)
        keys = {b: self.rotary.rotate(k.unflatten(-1, (H, Dk)), tables) for b, k in zip(BRANCHES, kv)}
        values = {b: v.unflatten(-1, (H, Dv)).contiguous() for b, v in zip(BRANCHES, kv[len(BRANCHES):])}
        return q, keys, values

    def _prefill_packed(self, x: torch.Tensor, pack: varlen.Layout, cache: NSACache) -> None:
        """Every sequence of a pack into an empty static cache from position 0: raw keys and
        values, lengths, compressed tokens (the prompts of a batched decode whose lengths differ).
        The keys and values are projected here once more: the padded batches keep theirs."""
        rows, positions = pack.sequence_positions(x.device)
        _, keys, values = self._queries_keys_values(x, positions[None])  # the queries' rows too: a rare path
        cache.prefill_packed(rows, positions, pack.lengths, **_raw(keys, values))
        count = self.config.num_cmp(cache.length)  # the longest prompt's; shorter ones rewrite their own
        if count:
            cache.emit(cache.seq_lens.to(torch.int64) - 1, count, self.compress_k, self.compress_v, backend=self.backend)

    def _kv_from_cache(self, cache: NSACache, keys: dict, values: dict) -> Tuple[dict, dict]:
        cache.append(**_raw(keys, values))
        pending = cache.pending_cmp()
        if pending > 0:
            first = cache.num_cmp
            cache.append_compressed(
                self.compress_k(cache.view("k_cmp_raw"), first, pending),
                self.compress_v(cache.view("v_cmp_raw"), first, pending),
            )
        keys = {"slc": cache.view("k_slc"), "win": cache.view("k_win"), "cmp": cache.view("k_cmp")}
        values = {"slc": cache.view("v_slc"), "win": cache.view("v_win"), "cmp": cache.view("v_cmp")}
        return keys, values

    def _device_step(self, x: torch.Tensor, cache: NSACache) -> torch.Tensor:
        """Graph-safe step: positions, cache writes and compressed-token emission all follow
        the device lengths ``cache.seq_lens``; then :func:`nsa.ops.decode.nsa_decode`."""
        steps = x.shape[1]
        cache.reserve(steps)  # a static cache never grows: this raises when it is full
        # views: under torch.compile Inductor folds the copies into its own kernels anyway
        views = not torch.compiler.is_compiling()
        if views and self._rotation_on_triton(x):  # the rotation writes the positions [B, T]
            positions = torch.empty(x.shape[0], steps, dtype=torch.int64, device=x.device)
            q, keys, values = self._queries_keys_values(x, positions, views=True, lengths=cache.seq_lens)
        else:
            positions = cache.positions(steps)  # [B, T]
            q, keys, values = self._queries_keys_values(x, positions, views=views)
        gates = self._step_gates(x)
        cache.write(positions, backend=self.backend, **_raw(keys, values))
        # every compressed token completed by this step's positions: at most ceil(T / d) of them
        cache.emit(positions[:, -1], -(-steps // self.config.cmp_stride), self.compress_k, self.compress_v,
                   backend=self.backend)
        buf = cache.buffer
        o, block_idx = nsa_decode(
            q, buf("k_slc"), buf("v_slc"), gates, cache.seq_lens, self.config,
            kv_cmp=(buf("k_cmp"), buf("v_cmp")), kv_win=(buf("k_win"), buf("v_win")),
            backend=self.backend, return_block_idx=True,
        )  # fmt: skip
        cache.advance_host(steps)
        cache.record(block_idx, positions)  # [B, T]: the sequences may sit at different positions
        return self.o_proj(o.flatten(2))

    def forward(
        self, x: torch.Tensor, cache: Optional[NSACache] = None, *, cu_seqlens: Optional[torch.Tensor] = None,
        max_seqlen: Optional[int] = None,
    ) -> torch.Tensor:
        """``x [B, T, hidden]`` -> ``[B, T, hidden]``.

        Without a cache, ``x`` is a whole sequence from position 0. With a
        cache, ``x`` continues the cached sequence (a prefill of any length when
        the cache is empty, then one or more tokens per call); the cache is
        updated in place and records the selected blocks and tokens read.

        With ``cu_seqlens``, ``x [1, total, hidden]`` packs whole sequences along
        time, flash-attn style (``[0, len_0, len_0 + len_1, ..., total]``, int32/int64;
        ``max_seqlen`` optional): each sequence gets its own positions from 0 and its
        own compressed tokens, exactly as if it ran alone. The layer runs them as padded
        batches of similar lengths (see :mod:`nsa.ops.varlen`); ``cu_seqlens`` on the host
        (a CPU tensor) keeps the call free of any wait for the GPU, and layers given the
        same boundaries share one layout. Given an empty static cache of one row per
        sequence, the call also fills it, each row to its own length: prompts of different
        lengths, which decode steps of ``[B, T, hidden]`` (``T <= DEVICE_STEP_MAX_TOKENS``)
        then continue, every row from its own length (``cache.seq_lens``).

        On a ``static`` cache, calls of at most ``DEVICE_STEP_MAX_TOKENS`` tokens
        take the graph-safe decode path (positions from ``cache.seq_lens``, no
        backward: run them under ``torch.no_grad()``); see :mod:`nsa.modules.graph`.
        """
        if x.dim() != 3 or x.shape[-1] != self.in_proj.in_features:
            raise ValueError(f"x must be [B, T, {self.in_proj.in_features}], got {list(x.shape)}")
        if cache is not None:
            self._check_cache_dtype(x, cache)
        if cu_seqlens is not None:
            pack = varlen.layout(cu_seqlens, max_seqlen, x.shape[1], x.shape[0], x.device)
            if cache is not None:
                self._prefill_packed(x, pack, cache)
            return pack.unpad([self.forward(group) for group in pack.pad(x)])
        if max_seqlen is not None:
            raise ValueError("max_seqlen needs cu_seqlens")
        if cache is not None and cache.static and x.shape[1] <= DEVICE_STEP_MAX_TOKENS:
            return self._device_step(x, cache)
        start = cache.length if cache is not None else 0
        positions = torch.arange(start, start + x.shape[1], device=x.device)
        q, keys, values, gates = self._project(x, positions)
        if cache is None:
            keys["cmp"], values["cmp"] = self.compress_k(keys["cmp"]), self.compress_v(values["cmp"])
        else:
            keys, values = self._kv_from_cache(cache, keys, values)
        o, block_idx = nsa_attention(
            q, keys["slc"], values["slc"], gates, self.config,
            kv_cmp=(keys["cmp"], values["cmp"]), kv_win=(keys["win"], values["win"]),
            q_offset=start, backend=self.backend, return_block_idx=True,
        )  # fmt: skip
        if cache is not None:
            cache.record(block_idx, start)
        return self.o_proj(o.flatten(2))


def _raw(keys: dict, values: dict) -> dict:
    """Projected keys/values per branch -> the cache's raw buffer names."""
    return {**{RAW_NAME["k"][b]: keys[b] for b in BRANCHES}, **{RAW_NAME["v"][b]: values[b] for b in BRANCHES}}
