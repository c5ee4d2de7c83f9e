"""A replica's KV pool in blocks, with a prefix cache kept as vLLM keeps one.

A block holds `block_size` tokens of one context. Once full and computed it is
cached under its key (the program and its index in the program's context: an
agent's context only grows, so a block's key names its tokens). A block nobody
references is free but keeps its cached tokens until it is taken for new ones;
free blocks are taken least recently freed first, and a request frees its
blocks tail first, so the cache loses a context from its end.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

BlockKey = tuple[str, int]
"""A full block's program and its index in the program's context."""


@dataclass
class Block:
    block_id: int
    key: BlockKey | None = None
    refs: int = 0


class BlockPool:
    def __init__(self, blocks: int):
        if blocks <= 0:
            raise ValueError("a pool needs at least one block")
        self._blocks = [Block(block_id) for block_id in range(blocks)]
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(blocks))
        self._cached: dict[BlockKey, int] = {}

    @property
    def total(self) -> int:
        return len(self._blocks)

    @property
    def free(self) -> int:
        """Blocks nobody references (cached or empty): what a new request may take."""
        return len(self._free)

    def block(self, block_id: int) -> Block:
        return self._blocks[block_id]

    def cached_prefix(self, program_id: str, full_blocks: int) -> list[int]:
        """The program's leading cached blocks, at most `full_blocks` of them."""
        found = []
        for index in range(full_blocks):
            block_id = self._cached.get((program_id, index))
            if block_id is None:
                break
            found.append(block_id)
        return found

    def unreferenced(self, block_ids: Iterable[int]) -> int:
        """How many of these blocks are free (taking them takes free blocks)."""
        return sum(1 for block_id in block_ids if self._blocks[block_id].refs == 0)

    def take(self, block_ids: Iterable[int]) -> None:
        """Reference cached blocks (a prefix hit, a pin)."""
        for block_id in block_ids:
            block = self._blocks[block_id]
            if block.refs == 0:
                del self._free[block_id]
            block.refs += 1

    def allocate(self, count: int) -> list[int] | None:
        """`count` free blocks for new tokens, evicting what they cached; None
        (and nothing taken) when fewer are free."""
        if count > len(self._free):
            return None
        taken = []
        for _ in range(count):
            block_id, _ = self._free.popitem(last=False)
            block = self._blocks[block_id]
            if block.key is not None:
                del self._cached[block.key]
                block.key = None
            block.refs = 1
            taken.append(block_id)
        return taken

    def cache(self, block_id: int, key: BlockKey) -> None:
        """The block is full and computed: later requests may find it. Where another
        block already caches the key, that one stays the cached copy."""
        block = self._blocks[block_id]
        if block.key is None and key not in self._cached:
            self._cached[key] = block_id
            block.key = key

    def release(self, block_ids: Iterable[int]) -> None:
        """Drop a reference to each block, in the order given: a block nobody
        references joins the free queue's end (taken last)."""
        for block_id in block_ids:
            block = self._blocks[block_id]
            if block.refs <= 0:
                raise ValueError(f"block {block_id} released more often than taken")
            block.refs -= 1
            if block.refs == 0:
                self._free[block_id] = None

    def check(self) -> None:
        """Every block is free exactly when nobody references it, and every cached
        key names the block that holds it."""
        for block in self._blocks:
            if (block.refs == 0) != (block.block_id in self._free):
                raise AssertionError(f"block {block.block_id}: refs {block.refs}, free list")
            if block.key is not None and self._cached.get(block.key) != block.block_id:
                raise AssertionError(f"block {block.block_id}: key {block.key} not cached")
        if len(self._cached) != sum(1 for block in self._blocks if block.key is not None):
            raise AssertionError("cached keys without their block")
