"""nn.Modules: the NSA layer, its cache, the compression functions and RoPE."""

from nsa.modules.attention import NSAAttention
from nsa.modules.cache import NSACache, TokenReads, count_reads
from nsa.modules.graph import DecodeGraph, capture_decode
from nsa.modules.compression import MeanCompression, MLPCompression
from nsa.modules.rotary import RotaryEmbedding

__all__ = ["DecodeGraph", "MLPCompression", "capture_decode", "MeanCompression", "NSAAttention", "NSACache", "RotaryEmbedding", "TokenReads", "count_reads"]
