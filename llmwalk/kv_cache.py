"""Section 八, first optimization: keep the keys and values already computed instead of recomputing them."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .weights import Config


@dataclass
class LayerCache:
    """Keys and values of one layer, in a buffer allocated once; the first `length` positions are filled."""

    keys: Tensor     # [n_kv_head, capacity, d_head]
    values: Tensor   # [n_kv_head, capacity, d_head]
    length: int = 0

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append the new positions' k, v and return all of them.  # [n_kv, T, hs] -> [n_kv, length + T, hs]"""
        end = self.length + k.shape[1]
        if end > self.keys.shape[1]:
            raise ValueError(f"KV cache is full: capacity {self.keys.shape[1]} positions, asked for {end}; "
                             "create it with a larger capacity")
        self.keys[:, self.length:end] = k
        self.values[:, self.length:end] = v
        self.length = end
        return self.keys[:, :end], self.values[:, :end]


@dataclass
class KVCache:
    """Per-layer keys and values of every position seen so far. The caller owns it and passes it to `forward`."""

    layers: list[LayerCache]

    @classmethod
    def empty(cls, config: Config, capacity: int, dtype: torch.dtype = torch.float32) -> "KVCache":
        """A cache for up to `capacity` positions."""
        shape = (config.n_kv_head, capacity, config.d_head)
        return cls([LayerCache(torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype))
                    for _ in range(config.n_layer)])

    @property
    def length(self) -> int:
        """Number of positions cached."""
        return self.layers[0].length

    def nbytes(self) -> int:
        """Bytes held by the filled part: 2 · n_layer · n_kv_head · d_head · T · bytes per number."""
        return sum(2 * c.keys[:, :c.length].numel() * c.keys.element_size() for c in self.layers)


def kv_cache_bytes(config: Config, t: int, bytes_per_number: int = 4) -> int:
    """The formula: 2 (k and v) · n_layer · n_kv_head · d_head · T · bytes."""
    return 2 * config.n_layer * config.n_kv_head * config.d_head * t * bytes_per_number
