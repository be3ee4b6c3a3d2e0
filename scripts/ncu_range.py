"""The profiled range of the ``ncu_*.py`` scripts (run them under ``ncu --profile-from-start off``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable, Sequence, Tuple

import torch

from nsa import NSAConfig
from nsa.ops import mean_compress


def profile_once(calls: Sequence[Callable[[], object]], warmup: int = 1) -> None:
    """Run each call ``warmup`` times (compilation, autotuning), then each once between
    cudaProfilerStart and cudaProfilerStop, so that Nsight Compute sees one launch set."""
    for call in calls:
        for _ in range(warmup):
            call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def compressed_inputs(length: int) -> Tuple[NSAConfig, torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """``(config, q, k_cmp, v_cmp, scale)`` of the compressed branch at ``length`` tokens, seeded by it:
    bf16, B = 1, 64 query heads, 4 KV heads, head dim 128, paper defaults, random inputs."""
    config = NSAConfig()
    torch.manual_seed(length)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    q, k, v = (torch.randn(1, length, heads, 128, **bf) for heads in (64, 4, 4))
    return config, q, mean_compress(k, config), mean_compress(v, config), config.softmax_scale(128)


def scoring_setup(length: int) -> SimpleNamespace:
    """The compressed forward's scoring pass at ``length`` tokens, ready to launch chunk by chunk on
    Hopper (:func:`compressed_inputs`, then the Gluon pass 1 for the log2-domain lse): ``q``,
    ``k_cmp``, ``lse2``, ``scale`` (log2 domain), ``nsel``, ``planes``, ``chunk`` (the queries the
    forward's score buffer holds), and ``masses(t0, t1, out)``, which writes the block masses of
    queries ``[t0, t1)`` into ``out [B, t1 - t0, H, planes, nsel]`` as the forward does (``planes``
    overridable, for timing)."""
    from nsa.ops._triton.attention import LOG2E
    from nsa.ops._triton.compressed_fwd import SCORE_BUFFER_BYTES, _score_geometry, query_chunk
    from nsa.ops.compressed import gluon_pass1, gluon_scores

    config, q, k_cmp, _, scale = compressed_inputs(length)
    B, TQ, HQ, _ = q.shape
    H = k_cmp.shape[2]
    scale *= LOG2E
    o, lse, lse2 = torch.empty_like(q), torch.empty(B, TQ, HQ, device=q.device), torch.empty(B, TQ, HQ, device=q.device)
    gluon_pass1.compressed_pass1_gluon(q, k_cmp, k_cmp, o, lse, lse2, 0, scale, config.cmp_block, config.cmp_stride)
    geo = _score_geometry(config)
    nsel, planes = config.num_sel_blocks(length), geo["NSPILL"]

    def masses(t0: int, t1: int, out: torch.Tensor, planes: int = planes) -> None:
        shape = dict(L=config.cmp_block, S=config.cmp_stride, SEL=config.sel_block, R=geo["R"], KC=geo["KC"],
                     NSPILL=planes)
        gluon_scores.compressed_scores_gluon(q, k_cmp, lse2, out, 0, scale, t0, t1, nsel, shape)

    chunk = query_chunk(B, TQ, H, planes * nsel, 128 // (HQ // H), SCORE_BUFFER_BYTES)
    return SimpleNamespace(config=config, q=q, k_cmp=k_cmp, lse2=lse2, scale=scale, B=B, TQ=TQ, H=H, nsel=nsel,
                           planes=planes, chunk=chunk, masses=masses)
