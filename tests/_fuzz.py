"""Differential fuzzing of ``nsa_attention``: random problems from the whole space the API accepts,
each run by the backend under test and checked against the reference.

A :class:`Case` is drawn from its seed alone (:func:`draw`), so a failing case is reproduced from
the seed printed in its message. The space covers every geometry :class:`nsa.NSAConfig` accepts at
small sizes (strides that are not powers of two, selection blocks smaller than a compressed block,
windows shorter than a block or longer than the sequence, no initial or local blocks), group sizes
that are not powers of two, ``Dk != Dv`` and head widths that are not powers of two, sequences
shorter than a compressed block, chunked prefill (``q_offset``), compressed keys and window keys of
the caller's own (``kv_cmp``, ``kv_win``), packed batches (``cu_seqlens``), and both the inference
path (no gradient) and the training one.

:func:`check` then asserts, as the parity tests do (``tests/ops/test_nsa_attention_kernel.py``):
the selected blocks are a valid top-n of the reference's scores (the reference's own but for
near-ties), and the output and every gradient match the reference given those blocks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from nsa import NSAConfig
from nsa.testing import (
    SELECTION_EPS,
    assert_close,
    assert_valid_selection,
    block_scores,
    decode_row_reference,
    nsa_attention_with_blocks,
)


@dataclass(frozen=True)
class Scale:
    """The sizes a draw may take: small enough for Triton's CPU interpreter, or for a GPU."""

    name: str
    max_tokens: int  #: longest sequence (keys, q_offset included)
    head_dims: Tuple[int, ...]
    groups: Tuple[int, ...]  #: query heads a KV head
    max_kv_heads: int
    strides: Tuple[int, ...]  #: cmp_stride d
    dtypes: Tuple[torch.dtype, ...]
    reference_dtype: Callable[[torch.dtype], torch.dtype]


#: Triton's CPU interpreter: a few seconds a case. bfloat16 is left out: the interpreter of Triton
#: 3.9 computes its ``tl.dot`` wrongly (README, Known limits).
INTERPRETER = Scale(
    name="interpreter", max_tokens=96, head_dims=(16, 24, 32), groups=(1, 2, 3, 4), max_kv_heads=2,
    strides=(2, 4, 6, 8), dtypes=(torch.float32, torch.float16), reference_dtype=lambda dtype: torch.float64,
)

#: A GPU: real head widths and lengths of a few thousand, 16-bit against a float32 reference (the
#: issue's bar) and float32 against float64.
GPU = Scale(
    name="gpu", max_tokens=3000, head_dims=(32, 64, 80, 128, 192), groups=(1, 2, 3, 4, 5, 8, 16),
    max_kv_heads=4, strides=(4, 8, 16), dtypes=(torch.bfloat16, torch.float16, torch.float32),
    reference_dtype=lambda dtype: torch.float64 if dtype == torch.float32 else torch.float32,
)


SCALES = {scale.name: scale for scale in (INTERPRETER, GPU)}


@dataclass(frozen=True)
class _Problem:
    """What a prefill and a decode case share: the seed, the geometry, the heads and the dtype."""

    seed: int
    scale: str
    config: NSAConfig
    heads_kv: int
    group: int
    dk: int
    dv: int
    dtype: torch.dtype

    @property
    def heads_q(self) -> int:
        return self.heads_kv * self.group

    def _heads_and_geometry(self) -> str:
        c = self.config
        scale = "" if c.scale is None else f" scale={c.scale:.3g}"
        return (f"HQ{self.heads_q} H{self.heads_kv} Dk{self.dk} Dv{self.dv} {str(self.dtype).replace('torch.', '')} "
                f"l={c.cmp_block} d={c.cmp_stride} l'={c.sel_block} n={c.sel_count} init={c.init_blocks} "
                f"local={c.local_blocks} w={c.window}{scale}")


@dataclass(frozen=True)
class Case(_Problem):
    """One problem. ``lengths`` holds one length a sequence: a packed batch (``cu_seqlens``) where
    ``packed``, else ``B = len(lengths)`` rows of the same length. ``q_offset`` keys come before the
    first query (chunked prefill; keys are ``q_offset + lengths[0]`` long)."""

    lengths: Tuple[int, ...]
    packed: bool
    q_offset: int
    own_cmp: bool  #: compressed keys and values given (``kv_cmp``), as a learnt compression would
    own_win: bool  #: the window's keys and values given (``kv_win``)
    grad: bool  #: the training path (gradients) rather than inference

    def __str__(self) -> str:
        rows = ("packed " + "+".join(map(str, self.lengths))) if self.packed else f"B{len(self.lengths)} T{self.lengths[0]}"
        extras = [name for name, on in (("kv_cmp", self.own_cmp), ("kv_win", self.own_win), ("grad", self.grad)) if on]
        return " ".join([f"seed {self.seed} ({self.scale}): {rows} q_offset={self.q_offset}",
                         self._heads_and_geometry(), *extras])


def _length(rng: random.Random, scale: Scale, config: NSAConfig) -> int:
    """Mostly past a few selection blocks; sometimes shorter than one compressed block."""
    if rng.random() < 0.1:
        return rng.randint(1, config.cmp_block)
    return rng.randint(config.sel_block, scale.max_tokens)


def _config(rng: random.Random, scale: Scale) -> NSAConfig:
    d = rng.choice(scale.strides)
    cmp_block = d * rng.choice((1, 2, 2, 3, 4))
    sel_block = d * rng.choice((1, 2, 3, 4, 4, 8))
    init_blocks, local_blocks = rng.choice((0, 1, 1, 2)), rng.choice((0, 1, 2, 2, 3))
    # at least one free pick most of the time: a top-n with nothing to rank checks little
    sel_count = max(1, init_blocks + local_blocks + rng.choice((0, 1, 2, 3, 4, 6)))
    window = rng.choice((rng.randint(1, sel_block), rng.randint(1, scale.max_tokens // 2), scale.max_tokens * 2))
    return NSAConfig(cmp_block=cmp_block, cmp_stride=d, sel_block=sel_block, sel_count=sel_count,
                     init_blocks=init_blocks, local_blocks=local_blocks, window=window,
                     scale=rng.choice((None, None, None, rng.uniform(0.02, 0.5))))


def _heads(rng: random.Random, scale: Scale) -> dict:
    dk = rng.choice(scale.head_dims)
    dv = dk if rng.random() < 0.6 else rng.choice(scale.head_dims)
    return dict(heads_kv=rng.randint(1, scale.max_kv_heads), group=rng.choice(scale.groups), dk=dk, dv=dv,
                dtype=rng.choice(scale.dtypes))


def draw(seed: int, scale: Scale) -> Case:
    """The prefill case of ``seed`` at ``scale`` (the same on every machine)."""
    rng = random.Random(seed)
    config = _config(rng, scale)
    packed = rng.random() < 0.2
    rows = rng.randint(2, 4) if packed else rng.choice((1, 1, 2, 3))
    lengths = tuple(_length(rng, scale, config) for _ in range(rows)) if packed else (_length(rng, scale, config),) * rows
    q_offset = 0
    if not packed and rng.random() < 0.3 and lengths[0] > 1:
        q_offset = rng.randint(1, lengths[0] - 1)
        lengths = (lengths[0] - q_offset,) * rows
    return Case(
        seed=seed, scale=scale.name, config=config, lengths=lengths, packed=packed, q_offset=q_offset,
        own_cmp=not packed and rng.random() < 0.25, own_win=rng.random() < 0.25, grad=rng.random() < 0.6,
        **_heads(rng, scale),
    )


@dataclass
class Inputs:
    """A case's tensors, float64 on the CPU until :meth:`to`: drawn from the seed, so that a
    case is the same on every device."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    gates: torch.Tensor
    kv_cmp: Optional[Tuple[torch.Tensor, torch.Tensor]]
    kv_win: Optional[Tuple[torch.Tensor, torch.Tensor]]
    do: torch.Tensor

    def leaves(self) -> List[torch.Tensor]:
        return [self.q, self.k, self.v, self.gates, *(self.kv_cmp or ()), *(self.kv_win or ())]

    def to(self, device: torch.device, dtype: torch.dtype, grad: bool) -> "Inputs":
        """A copy in ``dtype`` on ``device``, leaves that require a gradient where ``grad``
        (``do`` stays float64)."""
        def move(x: torch.Tensor) -> torch.Tensor:
            return x.to(device=device, dtype=dtype).detach().requires_grad_(grad)

        pair = lambda p: None if p is None else (move(p[0]), move(p[1]))  # noqa: E731
        return Inputs(move(self.q), move(self.k), move(self.v), move(self.gates), pair(self.kv_cmp),
                      pair(self.kv_win), self.do.to(device))


def inputs(case: Case) -> Inputs:
    """Random inputs of ``case`` (never zeros; gates in ``[0, 1]``), keys ``q_offset`` longer
    than the queries. A packed case is one row of ``sum(lengths)`` positions."""
    gen = torch.Generator().manual_seed(case.seed)
    batch, total = (1, sum(case.lengths)) if case.packed else (len(case.lengths), case.lengths[0])
    keys = total + case.q_offset
    hq, h = case.heads_q, case.heads_kv

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q, k, v = randn(batch, total, hq, case.dk), randn(batch, keys, h, case.dk), randn(batch, keys, h, case.dv)
    gates = torch.rand(batch, total, hq, 3, generator=gen, dtype=torch.float64)
    nc = case.config.num_cmp(keys)
    kv_cmp = (randn(batch, nc, h, case.dk), randn(batch, nc, h, case.dv)) if case.own_cmp else None
    kv_win = (randn(batch, keys, h, case.dk), randn(batch, keys, h, case.dv)) if case.own_win else None
    return Inputs(q, k, v, gates, kv_cmp, kv_win, randn(batch, total, hq, case.dv))


def cu_seqlens(case: Case) -> Optional[torch.Tensor]:
    """The host ``cu_seqlens`` of a packed case, ``None`` otherwise."""
    from nsa.ops.varlen import cu_seqlens_of

    return cu_seqlens_of(case.lengths) if case.packed else None


def _sequences(case: Case) -> List[slice]:
    """The positions of each sequence along dimension 1 (the whole row where not packed)."""
    if not case.packed:
        return [slice(None)]
    bounds = cu_seqlens(case).tolist()
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def reference(case: Case, x: Inputs, block_idx: torch.Tensor, selection_eps: float) -> torch.Tensor:
    """The reference's output given the blocks ``block_idx`` chosen by the backend under test,
    after checking those blocks against the reference's own top-n (sequence by sequence where
    packed); ``x`` in the reference's dtype.

    The top-n is checked on the compressed keys as the case's dtype holds them (as
    :func:`nsa.ops.mean_compress` returns them, and the backend ranks them): their rounding to 16
    bits alone moves block scores by more than ``selection_eps`` (1e-3 of a score) where a block
    holds a single compressed token (GPU seed 2: 33 rows of 2619 past it, none past 3e-3)."""
    from nsa.ops import mean_compress, select_blocks

    config, outs = case.config, []
    for seq in _sequences(case):
        q, k, v, gates = (t[:, seq] for t in (x.q, x.k, x.v, x.gates))
        kv_win = None if x.kv_win is None else tuple(t[:, seq] for t in x.kv_win)
        kv_cmp = x.kv_cmp or tuple(mean_compress(t, config, backend="reference") for t in (k, v))
        with torch.no_grad():
            ranked = kv_cmp[0].to(case.dtype).to(kv_cmp[0].dtype)
            ref_idx = select_blocks(q, ranked, config, q_offset=case.q_offset, backend="reference")
            scores = block_scores(q, ranked, config, q_offset=case.q_offset)
        assert_valid_selection(block_idx[:, seq], ref_idx, scores, config, q_offset=case.q_offset, eps=selection_eps)
        outs.append(nsa_attention_with_blocks(q, k, v, gates, config, block_idx[:, seq], kv_cmp=kv_cmp,
                                              kv_win=kv_win, q_offset=case.q_offset))
    return torch.cat(outs, dim=1)


def _grads(case: Case, x: Inputs, o: torch.Tensor) -> List[torch.Tensor]:
    # a leaf may take no part (no compressed token below cmp_block keys): its gradient is zero
    return list(torch.autograd.grad((o.double() * x.do).sum(), x.leaves(), allow_unused=True, materialize_grads=True))


def _assert_rounding(name: str, got: torch.Tensor, ref_grads: Sequence[torch.Tensor], tol: float) -> None:
    """A gradient that is exactly zero (the window's keys where the window is one position: a softmax
    over one score does not move) can only be rounding: at most ``tol`` of the case's largest
    gradient, by norm (no relative error exists against zero)."""
    scale = max(float(g.double().norm()) for g in ref_grads)
    share = float(got.double().norm()) / scale if scale > 0 else float(got.double().norm())
    if not share <= tol:
        raise AssertionError(f"{name}: the reference is 0, and this holds {share:.3e} of the largest gradient's "
                             f"norm, above {tol:.1e}")


GRAD_NAMES = ("dq", "dk", "dv", "dgates")


def grad_names(case: Case) -> Sequence[str]:
    return (*GRAD_NAMES, *(("dk_cmp", "dv_cmp") if case.own_cmp else ()), *(("dk_win", "dv_win") if case.own_win else ()))


def check(case: Case, device: torch.device, tolerance: Callable[[torch.dtype, str], float], *,
          backend: str = "triton", attention: Optional[Callable] = None) -> None:
    """Run ``case`` on ``backend`` and assert it against the reference (``AssertionError`` naming
    the case and what differed). ``attention`` replaces :func:`nsa.nsa_attention` (tests of
    this checker)."""
    from nsa import nsa_attention

    attention = attention or nsa_attention
    base = inputs(case)
    x = base.to(device, case.dtype, case.grad)
    kwargs = dict(kv_cmp=x.kv_cmp, kv_win=x.kv_win, q_offset=case.q_offset)
    if case.packed:
        kwargs["cu_seqlens"] = cu_seqlens(case)
    try:
        with torch.set_grad_enabled(case.grad):
            o, block_idx = attention(x.q, x.k, x.v, x.gates, case.config, backend=backend, return_block_idx=True, **kwargs)
        if o.dtype != case.dtype or o.shape != (*x.q.shape[:3], case.dv):
            raise AssertionError(f"o: {o.dtype} {tuple(o.shape)}, want {case.dtype} {(*x.q.shape[:3], case.dv)}")
        # the reference reads the very values the backend did: the case's dtype's, widened
        up = x.to(device, SCALES[case.scale].reference_dtype(case.dtype), case.grad)
        ref_o = reference(case, up, block_idx, SELECTION_EPS[case.dtype])
        assert_close("o", o, ref_o, tolerance(case.dtype, "fwd"))
        if case.grad:
            ref_grads = _grads(case, up, ref_o)
            for name, got, want in zip(grad_names(case), _grads(case, x, o), ref_grads):
                if torch.count_nonzero(want) == 0:
                    _assert_rounding(name, got, ref_grads, tolerance(case.dtype, "grad"))
                else:
                    assert_close(name, got, want, tolerance(case.dtype, "grad"))
    except AssertionError as err:
        raise AssertionError(f"{case}: {err}") from None


@dataclass(frozen=True)
class DecodeCase(_Problem):
    """One decode step: ``len(lengths)`` rows over a preallocated cache of ``capacity`` positions
    (``capacity_cmp`` compressed ones), row ``b`` holding ``lengths[b]`` tokens of which the last
    ``new_tokens`` are its queries. Whatever lies past a row's length is NaN: never to be read."""

    lengths: Tuple[int, ...]
    new_tokens: int
    capacity: int
    capacity_cmp: int
    own_win: bool

    def __str__(self) -> str:
        return " ".join([f"seed {self.seed} ({self.scale}, decode): lengths {'+'.join(map(str, self.lengths))} "
                         f"Tq{self.new_tokens} capacity {self.capacity}/{self.capacity_cmp}",
                         self._heads_and_geometry(), *(["kv_win"] if self.own_win else [])])


def draw_decode(seed: int, scale: Scale) -> DecodeCase:
    """The decode case of ``seed`` at ``scale``: rows of different lengths, 1 to 16 new tokens."""
    rng = random.Random(seed)
    config = _config(rng, scale)
    new_tokens = rng.choice((1, 1, 1, 2, 3, 8, 16))
    rows = rng.choice((1, 1, 2, 3, 5) if scale is INTERPRETER else (1, 1, 2, 3, 5, 16, 17))
    lengths = tuple(max(new_tokens, _length(rng, scale, config)) for _ in range(rows))
    capacity = max(lengths) + rng.choice((0, 1, rng.randint(1, 64)))
    return DecodeCase(
        seed=seed, scale=scale.name, config=config, lengths=lengths, new_tokens=new_tokens, capacity=capacity,
        capacity_cmp=config.num_cmp(capacity) + rng.choice((0, 0, 1, 5)), own_win=rng.random() < 0.25,
        **_heads(rng, scale),
    )


def decode_inputs(case: DecodeCase) -> dict:
    """float64 CPU tensors of ``case``: ``q``, ``gates``, the caches ``k``, ``v``, ``k_cmp``, ``v_cmp``
    (and ``k_win``, ``v_win``), NaN past each row's length."""
    gen = torch.Generator().manual_seed(case.seed)
    rows, hq, h = len(case.lengths), case.heads_q, case.heads_kv

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    out = dict(q=randn(rows, case.new_tokens, hq, case.dk),
               gates=torch.rand(rows, case.new_tokens, hq, 3, generator=gen, dtype=torch.float64))
    caches = [("k", case.capacity, case.dk), ("v", case.capacity, case.dv),
              ("k_cmp", case.capacity_cmp, case.dk), ("v_cmp", case.capacity_cmp, case.dv)]
    if case.own_win:
        caches += [("k_win", case.capacity, case.dk), ("v_win", case.capacity, case.dv)]
    for name, size, width in caches:
        cache = randn(rows, size, h, width)
        for b, n in enumerate(case.lengths):
            cache[b, (case.config.num_cmp(n) if name.endswith("_cmp") else n):] = float("nan")
        out[name] = cache
    return out


def check_decode(case: DecodeCase, device: torch.device, tolerance: Callable[[torch.dtype, str], float], *,
                 backend: str = "triton") -> None:
    """One ``nsa_decode`` step of ``case`` on ``backend``: each row's blocks a valid top-n of the
    reference's scores, and its output the reference prefill's at the row's last positions given
    those blocks (:func:`nsa.testing.decode_row_reference`; ``AssertionError`` naming the case)."""
    from nsa.ops import nsa_decode

    x = {name: t.to(device=device, dtype=case.dtype) for name, t in decode_inputs(case).items()}
    up = {name: t.to(SCALES[case.scale].reference_dtype(case.dtype)) for name, t in x.items()}  # x widened
    seq_lens = torch.tensor(case.lengths, dtype=torch.int32, device=device)
    win = ("k_win", "v_win") if case.own_win else ("k", "v")

    def step(t: dict, backend: str):
        return nsa_decode(t["q"], t["k"], t["v"], t["gates"], seq_lens, case.config, kv_cmp=(t["k_cmp"], t["v_cmp"]),
                          kv_win=(t[win[0]], t[win[1]]), backend=backend, return_block_idx=True)

    try:
        with torch.no_grad():
            o, block_idx = step(x, backend)
            if o.dtype != case.dtype or o.shape != (*x["q"].shape[:3], case.dv):
                raise AssertionError(f"o: {o.dtype} {tuple(o.shape)}, want {case.dtype} {(*x['q'].shape[:3], case.dv)}")
            _, ref_idx = step(up, "reference")
            ref_o = [decode_row_reference(b, n, x["q"], x["k"], x["v"], x["gates"], x["k_cmp"], x["v_cmp"], x[win[0]],
                                          x[win[1]], block_idx, ref_idx, case.config, dtype=up["q"].dtype)
                     for b, n in enumerate(case.lengths)]
        assert_close("o", o, torch.cat(ref_o), tolerance(case.dtype, "fwd"))
    except AssertionError as err:
        raise AssertionError(f"{case}: {err}") from None
