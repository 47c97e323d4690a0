"""Section 八, first optimization: keep the keys and values already computed instead of recomputing them."""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from .checks import is_int
from .weights import Config


def _check_length(n: int, length: int) -> None:
    if not is_int(n) or not 0 <= n <= length:
        raise ValueError(f"cannot truncate a cache of {length} positions to {n!r}: keep an int in [0, {length}]")


@dataclass
class LayerCache:
    """Keys and values of one layer in buffers of `capacity` positions; the first `length` positions are filled.

    The buffers are allocated by the first update, in the dtype of its keys: a bf16 or fp16 model gets a bf16 or
    fp16 cache without being asked.
    """

    capacity: int
    keys: Tensor | None = None     # [n_kv_head, capacity, d_head]
    values: Tensor | None = None   # [n_kv_head, capacity, d_head]
    length: int = 0

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append the new positions' k, v and return all of them.  # [n_kv, T, hs] -> [n_kv, length + T, hs]"""
        end = self.length + k.shape[1]
        if end > self.capacity:
            raise ValueError(f"KV cache is full: capacity {self.capacity} positions, asked for {end}; "
                             "create it with a larger capacity")
        if self.keys is None:
            shape = (k.shape[0], self.capacity, k.shape[2])
            self.keys, self.values = k.new_empty(shape), v.new_empty(shape)
        elif k.dtype != self.keys.dtype:
            raise ValueError(f"this KV cache holds {self.keys.dtype} keys, got {k.dtype}: "
                             "a cache serves one model; make a new one with KVCache.empty")
        self.keys[:, self.length:end] = k
        self.values[:, self.length:end] = v
        self.length = end
        return self.keys[:, :end], self.values[:, :end]

    def truncate(self, n: int) -> None:
        """Keep the first n positions and forget the rest: only the length moves, nothing is copied."""
        _check_length(n, self.length)
        self.length = n


@dataclass
class KVCache:
    """Per-layer keys and values of every position seen so far. The caller owns it and passes it to `forward`."""

    layers: list[LayerCache]

    @classmethod
    def empty(cls, config: Config, capacity: int) -> "KVCache":
        """A cache for up to `capacity` positions."""
        if not is_int(capacity) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1 (positions), got {capacity!r}")
        return cls([LayerCache(capacity) for _ in range(config.n_layer)])

    @property
    def length(self) -> int:
        """Number of positions cached."""
        return self.layers[0].length

    def truncate(self, n: int) -> None:
        """Keep the first n positions in every layer (speculative decoding drops rejected tokens this way)."""
        _check_length(n, self.length)
        for layer in self.layers:
            layer.truncate(n)

    def nbytes(self) -> int:
        """Bytes held by the filled part: 2 · n_layer · n_kv_head · d_head · T · bytes per number."""
        return sum(2 * c.keys[:, :c.length].numel() * c.keys.element_size() for c in self.layers if c.keys is not None)


def kv_cache_bytes(config: Config, t: int, bytes_per_number: int = 4) -> int:
    """The formula: 2 (k and v) · n_layer · n_kv_head · d_head · T · bytes."""
    return 2 * config.n_layer * config.n_kv_head * config.d_head * t * bytes_per_number
