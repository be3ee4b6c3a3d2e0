"""NSAConfig: frozen, validated on construction, with the spec's derived quantities."""

from __future__ import annotations

import dataclasses
import math

import pytest

from nsa import NSAConfig

SIZES = ("cmp_block", "cmp_stride", "sel_block", "sel_count", "window")


def test_paper_defaults():
    cfg = NSAConfig()
    assert (cfg.cmp_block, cfg.cmp_stride, cfg.sel_block, cfg.sel_count) == (32, 16, 64, 16)
    assert (cfg.init_blocks, cfg.local_blocks, cfg.window, cfg.scale) == (1, 2, 512, None)


def test_frozen_and_hashable():
    cfg = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, sel_count=4, window=16)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.window = 32  # type: ignore[misc]
    assert cfg == NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, sel_count=4, window=16)
    assert len({cfg, dataclasses.replace(cfg), NSAConfig()}) == 2


def test_replace_validates_too():
    with pytest.raises(ValueError, match="cmp_stride"):
        dataclasses.replace(NSAConfig(), cmp_stride=24)


@pytest.mark.parametrize("field", SIZES)
@pytest.mark.parametrize("value", [0, -1, -16])
def test_non_positive_sizes_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"NSAConfig\.{field} must be positive, got {value}"):
        NSAConfig(**{field: value})


@pytest.mark.parametrize("field", ["init_blocks", "local_blocks"])
def test_negative_forced_counts_name_the_field(field):
    with pytest.raises(ValueError, match=rf"NSAConfig\.{field} must be >= 0, got -1"):
        NSAConfig(**{field: -1})


def test_zero_forced_blocks_are_allowed():
    cfg = NSAConfig(init_blocks=0, local_blocks=0, sel_count=1)
    assert (cfg.init_blocks, cfg.local_blocks) == (0, 0)


@pytest.mark.parametrize(
    "kwargs, other",
    [
        pytest.param(dict(cmp_block=32, cmp_stride=12, sel_block=48), "cmp_block=32", id="not-dividing-cmp_block"),
        pytest.param(dict(cmp_block=32, cmp_stride=16, sel_block=72), "sel_block=72", id="not-dividing-sel_block"),
        pytest.param(dict(cmp_block=30, cmp_stride=20, sel_block=40), "cmp_block=30", id="stride-above-half"),
        pytest.param(dict(cmp_block=16, cmp_stride=32, sel_block=64), "cmp_block=16", id="stride-above-block"),
    ],
)
def test_stride_must_divide_both_blocks(kwargs, other):
    with pytest.raises(ValueError, match=rf"NSAConfig\.cmp_stride=\d+ must divide {other}"):
        NSAConfig(**kwargs)


@pytest.mark.parametrize("kwargs", [dict(cmp_block=8, cmp_stride=8, sel_block=8), dict(cmp_block=48, cmp_stride=16, sel_block=32)])
def test_dividing_strides_are_accepted(kwargs):
    """d = l and l > l' are legal geometries (the spec only asks d | l and d | l')."""
    assert NSAConfig(**kwargs).cmp_stride == kwargs["cmp_stride"]


@pytest.mark.parametrize("init, local, count", [(1, 2, 2), (3, 0, 2), (0, 5, 4), (2, 2, 3)])
def test_sel_count_covers_forced_blocks(init, local, count):
    with pytest.raises(ValueError, match=rf"NSAConfig\.sel_count={count} must be >= init_blocks \+ local_blocks"):
        NSAConfig(init_blocks=init, local_blocks=local, sel_count=count)
    assert NSAConfig(init_blocks=init, local_blocks=local, sel_count=init + local or 1).sel_count >= init + local


@pytest.mark.parametrize(
    "field, value",
    [("cmp_block", 32.0), ("sel_count", "16"), ("window", True), ("init_blocks", None), ("cmp_stride", 16.5)],
)
def test_non_int_sizes_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"NSAConfig\.{field} must be an int"):
        NSAConfig(**{field: value})


@pytest.mark.parametrize("value", [0, -0.5, math.inf, math.nan, "0.1", True])
def test_bad_scale_names_the_field(value):
    with pytest.raises(ValueError, match=r"NSAConfig\.scale must be a positive finite number or None"):
        NSAConfig(scale=value)


def test_softmax_scale():
    assert NSAConfig().softmax_scale(64) == 0.125
    assert NSAConfig(scale=0.5).softmax_scale(64) == 0.5
    assert NSAConfig(scale=2).softmax_scale(7) == 2.0


@pytest.mark.parametrize(
    "cfg",
    [NSAConfig(), NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, sel_count=4, window=16),
     NSAConfig(cmp_block=6, cmp_stride=6, sel_block=12, sel_count=3, window=5)],
    ids=["defaults", "small", "l=d"],
)
def test_num_cmp_is_the_spec_visible_count(cfg):
    """num_cmp(t + 1) = Nc(t) = #{i : i*d + l - 1 <= t}, counted by brute force."""
    for t in range(0, 300):
        brute = sum(1 for i in range(t + 1) if i * cfg.cmp_stride + cfg.cmp_block - 1 <= t)
        assert cfg.num_cmp(t + 1) == brute, t
        assert cfg.num_sel_blocks(t + 1) == t // cfg.sel_block + 1, t
    assert cfg.num_cmp(0) == 0 and cfg.num_sel_blocks(0) == 0


@pytest.mark.parametrize("context, reads", [(8192, 2047), (16384, 2559), (32768, 3583), (65536, 5631)])
def test_decode_reads_match_the_spec_table(context, reads):
    cfg = NSAConfig()
    assert cfg.decode_reads(context) == reads
    assert reads == (context - cfg.cmp_block) // cfg.cmp_stride + 1 + cfg.sel_count * cfg.sel_block + cfg.window


def test_decode_reads_short_context():
    """Below n*l' and w every token is read by both the selected and the sliding branch."""
    cfg = NSAConfig()
    assert cfg.decode_reads(1) == 2
    assert cfg.decode_reads(100) == cfg.num_cmp(100) + 100 + 100 == 5 + 200
