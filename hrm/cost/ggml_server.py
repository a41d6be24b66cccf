"""llama-server under a load (docs/model.md §4.11): requests arriving over time, served by the
server's continuous batching on the CPU step model (:mod:`hrm.cost.ggml_cpu`).

The server is one loop (ggml-org/llama.cpp@0c1e5709, tools/server/server-context.cpp): between
iterations it gives each waiting request an idle slot, the least recently used one (:1596-1611;
``<=``, so among never-used slots the last); an iteration builds one batch — the last sampled
token of every generating slot, in slot order (:2955-3080), then prompt tokens of the slots still
prefilling, in slot order, until the batch holds ``n_batch`` (:3089-3110, 3505) — and decodes it
(:2848-2870). llama.cpp cuts the batch into micro-batches (src/llama-kv-cache.cpp:713): with one
KV stream (``-kvu``, or no ``-np``: tools/server/server.cpp:156-160) in order, ``n_ubatch``
tokens at a time (``split_simple``); with a stream per slot (``-np N``) by ``split_equal``
(src/llama-batch.cpp:542-635): the sequences of consecutive ids from the first unused one, an
equal count of tokens from each, at most ``n_ubatch`` in all — so slots whose ids are not
consecutive run in separate graph passes. After the decode each slot whose prompt ended samples
its first token, each generating slot its next; a slot that has generated its request's tokens
is released (server-context.cpp:510-525).

Each micro-batch is one :func:`hrm.cost.ggml_cpu.step_time`, on ``threads`` when it holds one
token and ``threads_batch`` otherwise (src/llama-context.cpp:2609). A unified cache is one cell
array shared by the slots (:class:`SharedCells`): a micro-batch's tokens take the lowest free cells
in order (src/llama-kv-cache.cpp:1001-1070, find_slot from a head that only seq_rm moves, :401-420),
so the slots' decode tokens interleave; a slot's cells are freed when a new task arrives and it is
idle (server-context.cpp:2417-2433, --cache-idle-slots on by default with a unified cache). A
micro-batch of FA_TILE_QUERIES rows or more in that stream runs flash attention's tiled kernel over
every KV tile any row of a query tile sees (:func:`SharedCells.tiled_pairs`). Not modelled: the
HTTP and tokenizer threads, sampling, and copying an idle slot's prompt to the RAM cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ggml_cells import SharedCells
from .ggml_cpu import causal_mean_tokens, step_threads, step_time
from ..errors import HRMError


@dataclass(frozen=True)
class Request:
    """One request: when it reaches the server, its prompt's tokens, and the tokens it generates."""

    arrival_s: float
    prompt_tokens: int
    gen_tokens: int

    def __post_init__(self):
        if self.arrival_s < 0 or self.prompt_tokens < 1 or self.gen_tokens < 1:
            raise HRMError(f"request {self}: needs arrival_s >= 0, prompt_tokens >= 1, gen_tokens >= 1")


@dataclass(frozen=True)
class ServerSetup:
    """A llama-server's slots and batching: ``slots`` (-np), ``kv_unified`` (one KV stream),
    ``n_batch`` (-b), ``n_ubatch`` (-ub), ``threads`` (-t), ``threads_batch`` (-tb), ``kv_cells``
    (the cache's cells, n_ctx: a unified cache's array), ``buffer`` (:func:`hrm.cost.ggml_cpu.step_time`'s:
    None repacked, HOST_BUFFER with -nr)."""

    slots: int
    kv_unified: bool
    n_batch: int
    n_ubatch: int
    threads: int
    threads_batch: int
    kv_cells: int
    buffer: str | None = None


@dataclass(frozen=True)
class ServedRequest:
    """A request as the server served it: its slot, when its prompt entered a batch
    (``prompt_start_s``), when its first token was sampled and when its last was."""

    request: Request
    slot: int
    prompt_start_s: float
    first_token_s: float
    done_s: float

    @property
    def ttft_s(self) -> float:
        """Arrival to first token, queueing included."""
        return self.first_token_s - self.request.arrival_s

    @property
    def latency_s(self) -> float:
        return self.done_s - self.request.arrival_s

    @property
    def prompt_s(self) -> float:
        """The server's own ``timings.prompt_ms`` (server-context.cpp t_prompt_processing)."""
        return self.first_token_s - self.prompt_start_s

    @property
    def decode_s(self) -> float:
        """The server's own ``timings.predicted_ms``: first token to last."""
        return self.done_s - self.first_token_s

    @property
    def tpot_s(self) -> float:
        steps = self.request.gen_tokens - 1
        return self.decode_s / steps if steps else 0.0


@dataclass(frozen=True)
class ServedLoad:
    """Every request served, and the loop's counts: iterations (batches) and graph passes
    (micro-batches) — more passes than iterations is the cost of cutting batches."""

    requests: tuple[ServedRequest, ...]
    iterations: int
    passes: int

    @property
    def makespan_s(self) -> float:
        return max(r.done_s for r in self.requests) - min(r.request.arrival_s for r in self.requests)

    @property
    def generated_tok_s(self) -> float:
        return sum(r.request.gen_tokens for r in self.requests) / self.makespan_s

    def percentile(self, quantity: str, q: float) -> float:
        """The ``q``-th percentile (0-100) over requests of a ServedRequest property."""
        return float(np.percentile([getattr(r, quantity) for r in self.requests], q))


def micro_batches(batch: list[tuple[int, int]], n_ubatch: int, unified: bool) -> list[list[tuple[int, int]]]:
    """``batch`` — (slot, tokens) runs in batch order, a slot at most once — cut as llama.cpp
    cuts it: in order at ``n_ubatch`` tokens (``split_simple``), or by ``split_equal`` with
    sequential ids (src/llama-batch.cpp:553-635): from the first run with tokens left, the runs
    whose slot is the previous one's + 1 (in batch order), then k tokens from each, k the fewest
    any of them has left, capped so that k x runs <= n_ubatch (at least 1)."""
    left = [[slot, n] for slot, n in batch]
    out = []
    if unified:
        ub, room = [], n_ubatch
        for run in left:
            while run[1]:
                take = min(run[1], room)
                ub.append((run[0], take))
                run[1] -= take
                room -= take
                if not room:
                    out.append(ub)
                    ub, room = [], n_ubatch
        if ub:
            out.append(ub)
        return out
    while any(n for _, n in left):
        chosen, last = [], None
        for run in left:
            if run[1] and (last is None or run[0] == last + 1) and len(chosen) <= n_ubatch:
                chosen.append(run)
                last = run[0]
        k = min(min(run[1] for run in chosen), max(1, n_ubatch // len(chosen)))
        out.append([(run[0], k) for run in chosen])
        for run in chosen:
            run[1] -= k
    return out


@dataclass
class _Slot:
    index: int
    last_used: float = -1.0
    served: int | None = None      # index into the requests being served
    cached: int = 0                # tokens in its KV stream
    prompt_left: int = 0
    generated: int = 0
    prompt_start_s: float | None = None
    first_token_s: float | None = None


def serve(requests: list[Request], setup: ServerSetup, inventory, section) -> ServedLoad:
    """Serve ``requests`` (any order; served by arrival) as :mod:`this module <hrm.cost.ggml_server>`
    describes, each micro-batch priced by :func:`hrm.cost.ggml_cpu.step_time`."""
    if not requests:
        raise HRMError("a load needs at least one request")
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    slots = [_Slot(i) for i in range(setup.slots)]
    shared = SharedCells(setup.kv_cells) if setup.kv_unified else None
    waiting: list[int] = []
    done: dict[int, ServedRequest] = {}
    now, nxt, iterations, passes = 0.0, 0, 0, 0
    while len(done) < len(requests):
        while nxt < len(order) and requests[order[nxt]].arrival_s <= now:
            waiting.append(order[nxt])
            nxt += 1
        busy = [s for s in slots if s.served is not None]
        while waiting and len(busy) < len(slots):
            # the least recently used idle slot; ties go to the last (server-context.cpp:1604 `<=`)
            idle = [s for s in slots if s.served is None]
            slot = min(idle, key=lambda s: (s.last_used, -s.index))
            r = waiting.pop(0)
            slot.served, slot.cached, slot.prompt_left, slot.generated = r, 0, requests[r].prompt_tokens, 0
            slot.prompt_start_s = slot.first_token_s = None
            busy.append(slot)
            if shared is not None:  # a new task clears every idle slot's cells, this one's among them
                for s in slots:
                    if s.served is None or s is slot:
                        shared.free(s.index)
        if not busy:
            now = requests[order[nxt]].arrival_s
            continue
        batch: list[tuple[int, int]] = [(s.index, 1) for s in slots if s.served is not None and not s.prompt_left]
        room = setup.n_batch - len(batch)
        for s in slots:
            if s.served is None or not s.prompt_left or room <= 0:
                continue
            take = min(s.prompt_left, room)
            if s.prompt_start_s is None:
                s.prompt_start_s = now
            batch.append((s.index, take))
            room -= take
        cached = {s.index: s.cached for s in slots}
        # where each output token sits: a generating slot's one token, a prompt's last
        output_at = {i: slots[i].cached + n for i, n in batch if slots[i].prompt_left in (0, n)}
        for ub in micro_batches(batch, setup.n_ubatch, setup.kv_unified):
            tokens = sum(n for _, n in ub)
            threads = step_threads(tokens, setup.threads, setup.threads_batch)
            pairs = (shared.place_step([(i, cached[i], n) for i, n in ub], inventory.attention.query_heads, threads)
                     if shared is not None else None)
            seqs = []
            for i, n in ub:
                seqs.append((n, causal_mean_tokens(cached[i], n)))
                cached[i] += n
            outputs = sum(1 for i, _ in ub if output_at.get(i) == cached[i])
            st = step_time(inventory, section, threads, tokens,
                           outputs, seqs, setup.buffer, setup.kv_unified, pairs)
            now += st.total_s
            passes += 1
        iterations += 1
        for i, n in batch:
            s = slots[i]
            s.cached += n
            if s.prompt_left:
                s.prompt_left -= n
                if s.prompt_left:
                    continue
                s.first_token_s = now
            s.generated += 1
            req = requests[s.served]
            if s.generated >= req.gen_tokens:
                done[s.served] = ServedRequest(req, s.index, s.prompt_start_s, s.first_token_s, now)
                s.served, s.last_used = None, now + s.index * 1e-9  # released in slot order
    return ServedLoad(tuple(done[i] for i in range(len(requests))), iterations, passes)


def evenly_spaced(rate_per_s: float, count: int, prompt_tokens: int, gen_tokens: int) -> list[Request]:
    """``count`` requests of one shape, one every 1/``rate_per_s`` seconds from 0."""
    if rate_per_s <= 0 or count < 1:
        raise HRMError("--rate-per-s must be > 0 and --requests >= 1")
    return [Request(i / rate_per_s, prompt_tokens, gen_tokens) for i in range(count)]


def poisson(rate_per_s: float, count: int, prompt_tokens: int, gen_tokens: int, seed: int = 0) -> list[Request]:
    """``count`` requests of one shape arriving as a Poisson process of ``rate_per_s`` (the first
    at 0; exponential gaps from numpy's generator seeded ``seed``), as serving benchmarks send them."""
    if rate_per_s <= 0 or count < 1:
        raise HRMError("--rate-per-s must be > 0 and --requests >= 1")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate_per_s, count - 1)
    times = np.concatenate([[0.0], np.cumsum(gaps)])
    return [Request(float(t), prompt_tokens, gen_tokens) for t in times]


#: a load file's columns (JSON Lines objects, or a CSV header)
REQUEST_FIELDS = ("arrival_s", "prompt_tokens", "gen_tokens")


def requests_from_file(path: str) -> list[Request]:
    """A load file: one request per line — JSON Lines objects, or CSV rows under a header — with
    REQUEST_FIELDS; a bad line is refused naming the file, its line and the field."""
    import csv
    import json
    from pathlib import Path

    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise HRMError(f"--load {path}: cannot read ({exc.strerror})") from None
    lines = [(i + 1, line) for i, line in enumerate(text.splitlines()) if line.strip()]
    if not lines:
        raise HRMError(f"--load {path}: no requests")
    if lines[0][1].lstrip().startswith("{"):
        rows = []
        for no, line in lines:
            try:
                rows.append((no, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise HRMError(f"--load {path}:{no}: not a JSON object ({exc.msg})") from None
    else:
        header = next(csv.reader([lines[0][1]]))
        rows = [(no, dict(zip(header, next(csv.reader([line]))))) for no, line in lines[1:]]
    out = []
    for no, row in rows:
        if not isinstance(row, dict):
            raise HRMError(f"--load {path}:{no}: not an object with {', '.join(REQUEST_FIELDS)}")
        values = []
        for field in REQUEST_FIELDS:
            if field not in row:
                raise HRMError(f"--load {path}:{no}: {field} missing (each request needs {', '.join(REQUEST_FIELDS)})")
            try:
                values.append(float(row[field]) if field == "arrival_s" else int(row[field]))
            except (TypeError, ValueError):
                raise HRMError(f"--load {path}:{no}: {field} = {row[field]!r} is not a number") from None
        try:
            out.append(Request(*values))
        except HRMError:
            raise HRMError(f"--load {path}:{no}: needs arrival_s >= 0, prompt_tokens >= 1, gen_tokens >= 1") from None
    if not rows:
        raise HRMError(f"--load {path}: no requests under the header")
    return out


__all__ = ["REQUEST_FIELDS", "requests_from_file", "Request", "ServerSetup", "SharedCells", "ServedRequest", "ServedLoad", "micro_batches", "serve", "evenly_spaced",
           "poisson"]
