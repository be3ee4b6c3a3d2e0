"""nsa.bench.workloads on the CPU: each workload computes what it claims, and reads are real."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from nsa import NSAConfig, nsa_attention
from nsa.bench.workloads import (
    BRANCHES, DECODE_OPS, Shape, branch_runners, decode_reads, decode_runner, default_config, describe_config,
    graph_status, parse_dtype, point_info, prefill_runner, routes,
)  # fmt: skip
from nsa.testing import rel_error

CPU = torch.device("cpu")
CONFIG = default_config(CPU)


def small(batch: int = 2, length: int = 320) -> Shape:
    return Shape(batch, length, 4, 2, 16, torch.float32)


def test_shape_and_dtype_errors_name_the_field():
    with pytest.raises(ValueError, match="Shape.length must be a positive int"):
        Shape(1, 0, 4, 1, 16, torch.float32)
    with pytest.raises(ValueError, match="heads=6 must be a multiple of kv_heads=4"):
        Shape(1, 64, 6, 4, 16, torch.float32)
    with pytest.raises(ValueError, match="Shape.dtype"):
        Shape(1, 64, 4, 1, 16, torch.float64)
    with pytest.raises(ValueError, match="dtype must be one of"):
        parse_dtype("fp8")
    assert parse_dtype("BF16") is torch.bfloat16


def test_point_info_records_the_geometry():
    info = point_info(small(), CONFIG)
    assert info["config"] == describe_config(CONFIG) == "l=16 d=8 l'=32 n=8 w=128"
    assert info["dtype"] == "float32" and info["length"] == 320
    assert describe_config(NSAConfig(init_blocks=0, local_blocks=1)).endswith("init=0 local=1")


def test_nsa_decode_step_is_nsa_at_the_last_position():
    shape = small()
    runner = decode_runner("nsa", shape, CONFIG, CPU)
    q, k, v, gates, seq_lens, k_cmp, v_cmp = runner.input_sets[0]
    assert seq_lens.tolist() == [shape.length] * shape.batch and k.shape[1] == shape.length
    expected = nsa_attention(q.double(), k.double(), v.double(), gates.double(), CONFIG,
                             kv_cmp=(k_cmp.double(), v_cmp.double()), q_offset=shape.length - 1)
    assert rel_error(runner.target(0), expected) < 1e-5


def test_dense_decode_step_is_attention_over_the_whole_context():
    runner = decode_runner("dense", small(), CONFIG, CPU)
    q, k, v = runner.input_sets[0]  # [B, HQ, 1, D], [B, H, S, D]
    kk, vv = (t.double().repeat_interleave(2, dim=1) for t in (k, v))
    p = torch.softmax(q.double() @ kk.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
    assert rel_error(runner.target(0), p @ vv) < 1e-5


def test_decode_reads_come_from_the_real_blocks():
    full = small(length=320)  # a multiple of sel_block: every selected block is full
    actual, expected = decode_reads(full, CONFIG, CPU)
    assert expected == CONFIG.decode_reads(320) and actual == expected
    partial = small(length=300)  # the query's own block holds 300 % 32 = 12 positions
    actual, expected = decode_reads(partial, CONFIG, CPU)
    assert actual == expected - (32 - 300 % 32)


def test_branch_runners_time_each_branch_on_its_real_blocks():
    shape = small()
    runners = branch_runners(shape, CONFIG, CPU, sets=2)
    assert tuple(runners) == BRANCHES
    block_idx = runners["slc"].input_sets[0][5]
    assert block_idx.shape == (shape.batch, 1, shape.kv_heads, CONFIG.sel_count) and (block_idx >= 0).all()
    for name, runner in runners.items():
        assert len(runner.input_sets) == 2
        out = runner.target(1)
        assert out.shape[0] == shape.batch and (name == "select" or torch.isfinite(out).all())


@pytest.mark.parametrize("impl", ["nsa", "dense"])
def test_prefill_forward_and_backward(impl):
    shape = small(batch=1, length=96)
    fwd = prefill_runner(impl, shape, CONFIG, CPU, backward=False)
    out = fwd.target(0)
    assert not out.requires_grad and torch.isfinite(out).all()
    bwd = prefill_runner(impl, shape, CONFIG, CPU, backward=True)
    *inputs, grad_out = bwd.input_sets[0]
    grads = bwd.target(0)
    assert [g.shape for g in grads] == [t.shape for t in inputs]
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
    assert all(t.grad is None for t in inputs)  # autograd.grad: nothing accumulates across rounds


def test_unknown_impl_and_graph_status():
    with pytest.raises(ValueError, match="impl must be 'nsa' or 'dense'"):
        decode_runner("flash", small(), CONFIG, CPU)
    with pytest.raises(ValueError, match="impl must be 'nsa' or one of dense, dense_flash, dense_cudnn"):
        prefill_runner("flash", small(), CONFIG, CPU, backward=False)
    ok, why = graph_status("nsa", CPU, torch.float32)
    assert not ok and "CUDA" in why
    assert routes(DECODE_OPS, CPU, torch.float32) == {op: "reference" for op in DECODE_OPS}


def test_device_defaults():
    gpu = Shape.default(torch.device("cuda"), 1, 4096)
    assert (gpu.heads, gpu.kv_heads, gpu.head_dim, gpu.dtype) == (64, 4, 128, torch.bfloat16)
    assert default_config(torch.device("cuda")) == NSAConfig()
    assert Shape.default(CPU, 2, 512).dtype == torch.float32


def test_pack_lengths_fill_the_pack_alike_at_any_size():
    """Seeded, summing to the total; a 64k pack holds what the session-34 packs held, and a
    small pack as many documents (lengths scaled down); bad arguments are named."""
    from nsa.bench.workloads import PACK_KINDS, pack_lengths

    sizes = {kind: len(pack_lengths(kind, 65536)) for kind in PACK_KINDS}
    assert sizes == {"lognormal": 38, "long": 13, "uniform": 7, "one_long": 24}
    for kind in PACK_KINDS:
        for total in (1, 7, 2048, 65536):
            lengths = pack_lengths(kind, total, seed=3)
            assert sum(lengths) == total and min(lengths) >= 1 and lengths == pack_lengths(kind, total, seed=3)
        assert len(pack_lengths(kind, 2048)) >= sizes[kind] - 1  # the last one cut to fit
    assert pack_lengths("one_long", 2048)[0] == 1024 and pack_lengths("lognormal", 2048, seed=1) != pack_lengths("lognormal", 2048)
    with pytest.raises(ValueError, match="pack kind must be one of"):
        pack_lengths("short", 100)
    with pytest.raises(ValueError, match="a pack's total must be a positive int"):
        pack_lengths("long", 0)


@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "fwd+bwd"])
def test_packed_runners_compute_each_sequence_alone(backward):
    """The NSA runner is ``nsa_attention`` over the pack; the dense one causal attention over each
    sequence (GQA), both on the runner's own inputs."""
    from nsa.bench.workloads import packed_runner

    device, lengths = torch.device("cpu"), [40, 3, 77]
    shape, config = Shape(1, 120, 4, 2, 16, torch.float32), default_config(torch.device("cpu"))
    for impl in ("nsa", "dense"):
        runner, what = packed_runner(impl, shape, lengths, config, device, backward=backward, sets=1)
        args = runner.input_sets[0]
        got = runner.target(0)
        q, k, v = (x.detach() for x in args[:3])
        a = 0
        for n in lengths:
            if impl == "nsa":
                want = nsa_attention(q[:, a : a + n], k[:, a : a + n], v[:, a : a + n], args[3].detach()[:, a : a + n], config)
            else:
                want = F.scaled_dot_product_attention(*(x[:, a : a + n].transpose(1, 2) for x in (q, k, v)), is_causal=True,
                                                      enable_gqa=True).transpose(1, 2)
            if not backward:
                torch.testing.assert_close(got[:, a : a + n], want, rtol=1e-5, atol=1e-5)
            a += n
        if backward:
            assert len(got) == (4 if impl == "nsa" else 3) and all(torch.isfinite(g).all() for g in got)
        assert what == ("nsa" if impl == "nsa" else "sdpa per sequence")
    with pytest.raises(ValueError, match="a pack is one row of sum\\(lengths\\) = 120 tokens"):
        packed_runner("nsa", Shape(2, 120, 4, 2, 16, torch.float32), lengths, config, device, backward=False)



@pytest.mark.gpu
def test_dense_packed_runner_on_the_gpu_is_attention_over_each_sequence(nsa_device):
    """On CUDA the dense pack goes through ``varlen_attn`` (keys and values given every query head
    where that has no GQA): the same as causal SDPA over each sequence, bf16."""
    from nsa.bench.workloads import packed_runner

    lengths = [1000, 37, 2100, 511]
    shape = Shape(1, sum(lengths), 16, 4, 128, torch.bfloat16)
    runner, what = packed_runner("dense", shape, lengths, default_config(nsa_device), nsa_device, backward=False, sets=1)
    q, k, v = runner.input_sets[0]
    got, a = runner.target(0), 0
    for n in lengths:
        want = F.scaled_dot_product_attention(*(x[:, a : a + n].transpose(1, 2) for x in (q, k, v)), is_causal=True,
                                              enable_gqa=True).transpose(1, 2)
        assert rel_error(got[:, a : a + n].float(), want.float()) < 1e-2, what
        a += n
