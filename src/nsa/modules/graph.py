"""Capture one decode step of an :class:`nsa.NSAAttention` layer in a CUDA graph, then replay it.

A decode step at batch 1 is a few microseconds of GPU work behind tens of
kernel launches (projections, RoPE, cache writes, compressed-token emission,
the decode kernels, the output projection). Replaying them as one CUDA graph
removes the launch cost. This works because the step on a ``static``
:class:`nsa.NSACache` is shape-stable and sync-free: every position comes from
the device tensor ``cache.seq_lens``, the buffers never move, and the
emission rule (recompute the newest compressed tokens each step) needs no host
decision. A ``.item()`` or any other sync inside the step makes the capture
itself fail, so capturing is also the test that the step is sync-free.

Usage::

    layer = NSAAttention(...).cuda().bfloat16()
    cache = layer.new_cache(batch, capacity=65536, static=True)
    with torch.no_grad():
        layer(prompt, cache)                      # prefill (eager)
        step = DecodeGraph(layer, cache)          # warm up + capture
        for _ in range(n):
            y = step(x_next)                      # [B, 1, hidden]; y is step.output

The returned tensor is the graph's static output buffer: the next call
overwrites it (``clone()`` what you keep). ``cache.last_block_idx`` is a static buffer too,
refreshed by every replay, and ``cache.last_reads`` follows from it when read.
"""

from __future__ import annotations

from typing import Optional

import torch

from nsa.modules.attention import NSAAttention
from nsa.modules.cache import DEVICE_STEP_MAX_TOKENS, NSACache


class DecodeGraph:
    """A captured decode step of ``layer`` on ``cache`` (``tokens`` new tokens per sequence).

    Args:
        layer: the :class:`nsa.NSAAttention` layer, on a CUDA device.
        cache: a ``static`` :class:`nsa.NSACache` of that layer on the same device;
            its current contents are kept (warm-up steps are undone).
        tokens: new tokens per sequence and step, ``1 <= tokens <= DEVICE_STEP_MAX_TOKENS`` (default 1).
        warmup: eager steps run before the capture, on a side stream, to compile the
            Triton kernels and create library handles (default 2).
        pool: optional graph memory pool handle shared with other graphs.

    Raises:
        ValueError: the cache is not static, not on CUDA, or too small for one more step.
    """

    def __init__(self, layer: NSAAttention, cache: NSACache, tokens: int = 1, *, warmup: int = 2, pool=None) -> None:
        if not cache.static or cache.device.type != "cuda":
            raise ValueError(f"DecodeGraph needs a static NSACache on CUDA, got static={cache.static} on {cache.device}")
        if not 1 <= tokens <= DEVICE_STEP_MAX_TOKENS:
            raise ValueError(f"tokens must lie in [1, {DEVICE_STEP_MAX_TOKENS}], got {tokens}")
        if cache.length + tokens > cache.capacity:
            raise ValueError(f"cache holds {cache.length} of {cache.capacity} positions: no room for a {tokens}-token step")
        self.layer, self.cache, self.tokens = layer, cache, tokens
        weight = layer.in_proj.weight
        self.input = torch.zeros(cache.seq_lens.shape[0], tokens, layer.in_proj.in_features, device=cache.device, dtype=weight.dtype)
        self.graph = torch.cuda.CUDAGraph()
        saved = (cache.length, cache.num_cmp, cache.seq_lens.clone())
        side = torch.cuda.Stream(device=cache.device)
        side.wait_stream(torch.cuda.current_stream(cache.device))
        with torch.no_grad(), torch.cuda.stream(side):
            for _ in range(warmup):
                layer(self.input, cache)
                self._restore(saved)
        torch.cuda.current_stream(cache.device).wait_stream(side)
        with torch.no_grad(), torch.cuda.graph(self.graph, pool=pool):
            self.output: torch.Tensor = layer(self.input, cache)
        # capturing ran the host code once (advancing the host length) but no kernel
        self._restore(saved)

    def _restore(self, saved) -> None:
        # Steps write only at positions >= the saved length and re-emit compressed tokens
        # idempotently, so resetting the lengths undoes a step completely.
        self.cache.length, self.cache.num_cmp = saved[0], saved[1]
        self.cache.seq_lens.copy_(saved[2])

    def __call__(self, x: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Run one step on ``x [B, tokens, hidden]`` (default: what is already in
        :attr:`input`); returns :attr:`output` ``[B, tokens, hidden]`` (overwritten next call)."""
        cache = self.cache
        cache.reserve(self.tokens)  # the replay cannot check: raise here when the static cache is full
        if x is not None:
            if tuple(x.shape) != tuple(self.input.shape):
                raise ValueError(f"x must have shape {list(self.input.shape)}, got {list(x.shape)}")
            self.input.copy_(x)
        self.graph.replay()
        cache.advance_host(self.tokens)
        return self.output

    step = __call__


def capture_decode(layer: NSAAttention, cache: NSACache, tokens: int = 1, **kwargs) -> DecodeGraph:
    """Shorthand for :class:`DecodeGraph` ``(layer, cache, tokens, **kwargs)``."""
    return DecodeGraph(layer, cache, tokens, **kwargs)
