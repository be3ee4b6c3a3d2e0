"""The hand-off from the score launch to the selection programs, one (row, KV group) at a time.

Without it a selection program waits (``gdc_wait``) for the whole score launch, whose last
programs are those on the SMs it crowds most (session 49: the score programs of a batch-16 step
at 64k ended 45.4-52.2 us in, and every selection program waited for 52.2). With it each score
program counts itself in its row-group's counter once its candidates are stored, and a selection
program waits for the counts of its own row-group's tiles alone.

The counters are per call: launch 1 zeroes them (program 0 of each row-group), and a score
program counts only after its own wait for launch 1, so the zero is always in place first.
Nothing is carried from one call to the next, and a graph replays at any length.

Why no program can wait forever: the selection launch starts (programmatic dependent launch) only
once every score program has started, so every program counted on is running or done. A program
that still sees a short count after ``MAX_POLLS`` polls waits for the whole score launch
instead, so a miscount costs time, never a wrong or missing result.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

# polls of a selection program (each a load from L2, about a microsecond) before it
# falls back to waiting for the whole score launch
MAX_POLLS = tl.constexpr(16384)


@triton.jit
def count_done(p_count):
    """Count this program as done in ``p_count``: every thread's stores before the call reach
    L2 first (a barrier of the program, then one thread's release add, GPU scope)."""
    tl.debug_barrier()
    tl.atomic_add(p_count, 1, sem="release", scope="gpu")


@triton.jit
def wait_count(p_count, target, PDL: tl.constexpr):
    """Wait until ``p_count`` reaches ``target``, with ``PDL`` (which a GPU of compute capability
    9.0 or later runs; without it the launch before has ended). One thread polls with relaxed
    loads (Triton shares the value with the program's other threads through shared memory behind
    a barrier), then every thread takes an acquire fence: an acquire load there cost another
    round trip to L2, and invalidated the SM's L1 each poll. After ``MAX_POLLS`` polls it waits
    for the whole launch before instead. Loads of what the counted programs wrote should bypass
    L1 (``.cg``): L1 is not coherent."""
    if PDL:
        n = tl.atomic_add(p_count, 0, sem="relaxed", scope="gpu")
        polls = 1
        while (n < target) & (polls < MAX_POLLS):
            n = tl.atomic_add(p_count, 0, sem="relaxed", scope="gpu")
            polls += 1
        n = tl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tmov.u32 $0, $1;", "=r,r", [n], dtype=tl.int32,
                                      is_pure=False, pack=1)
        if n < target:
            gdc_wait()
