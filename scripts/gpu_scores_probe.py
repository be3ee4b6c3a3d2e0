"""Where does the Gluon scoring pass (``nsa/ops/compressed/gluon_scores.py``) spend its time?

Why: in session 67 its forms before the persistent one ran as fast as the Triton pass 2 at 64k
tokens on the H200 and slower at 32k, about 2200 cycles a tile of 128 tokens by 128 rows where the
tensor cores need 1024 and the special-function units (the exponentials) 1024. This script times the kernel's launches over
every query of a prefill (the chunks ``compressed_fwd`` launches) in forms that each take one part
of its work away, so that what is left shows what binds it; each form's results are wrong but for
``main``:

- ``main``: the module as it is;
- ``no_exp``: the exponential replaced by a multiply-add (the special-function units idle);
- ``one_plane``: the masses of plane 0 alone summed and stored;
- ``no_mask``: the masked tiles run unmasked;
- ``one_tile``/``two_tiles``: every program walks one or two key tiles at most (what a program costs
  beside its walk, and a tile).

The Triton pass 2 over the same chunks is timed beside them (``triton``). Usage:
``python scripts/gpu_scores_probe.py [--lengths 65536 32768]``; needs a Hopper GPU with Gluon.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import tempfile

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODULE = ROOT / "src" / "nsa" / "ops" / "compressed" / "gluon_scores.py"

#: ``form: [(old, new), ...]``: the edits of the module's text that make each form (each ``old``
#: must occur).
FORMS = {
    "main": [],
    "no_exp": [("p_bits = gl.reshape(gl.exp2(x),", "p_bits = gl.reshape(x * 0.5 + 1.0,")],
    "one_plane": [("for shift in gl.static_range(NSPILL):", "for shift in gl.static_range(1):")],
    "no_mask": [("if tok0 + 64 > nv_first:", "if tok0 < 0:")],
    "one_tile": [("return gl.cdiv((t_last // SEL + 1) * R, BN)", "return gl.minimum(gl.cdiv((t_last // SEL + 1) * R, BN), 1)")],
    "two_tiles": [("return gl.cdiv((t_last // SEL + 1) * R, BN)", "return gl.minimum(gl.cdiv((t_last // SEL + 1) * R, BN), 2)")],
}


def load_form(name: str, edits):
    """The module with ``edits`` applied, imported from a file of its own (Gluon reads a kernel's
    source from its file)."""
    text = MODULE.read_text()
    for old, new in edits:
        assert old in text, f"{name}: {old!r} is not in the module"
        text = text.replace(old, new)
    path = pathlib.Path(tempfile.mkdtemp()) / f"gluon_scores_{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"gluon_scores_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[65536, 32768])
    parser.add_argument("--forms", nargs="+", default=list(FORMS), choices=list(FORMS))
    args = parser.parse_args()

    import triton

    from nsa import NSAConfig
    from nsa.ops._triton.attention import LOG2E, dot_precision
    from nsa.ops._triton.compressed_fwd import PASS2_APART, _score_geometry, compressed_fwd_kernel, query_chunk
    from nsa.ops._triton.launch import LAUNCH_OPTIONS, cdiv
    from nsa.ops.compressed import gluon_pass1

    config = NSAConfig()
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}", flush=True)
    forms = {name: load_form(name, FORMS[name]) for name in args.forms}
    for T in args.lengths:
        B, HQ, H, D = 1, 64, 4, 128
        G = HQ // H
        torch.manual_seed(0)
        nc = config.num_cmp(T)
        q = torch.randn(B, T, HQ, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, nc, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        qk_scale = config.softmax_scale(D) * LOG2E
        o = torch.empty_like(q)
        lse, lse2 = (torch.empty(B, T, HQ, device="cuda") for _ in range(2))
        gluon_pass1.compressed_pass1_gluon(q, k, v, o, lse, lse2, 0, qk_scale, config.cmp_block, config.cmp_stride)
        geo = _score_geometry(config, PASS2_APART["blocks_per_step"])
        nsel = config.num_sel_blocks(T)
        chunk = query_chunk(B, T, H, geo["NSPILL"] * nsel, PASS2_APART["rows"] // G)
        scores = torch.empty(B * chunk * H * geo["NSPILL"] * nsel, device="cuda")
        geometry = dict(L=config.cmp_block, S=config.cmp_stride, SEL=config.sel_block, R=geo["R"], KC=geo["KC"],
                        NSPILL=geo["NSPILL"])
        bt = PASS2_APART["rows"] // G

        def chunks():
            for t0 in range(0, T, chunk):
                t1 = min(t0 + chunk, T)
                yield t0, t1, scores[: B * (t1 - t0) * H * geo["NSPILL"] * nsel].view(B, t1 - t0, H, -1, nsel)

        def gluon_run(module):
            return lambda: [module.compressed_scores_gluon(q, k, lse2, sc, 0, qk_scale, t0, t1, nsel, geometry)
                            for t0, t1, sc in chunks()]

        def triton_run():
            launch = dict(H=H, G=G, GP=G, BT=bt, BN=64, DK=D, DV=D, BDK=D, BDV=D, L=config.cmp_block,
                          S=config.cmp_stride, SEL=config.sel_block, STORE_O=False, SELECT=True,
                          PREC=dot_precision(q.dtype, q.device, D),
                          num_warps=PASS2_APART["num_warps"], num_stages=PASS2_APART["num_stages"], **geo)
            for t0, t1, sc in chunks():
                compressed_fwd_kernel[(cdiv(t1 - t0, bt), B * H)](q, k, v, q, q, sc, T, nc, 0, qk_scale, t0, t1, nsel,
                                                                   lse2=lse2, PASS1=False, **launch, **LAUNCH_OPTIONS)

        runs = {"triton": triton_run, **{name: gluon_run(module) for name, module in forms.items()}}
        if "main" in forms:  # the last chunk's masses, main's against Triton's (the forms' are wrong)
            scores.zero_()  # blocks past a query tile's own that neither writes, or only one (zeros)
            triton_run()
            want = scores.clone()
            scores.zero_()
            runs["main"]()
            err = ((scores - want).norm() / want.norm()).item()
            print(f"T={T} the last chunk's masses, main against Triton: relative error {err:.2e}", flush=True)
        for turn in range(2):
            for name, run in (list(runs.items()) if turn == 0 else list(runs.items())[::-1]):
                ms = triton.testing.do_bench(run, warmup=5, rep=40)
                print(f"T={T} scoring pass, {name}: {ms:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
