"""The KV cells flash attention's tiled kernel computes (docs/model.md §4.10-§4.11): its query tiles as
the kernel cuts them (:func:`query_tiles`), the causal products of sequences in their own streams
(:func:`causal_tiled_pairs`), and a unified KV cache's cells (``-kvu``, or llama-server without
``-np``: :class:`SharedCells`), one cell array that every sequence's tokens share.

A micro-batch's tokens take the lowest free cells in order (src/llama-kv-cache.cpp:1001-1070,
find_slot from a head that only seq_rm moves, :401-420; ggml-org/llama.cpp@0c1e5709), so
sequences decoding together interleave their cells. A micro-batch of FA_TILE_QUERIES rows or more
runs the tiled kernel over the one stream: each query tile computes every KV tile in which one of
its rows sees a cell, whoever's cells the tile holds (ggml-cpu/ops.cpp flash_attn_ext_tiled skips
a KV tile only when every row's mask is -inf).
"""

from __future__ import annotations

import numpy as np

from ..errors import InfeasibleError

#: query rows of one sequence from which the CPU flash attention takes its tiled path
#: (ggml/src/ggml-cpu/common.h:9 GGML_FA_TILE_Q; ops.cpp ggml_compute_forward_flash_attn_ext_f16)
FA_TILE_QUERIES = 64

#: the CPU flash attention's query rows are cut into this many chunks per thread, taken by the
#: threads in turn (ggml/src/ggml-cpu/ops.cpp:9530 ``nth_scaled = nth * 4`` at ggml-org/llama.cpp@0c1e5709)
FA_CHUNKS_PER_THREAD = 4


def query_tiles(rows: int, heads: int, threads: int, streams: int = 1) -> dict[tuple[int, int, int], int]:
    """The query tiles the tiled flash-attention kernel runs for ``rows`` query rows in each of
    ``streams`` KV streams, ``heads`` query heads, on ``threads`` threads: {(stream, first row,
    rows in the tile): how many}. The kernel cuts the rows x heads x streams into
    FA_CHUNKS_PER_THREAD chunks a thread (one a thread on one thread), and each chunk into tiles
    of at most FA_TILE_QUERIES rows that never cross a chunk's or a head's end
    (ggml-cpu/ops.cpp:9528-9545 the chunking, :9169 tile_rows). A tile of fewer rows costs a
    whole one: its Q tile is zero padded (:9216-9218) and both products run on FA_TILE_QUERIES
    rows (:9266, :9329 ``simd_gemm(..., Q_TILE_SZ, ...)``)."""
    total = rows * heads * streams
    chunk = -(-total // (threads * FA_CHUNKS_PER_THREAD))
    chunks = -(-total // chunk)
    if threads == 1 or chunks < threads:
        chunks = threads
    per_chunk = -(-total // chunks)
    tiles: dict[tuple[int, int, int], int] = {}
    for c in range(chunks):
        at, end = per_chunk * c, min(per_chunk * (c + 1), total)
        while at < end:
            first = at % rows
            n = min(FA_TILE_QUERIES, end - at, rows - first)
            key = (at // rows // heads, first, n)
            tiles[key] = tiles.get(key, 0) + 1
            at += n
    return tiles


def causal_tiled_pairs(query_tokens: int, first_tokens: list[int], heads: int, threads: int) -> float:
    """The (query row, cached token) products per head the tiled kernel computes for causal runs
    of ``query_tokens`` queries in each of ``len(first_tokens)`` KV streams (a stream's first query
    attends ``first_tokens[s]`` tokens, each next query one more), counted as the probe counts
    them (64 query rows a tile, every cell): each query tile (:func:`query_tiles`) computes
    FA_TILE_QUERIES rows times every tile of FA_TILE_QUERIES cached tokens its last query sees,
    the partly masked last one whole (ggml-cpu/ops.cpp flash_attn_ext_tiled: a KV tile is
    skipped only when every row's mask is -inf)."""
    return sum(count * FA_TILE_QUERIES * -(-(first_tokens[stream] + start + n - 1) // FA_TILE_QUERIES) * FA_TILE_QUERIES
               for (stream, start, n), count in query_tiles(query_tokens, heads, threads, len(first_tokens)).items()
               ) / heads


class SharedCells:
    """A unified KV cache's cells: which slot holds each (-1: free) and at which position."""

    def __init__(self, cells: int):
        self.owner = np.full(cells, -1)
        self.pos = np.zeros(cells, dtype=np.int64)

    def free(self, slot: int) -> None:
        self.owner[self.owner == slot] = -1

    def place(self, slot: int, first_pos: int, n: int) -> None:
        """``n`` tokens of ``slot`` from ``first_pos`` into the lowest free cells."""
        free = np.flatnonzero(self.owner == -1)[:n]
        if len(free) < n:
            raise InfeasibleError(f"llama-server: the unified KV cache's {len(self.owner)} cells cannot hold the "
                                  "requests in flight (raise -c or send fewer at once)")
        self.owner[free] = slot
        self.pos[free] = np.arange(first_pos, first_pos + n)

    def place_step(self, placed: list[tuple[int, int, int]], heads: int, threads: int) -> float | None:
        """A micro-batch's tokens placed — (slot, first position, tokens) in its order — and the
        (query row, cell) products per head the tiled kernel computes for them
        (:meth:`tiled_pairs`); None below FA_TILE_QUERIES rows (the one-row kernel, which skips
        masked cells: ops.cpp:8969)."""
        rows = []
        for slot, first, n in placed:
            self.place(slot, first, n)
            rows += [(slot, p) for p in range(first, first + n)]
        return self.tiled_pairs(rows, heads, threads) if len(rows) >= FA_TILE_QUERIES else None

    def tiled_pairs(self, rows: list[tuple[int, int]], heads: int = 1, threads: int = 1) -> float:
        """The (query row, cell) products per head of the tiled kernel for ``rows`` — (slot,
        position) per query in micro-batch order — with ``heads`` query heads on ``threads``
        threads: each query tile (:func:`query_tiles`) computes FA_TILE_QUERIES
        rows times every tile of FA_TILE_QUERIES cells holding a cell of one of its rows' slots at
        or before that row's position (ggml-cpu/ops.cpp flash_attn_ext_tiled: a KV tile is
        skipped only when fully masked; a tile of fewer rows is zero padded)."""
        pairs = 0.0
        for (_, start, n), count in query_tiles(len(rows), heads, threads).items():
            last: dict[int, int] = {}
            for slot, p in rows[start:start + n]:
                last[slot] = max(p, last.get(slot, p))
            seen = np.zeros(len(self.owner), dtype=bool)
            for slot, p in last.items():
                seen |= (self.owner == slot) & (self.pos <= p)
            kv_tiles = np.unique(np.flatnonzero(seen) // FA_TILE_QUERIES)
            pairs += count * FA_TILE_QUERIES * len(kv_tiles) * FA_TILE_QUERIES
        return pairs / heads


__all__ = ["FA_TILE_QUERIES", "FA_CHUNKS_PER_THREAD", "query_tiles", "causal_tiled_pairs", "SharedCells"]
