"""NSA ops. Each takes ``backend=`` (``None``/``"auto"``, ``"reference"``, ``"triton"``).

Layout of every op: ``[B, T, heads, dim]``. Queries sit at positions
``q_offset, q_offset + 1, ...`` (0 for a prefill).
"""

from nsa.ops.combine import nsa_attention
from nsa.ops.compress import mean_compress
from nsa.ops.compressed import compressed_attention
from nsa.ops.decode import nsa_decode
from nsa.ops.gates import combine_branches
from nsa.ops.rotary import apply_rotary, rope_tables
from nsa.ops.select import select_blocks
from nsa.ops.selected import selected_attention
from nsa.ops.window import sliding_window_attention

__all__ = [
    "apply_rotary",
    "combine_branches",
    "compressed_attention",
    "mean_compress",
    "nsa_decode",
    "nsa_attention",
    "rope_tables",
    "select_blocks",
    "selected_attention",
    "sliding_window_attention",
]
