"""Plan execution (docs/model.md §8; MoE-Lightning §4.1 and appendix A).

- Weights: non-expert weights and the placement's static experts on the device tier; the
  other experts in host memory, moved in n pages per layer into a device double buffer
  (:mod:`runtime.experts`), page j of layer i+1 while micro-batch j of layer i computes.
- Prefill: layer by layer on the device tier for every micro-batch (FlexGen's zig-zag
  order), hidden states parked in host memory between layers, the KV cache written to the
  host (all but the r_c share kept on the device).
- Decode, attention on the CPU: **Algorithm 1 (CGOPipe)**. The launcher queues, for every
  (layer i, micro-batch j) in order: LoadH(i,j) → W_PintoG(i+1,j) → PostAttn(i,j), then
  PreAttn, OffloadQKV and CPUAttn of the micro-batch two ahead, so that the CPU works on
  attention while the device runs the O projection and the experts of the current one.
  The pipeline runs on across layers and decode steps (the last layer's PostAttn includes
  the lm_head, the greedy choice and the next token's embedding).
- Decode, attention on the device (FlexGen S4): the host part of the next micro-batch's KV
  cache is prefetched (D4) while the current one computes; new K/V go back to the host.
- Experts on the CPU (ffn=cpu): the router's output goes to the host, the CPU runs the
  routed experts from host weights, the result comes back and is added on the device.
- Variable-length prompts: Algorithm 2 (:mod:`runtime.requests`) when ``padding`` is off.
- Routing trace: ``run(requests, recorder)`` hands every router call's expert ids to a
  :class:`runtime.routing_trace.RoutingRecorder` (none by default: no bookkeeping at all).

Tasks go to four in-order lanes (gpu, cpu, h2d, d2h; :mod:`runtime.device`) with explicit
dependencies; every task's start/end is recorded (:mod:`runtime.trace`). On a CPU-only host
the lanes share one unit by default (one task at a time, all cores; ``lanes="exclusive"``),
as the model assumes there; ``lanes="concurrent"`` gives each lane a thread instead.
"""

from __future__ import annotations

from functools import partial
from typing import Optional

import torch

from hrm.errors import HRMError
from hrm.model.spec import ModelSpec
from hrm.plan import Placement
from hrm.policy import Policy, policy_refusal
from hrm.workload import Workload

from . import ops
from .batch import KVCache, MicroBatch, make_micro_batch, to_device
from .device import DeviceTier, Task
from .experts import ExpertStore
from .measure import RoundResult, RunResult
from .model import LayerWeights, ModelWeights, check_supported, final_logits, post_attention_static, qkv
from hrm.placement import policy_placement
from .requests import Request, plan_rounds
from .routing_trace import RoutingRecorder

LOOKAHEAD = 2  # Algorithm 1: CPU attention is launched two micro-batches ahead


class PlanExecutor:
    """Runs requests under one policy and placement; returns tokens, logits and timings."""

    def __init__(self, spec: ModelSpec, weights: ModelWeights, policy: Policy, workload: Workload, *,
                 placement: Optional[Placement] = None, device: str = "auto", track_memory: bool = True,
                 keep_logits: bool = True, lanes: str = "auto"):
        check_supported(spec)
        refusal = policy_refusal(policy.model_dump())  # the one home of the rules (an unvalidated copy too)
        if refusal:
            raise HRMError(f"policy: {refusal}")
        self.spec, self.policy, self.workload = spec, policy, workload
        self.keep_logits = keep_logits
        self.placement = placement or policy_placement(spec, policy)
        self.tier = DeviceTier(device, track_memory=track_memory, lanes=lanes)
        self.dtype = weights.embed.dtype
        self.num_layers = spec.num_layers
        self.embed = self.tier.alloc(weights.embed)
        lm_head = self.embed if weights.lm_head is weights.embed else self.tier.alloc(weights.lm_head)
        layers = [self._device_layer(layer) for layer in weights.layers]
        self.device_weights = ModelWeights(self.embed, layers, self.tier.alloc(weights.final_norm), lm_head)
        self.is_moe = [layer.is_moe for layer in weights.layers]
        self.experts = ExpertStore(spec, weights, self.placement, self.tier, on_device=policy.ffn_on_gpu)
        self.num_pages = self.experts.pages
        self.static_bytes = self.tier.memory.persistent_bytes
        self.recorder: Optional[RoutingRecorder] = None

    def _device_layer(self, layer: LayerWeights) -> LayerWeights:
        """The layer's non-expert tensors, static on the device tier (experts handled apart)."""
        dev = {k: self.tier.alloc(v) for k, v in layer.static_tensors().items()}

        def expert(prefix):
            from .model import Expert
            return Expert(dev[f"{prefix}.w1"], dev[f"{prefix}.w2"], dev[f"{prefix}.w3"]) if f"{prefix}.w1" in dev else None

        return LayerWeights(dev["attn_norm"], dev["wq"], dev["wk"], dev["wv"], dev["wo"], dev["ffn_norm"],
                            router=dev.get("router"), router_bias=dev.get("router_bias"), shared=expert("shared"),
                            shared_gate=dev.get("shared_gate"), mlp=expert("mlp"))

    def close(self) -> None:
        self.tier.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # --- public -------------------------------------------------------------------------
    @torch.no_grad()
    def run(self, requests: list[Request], recorder: Optional[RoutingRecorder] = None) -> RunResult:
        """Execute every request (in rounds of ≤ N) and measure; ``recorder`` (optional)
        receives the expert ids of every router call of this run."""
        rounds = plan_rounds(requests, self.workload, self.policy.num_micro_batches, self.policy.micro_batch_size)
        self.recorder = recorder
        try:
            results = [self._run_round(r, k) for k, r in enumerate(rounds)]
        finally:
            self.recorder = None  # a later run records only when it is given a recorder
        return RunResult.combine(results, self.spec.num_layers, self.workload.gen_len, self.tier)

    # --- one round --------------------------------------------------------------------------
    def _run_round(self, groups: list[list[Request]], round_index: int) -> RoundResult:
        pad_to = self.workload.max_prompt_len if self.workload.padding else None
        mbs = [make_micro_batch(j, reqs, self.workload.gen_len, pad_to) for j, reqs in enumerate(groups)]
        for mb in mbs:
            to_device(mb, self.tier)
            mb.device["tokens"] = self.tier.to_device(mb.tokens)
            mb.device["positions"] = self.tier.to_device(mb.positions)
        self.mbs = mbs
        self.caches = [[KVCache(self.spec, mb, self.policy.kv_gpu_ratio, self.dtype, self.tier) for mb in mbs]
                       for _ in range(self.num_layers)]
        self.buf: dict = {}
        self.outputs = {j: {"tokens": [], "logits": []} for j in range(len(mbs))}
        self.pages: dict[int, list[Task]] = {}
        self.ffn_done: dict[int, list[Task]] = {}
        self.finish_tasks: dict[tuple, Task] = {}
        self.round = round_index

        t0, t1 = self._phase(self._launch_prefill)
        decode_steps = self.workload.gen_len - 1
        t2 = t3 = t1
        if decode_steps > 0:
            t2, t3 = self._phase(self._launch_decode)
        result = RoundResult(
            sequences=sum(mb.size for mb in mbs), prefill_s=t1 - t0, decode_s=t3 - t2, decode_steps=decode_steps,
            prefill_window=(t0, t1), decode_window=(t2, t3),
            layer_marks=self._layer_marks(), outputs=self._collect_outputs(),
            prompt_tokens=sum(mb.prompt_tokens for mb in mbs),
        )
        for row in self.caches:
            for cache in row:
                cache.release(self.tier)
        for mb in mbs:
            for t in mb.device.values():
                self.tier.free(t)
        self.buf.clear()
        return result

    def _phase(self, launch) -> tuple[float, float]:
        """Queue every task of a phase with the lanes held, release them, wait for all.
        Returns (start, end) wall-clock seconds."""
        self.submitted: list[Task] = []
        self.tier.hold()
        try:
            launch()
        finally:
            start = self.tier.release()
        return start, self.tier.wait(self.submitted)

    def _collect_outputs(self) -> dict[int, dict]:
        out = {}
        for j, mb in enumerate(self.mbs):
            rec = self.outputs[j]
            tokens = torch.stack(rec["tokens"], dim=1) if rec["tokens"] else torch.zeros(mb.size, 0, dtype=torch.long)
            logits = torch.stack(rec["logits"], dim=1) if rec["logits"] else None
            for k, req in enumerate(mb.requests):
                out[req.rid] = {"tokens": tokens[k].tolist(), "logits": None if logits is None else logits[k]}
        return out

    def _layer_marks(self) -> list[float]:
        """End time of each decode layer (all micro-batches), in execution order."""
        keys = sorted(k for k in self.finish_tasks if k[0] == "decode")
        ends: dict[tuple, float] = {}
        for key in keys:
            _, s, i, _j = key
            ends[(s, i)] = max(ends.get((s, i), 0.0), self.finish_tasks[key].end_s)
        return [ends[k] for k in sorted(ends)]

    # --- helpers ------------------------------------------------------------------------------
    def _submit(self, lane: str, name: str, fn, deps=(), **args) -> Task:
        args.setdefault("round", self.round)
        task = self.tier.submit(lane, name, fn, deps, **args)
        self.submitted.append(task)
        return task

    def _layer_of(self, g: int) -> int:
        return g % self.num_layers

    def _total_layer_runs(self) -> int:
        return self.num_layers * max(self.workload.gen_len, 1)

    def _phase_of(self, g: int) -> str:
        """Phase of layer-run g (the first L runs are the prefill)."""
        return "prefill" if g < self.num_layers else "decode"

    def _submit_pages(self, g: int, j: int) -> None:
        """W_PintoG(g, ·): the pages of layer-run g that ride along with micro-batch j."""
        layer = self._layer_of(g)
        if g >= self._total_layer_runs() or not self.experts.has_pages(layer):
            return
        m = len(self.mbs)
        pages = [j] if j < m - 1 else list(range(j, self.num_pages))
        deps = self.ffn_done.get(g - 2, [])  # the slot's previous user must be done
        for p in pages:
            fn = partial(self.experts.copy_page, layer, p, g % 2)
            task = self._submit("h2d", f"W_PintoG L{layer} page{p}", fn, deps, phase=self._phase_of(g - 1),
                                kind="weights", layer=layer, page=p, bytes=self.experts.page_bytes(layer, p))
            self.pages.setdefault(g, []).append(task)

    # --- prefill ----------------------------------------------------------------------------
    def _launch_prefill(self) -> list[Task]:
        tasks: list[Task] = []
        if self.experts.has_pages(0):
            for p in range(self.num_pages):
                self._submit_pages_prologue(0, p)
        offload: dict[int, Task] = {}
        for i in range(self.num_layers):
            for j in range(len(self.mbs)):
                load = None
                if i > 0:
                    load = self._submit("h2d", f"LoadH prefill L{i} mb{j}", partial(self._load_hidden, j),
                                        [offload[j]], phase="prefill", layer=i, mb=j)
                self._submit_pages(i + 1, j)
                layer = self._submit("gpu", f"Prefill L{i} mb{j}", partial(self._prefill_layer, i, j),
                                     [load, *self.pages.get(i, [])], phase="prefill", layer=i, mb=j)
                finish = self._ffn_tail(("prefill", 0, i, j), i, j, layer, i)
                self.ffn_done.setdefault(i, []).append(finish)
                tasks.append(self._submit("d2h", f"StoreKV prefill L{i} mb{j}", partial(self._store_prefill_kv, i, j),
                                          [finish], phase="prefill", layer=i, mb=j))
                if i < self.num_layers - 1:
                    offload[j] = self._submit("d2h", f"OffloadH prefill L{i} mb{j}", partial(self._offload_hidden, j),
                                              [finish], phase="prefill", layer=i, mb=j)
                else:
                    head = self._submit("gpu", f"Head prefill mb{j}", partial(self._prefill_head, j), [finish],
                                        phase="prefill", layer=i, mb=j)
                    tasks.append(self._submit("d2h", f"Collect step0 mb{j}", partial(self._collect, 0, j), [head],
                                              phase="prefill", mb=j))
        tasks.extend(t for ts in self.pages.values() for t in ts)
        return tasks

    def _submit_pages_prologue(self, g: int, p: int) -> None:
        layer = self._layer_of(g)
        task = self._submit("h2d", f"W_PintoG L{layer} page{p}", partial(self.experts.copy_page, layer, p, g % 2),
                            phase="prefill", kind="weights", layer=layer, page=p, bytes=self.experts.page_bytes(layer, p))
        self.pages.setdefault(g, []).append(task)

    def _load_hidden(self, j: int) -> None:
        self.buf[("x", j)] = self.tier.to_device(self.buf.pop(("xh", j)))

    def _offload_hidden(self, j: int) -> None:
        self.buf[("xh", j)] = self.tier.to_host(self.buf.pop(("x", j)))

    def _prefill_layer(self, i: int, j: int) -> None:
        """One layer of prefill for micro-batch j on the device tier (packed tokens)."""
        mb, layer = self.mbs[j], self.device_weights.layers[i]
        x = self.buf.pop(("x", j)) if i > 0 else self.embed[mb.device["tokens"]]
        q, k, v = qkv(self.spec, layer, x, mb.device["positions"])
        attn = self._prefill_attention(mb, q, k, v)
        del q
        self._write_prefill_device_kv(i, j, k, v)
        self.buf[("kv", i, j)] = (k, v)
        self._post_attention(i, j, x, attn, g=i, key=("prefill", 0, i, j))

    def _prefill_attention(self, mb: MicroBatch, q, k, v) -> torch.Tensor:
        """Causal attention of each sequence over its own (non-pad) tokens."""
        out = torch.empty_like(q)
        for idx, off in enumerate(mb.offsets):
            length, pad = int(mb.slots[idx]), int(mb.pads[idx])
            rows = torch.arange(length, device=q.device)
            mask = (rows[None, :] <= rows[:, None]) & ((rows[None, :] >= pad) | (rows[None, :] == rows[:, None]))
            part = slice(off, off + length)
            res = ops.attend(q[part].transpose(0, 1)[None], k[part].transpose(0, 1)[None],
                             v[part].transpose(0, 1)[None], mask[None])
            out[part] = res[0].transpose(0, 1)
        return out.reshape(q.shape[0], -1)

    def _write_prefill_device_kv(self, i: int, j: int, k, v) -> None:
        cache, mb = self.caches[i][j], self.mbs[j]
        if not cache.device_slots:
            return
        for idx, off in enumerate(mb.offsets):
            keep = min(cache.device_slots, int(mb.slots[idx]))
            cache.dev_k[idx, :keep] = k[off: off + keep]
            cache.dev_v[idx, :keep] = v[off: off + keep]

    def _store_prefill_kv(self, i: int, j: int) -> None:
        """KV offload (d2h): the host part of every sequence's prompt slots."""
        k, v = self.buf.pop(("kv", i, j))
        cache, mb = self.caches[i][j], self.mbs[j]
        d = cache.device_slots
        for idx, off in enumerate(mb.offsets):
            length = int(mb.slots[idx])
            if length > d:
                self.tier.to_host(k[off + d: off + length], out=cache.host_k[idx, : length - d])
                self.tier.to_host(v[off + d: off + length], out=cache.host_v[idx, : length - d])

    def _prefill_head(self, j: int) -> None:
        mb = self.mbs[j]
        x = self.buf.pop(("x", j))
        last = torch.tensor([off + int(n) - 1 for off, n in zip(mb.offsets, mb.slots)], device=x.device)
        self._head(j, x[last], step=0)

    # --- shared PostAttn ------------------------------------------------------------------
    def _post_attention(self, i: int, j: int, x, attn, g: int, key: tuple) -> None:
        """O projection, router, shared/dense MLP and — experts on the device — the routed
        experts from static weights or the slot of layer-run g."""
        layer = self.device_weights.layers[i]
        h, normed, partial_out, ids, weights = post_attention_static(self.spec, layer, x, attn)
        del x, attn
        if self.recorder is not None and layer.router is not None:  # one-expert layers route nowhere
            phase, step = key[0], key[1]
            self.recorder.record(i, phase, self.round, step, self.mbs[j], ids)
        h = h + partial_out
        del partial_out
        if ids is not None and not self.policy.ffn_on_gpu:
            self.buf[("ffn_in", key)] = (normed, ids, weights)
            self.buf[("h", key)] = h
            return
        if ids is not None:
            slot = g % 2
            h = h + ops.routed_experts(normed, ids, weights, lambda e: self.experts.device_expert(i, slot, e))
        self._finish(key, j, h)

    def _ffn_tail(self, key: tuple, i: int, j: int, post: Task, g: int) -> Task:
        """With experts on the CPU: router output → host, CPU experts, result → device, merge.
        Returns the task after which micro-batch j's layer output is ready."""
        if not self.is_moe[i] or self.policy.ffn_on_gpu:
            self.finish_tasks[key] = post
            return post
        names = dict(phase=key[0], layer=i, mb=j, step=key[1])
        out = self._submit("d2h", f"FFNInToCPU L{i} mb{j}", partial(self._ffn_to_host, key), [post], **names)
        cpu = self._submit("cpu", f"CPUExperts L{i} mb{j}", partial(self._cpu_experts, key, i), [out], **names)
        back = self._submit("h2d", f"FFNOutToGPU L{i} mb{j}", partial(self._ffn_to_device, key), [cpu], **names)
        merge = self._submit("gpu", f"Merge L{i} mb{j}", partial(self._merge_ffn, key, j), [back, post], **names)
        self.finish_tasks[key] = merge
        return merge

    def _ffn_to_host(self, key) -> None:
        normed, ids, weights = self.buf.pop(("ffn_in", key))
        self.buf[("ffn_in_h", key)] = tuple(self.tier.to_host(t) for t in (normed, ids, weights))

    def _cpu_experts(self, key, i: int) -> None:
        normed, ids, weights = self.buf.pop(("ffn_in_h", key))
        self.buf[("ffn_out_h", key)] = ops.routed_experts(normed, ids, weights, lambda e: self.experts.host_expert(i, e))

    def _ffn_to_device(self, key) -> None:
        self.buf[("ffn_out", key)] = self.tier.to_device(self.buf.pop(("ffn_out_h", key)))

    def _merge_ffn(self, key, j: int) -> None:
        h = self.buf.pop(("h", key)) + self.buf.pop(("ffn_out", key))
        self._finish(key, j, h)

    def _finish(self, key: tuple, j: int, h) -> None:
        """The layer output of micro-batch j: next layer's input, or (last decode layer) the
        lm_head, greedy token and the next step's embedding."""
        phase, step, i, _ = key
        if phase == "prefill":
            self.buf[("x", j)] = h
        elif i == self.num_layers - 1:
            self.buf[("last", j)] = h
        else:
            self.buf[("hid", j)] = h

    def _decode_head(self, s: int, j: int) -> None:
        self._head(j, self.buf.pop(("last", j)), s)

    def _submit_head(self, s: int, j: int, finish: Task, **names) -> Task:
        """lm_head + greedy token + next embedding after the last layer (its own device task,
        so that the per-layer latency can leave it out), then the host copy of the outputs."""
        head = self._submit("gpu", f"Head step{s} mb{j}", partial(self._decode_head, s, j), [finish], **names)
        self.finish_tasks[("decode", s, self.num_layers - 1, j)] = head
        self._submit("d2h", f"Collect step{s} mb{j}", partial(self._collect, s, j), [head], **names)
        return head

    def _head(self, j: int, x, step: int) -> None:
        logits = final_logits(self.spec, self.device_weights, x)
        tokens = logits.argmax(dim=-1)
        self.buf[("hid", j)] = self.embed[tokens]
        self.buf[("out", step, j)] = (tokens, logits if self.keep_logits else None)

    def _collect(self, step: int, j: int) -> None:
        tokens, logits = self.buf.pop(("out", step, j))
        self.outputs[j]["tokens"].append(self.tier.to_host(tokens))
        if logits is not None:
            self.outputs[j]["logits"].append(self.tier.to_host(logits))

    # --- decode -----------------------------------------------------------------------------
    def _flat(self):
        """(step, layer, micro-batch) in launch order for decode steps 1..gen−1."""
        m = len(self.mbs)
        return [(s, i, j) for s in range(1, self.workload.gen_len) for i in range(self.num_layers) for j in range(m)]

    def _launch_decode(self) -> list[Task]:
        if self.policy.attn_on_gpu:
            return self._launch_decode_gpu_attention()
        return self._launch_decode_cgopipe()

    def _g(self, s: int, i: int) -> int:
        return s * self.num_layers + i

    def _launch_decode_cgopipe(self) -> list[Task]:
        """Algorithm 1 (CGOPipe): attention on the CPU, launched two micro-batches ahead."""
        flat, m = self._flat(), len(self.mbs)
        ahead = min(LOOKAHEAD, m)
        tasks: list[Task] = []
        pre: dict[int, Task] = {}
        attn: dict[int, Task] = {}

        def launch_attention(f):
            s, i, j = flat[f]
            names = dict(phase="decode", step=s, layer=i, mb=j)
            prev = self.finish_tasks.get(("decode", *flat[f - m])) if f >= m else None
            pre[f] = self._submit("gpu", f"PreAttn L{i} mb{j}", partial(self._pre_attn, f, s, i, j), [prev], **names)
            qkv_h = self._submit("d2h", f"OffloadQKV L{i} mb{j}", partial(self._offload_qkv, f), [pre[f]], **names)
            attn[f] = self._submit("cpu", f"CPUAttn L{i} mb{j}", partial(self._cpu_attention, f, s, i, j), [qkv_h], **names)

        for f in range(ahead):
            launch_attention(f)
        for f, (s, i, j) in enumerate(flat):
            names = dict(phase="decode", step=s, layer=i, mb=j)
            load = self._submit("h2d", f"LoadH L{i} mb{j}", partial(self._load_attn_out, f), [attn[f]], **names)
            g = self._g(s, i)
            self._submit_pages(g + 1, j)
            post = self._submit("gpu", f"PostAttn L{i} mb{j}", partial(self._post_attn_decode, f, s, i, j),
                                [load, pre[f], *self.pages.get(g, [])], **names)
            finish = self._ffn_tail(("decode", s, i, j), i, j, post, g)
            self.ffn_done.setdefault(g, []).append(finish)
            if i == self.num_layers - 1:
                self._submit_head(s, j, finish, **names)
            if f + ahead < len(flat):
                launch_attention(f + ahead)
        tasks.extend(self.finish_tasks[("decode", *k)] for k in flat)
        tasks.extend(t for ts in self.pages.values() for t in ts)
        return tasks

    def _pre_attn(self, f: int, s: int, i: int, j: int) -> None:
        """PreAttn: RMSNorm + QKV (+ RoPE) on the device; packed [b, q|k|v] for D1."""
        mb, layer = self.mbs[j], self.device_weights.layers[i]
        x = self.buf[("hid", j)]
        q, k, v = qkv(self.spec, layer, x, mb.device["prompt_lens"] + (s - 1))
        b = x.shape[0]
        self.buf[("qkv", f)] = torch.cat([q.reshape(b, -1), k.reshape(b, -1), v.reshape(b, -1)], dim=1)

    def _offload_qkv(self, f: int) -> None:
        """D1: QKV device → host."""
        self.buf[("qkv_h", f)] = self.tier.to_host(self.buf.pop(("qkv", f)))

    def _split_qkv(self, packed):
        spec, b = self.spec, packed.shape[0]
        nq, nkv, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
        q, k, v = torch.split(packed, [nq * d, nkv * d, nkv * d], dim=1)
        return q.reshape(b, nq, d), k.reshape(b, nkv, d), v.reshape(b, nkv, d)

    def _cpu_attention(self, f: int, s: int, i: int, j: int) -> None:
        """CPUAttn: append the new K/V to the host cache, attend over the valid slots."""
        mb, cache = self.mbs[j], self.caches[i][j]
        q, k, v = self._split_qkv(self.buf.pop(("qkv_h", f)))
        slots = mb.decode_slots(s)
        rows = torch.arange(mb.size)
        cache.host_k[rows, slots] = k
        cache.host_v[rows, slots] = v
        upto = int(slots.max()) + 1
        cols = torch.arange(upto)
        mask = mb.valid[:, :upto] & (cols[None, :] <= slots[:, None])
        out = ops.attend(q[:, :, None, :], cache.host_k[:, :upto].transpose(1, 2), cache.host_v[:, :upto].transpose(1, 2),
                         mask[:, None, :])
        self.buf[("ao_h", f)] = out.reshape(mb.size, -1)

    def _load_attn_out(self, f: int) -> None:
        """D2: attention output host → device."""
        self.buf[("ao", f)] = self.tier.to_device(self.buf.pop(("ao_h", f)))

    def _post_attn_decode(self, f: int, s: int, i: int, j: int) -> None:
        x = self.buf.pop(("hid", j))
        self._post_attention(i, j, x, self.buf.pop(("ao", f)), g=self._g(s, i), key=("decode", s, i, j))

    # --- decode with attention on the device (FlexGen S4 order) -------------------------------
    def _launch_decode_gpu_attention(self) -> list[Task]:
        """Attention on the device tier: the host part of the next micro-batch's KV cache is
        prefetched (D4) while the current one computes; new K/V of host slots go back."""
        flat, m, per_step = self._flat(), len(self.mbs), self.num_layers * len(self.mbs)
        tasks: list[Task] = []
        loads: dict[int, Task] = {}
        stores: dict[int, Task] = {}
        layers: dict[int, Task] = {}

        def prefetch(f):
            s, i, j = flat[f]
            deps = [stores.get(f - per_step), layers.get(f - 2)]
            loads[f] = self._submit("h2d", f"LoadKV L{i} mb{j}", partial(self._load_kv, f, s, i, j), deps,
                                    phase="decode", step=s, layer=i, mb=j)

        prefetch(0)
        for f, (s, i, j) in enumerate(flat):
            names = dict(phase="decode", step=s, layer=i, mb=j)
            if f + 1 < len(flat):
                prefetch(f + 1)
            g = self._g(s, i)
            self._submit_pages(g + 1, j)
            prev = self.finish_tasks.get(("decode", *flat[f - m])) if f >= m else None
            layers[f] = self._submit("gpu", f"Layer L{i} mb{j}", partial(self._gpu_attn_layer, f, s, i, j),
                                     [loads[f], prev, *self.pages.get(g, [])], **names)
            stores[f] = self._submit("d2h", f"StoreKV L{i} mb{j}", partial(self._store_new_kv, f, s, i, j),
                                     [layers[f]], **names)
            tasks.append(stores[f])
            finish = self._ffn_tail(("decode", s, i, j), i, j, layers[f], g)
            self.ffn_done.setdefault(g, []).append(finish)
            if i == self.num_layers - 1:
                self._submit_head(s, j, finish, **names)
        tasks.extend(self.finish_tasks[("decode", *k)] for k in flat)
        tasks.extend(t for ts in self.pages.values() for t in ts)
        return tasks

    def _load_kv(self, f: int, s: int, i: int, j: int) -> None:
        """D4: the host part of (layer i, micro-batch j)'s cache → a device staging tensor,
        with room for this step's token."""
        mb, cache = self.mbs[j], self.caches[i][j]
        upto = int(mb.decode_slots(s).max()) + 1
        host_upto = upto - cache.device_slots
        if host_upto <= 0:
            self.buf[("stage", f)] = None
            return
        self.buf[("stage", f)] = (self.tier.to_device(cache.host_k[:, :host_upto]),
                                  self.tier.to_device(cache.host_v[:, :host_upto]))

    def _gpu_attn_layer(self, f: int, s: int, i: int, j: int) -> None:
        """PreAttn + attention over [device slots | staged host slots] + PostAttn, on the device."""
        mb, cache, layer = self.mbs[j], self.caches[i][j], self.device_weights.layers[i]
        x = self.buf.pop(("hid", j))
        q, k, v = qkv(self.spec, layer, x, mb.device["prompt_lens"] + (s - 1))
        slots = mb.device["slots"] + (s - 1)
        upto = int(mb.decode_slots(s).max()) + 1
        d = cache.device_slots
        rows = torch.arange(mb.size, device=x.device)
        on_dev = slots < d
        parts_k, parts_v = [], []
        if d:
            cache.dev_k[rows[on_dev], slots[on_dev]] = k[on_dev]
            cache.dev_v[rows[on_dev], slots[on_dev]] = v[on_dev]
            parts_k.append(cache.dev_k[:, : min(d, upto)])
            parts_v.append(cache.dev_v[:, : min(d, upto)])
        stage = self.buf.pop(("stage", f))
        if stage is not None:
            sk, sv = stage
            off = ~on_dev
            sk[rows[off], slots[off] - d] = k[off]
            sv[rows[off], slots[off] - d] = v[off]
            parts_k.append(sk)
            parts_v.append(sv)
        keys = parts_k[0] if len(parts_k) == 1 else torch.cat(parts_k, dim=1)
        values = parts_v[0] if len(parts_v) == 1 else torch.cat(parts_v, dim=1)
        del parts_k, parts_v, stage
        cols = torch.arange(upto, device=x.device)
        mask = mb.device["valid"][:, :upto] & (cols[None, :] <= slots[:, None])
        out = ops.attend(q[:, :, None, :], keys.transpose(1, 2), values.transpose(1, 2), mask[:, None, :])
        del keys, values
        self.buf[("newkv", f)] = (k, v)
        self._post_attention(i, j, x, out.reshape(mb.size, -1), g=self._g(s, i), key=("decode", s, i, j))

    def _store_new_kv(self, f: int, s: int, i: int, j: int) -> None:
        """The new token's K/V of host-resident slots back to the host cache."""
        mb, cache = self.mbs[j], self.caches[i][j]
        k, v = self.buf.pop(("newkv", f))
        slots = mb.decode_slots(s)
        host = slots >= cache.device_slots
        if not bool(host.any()):
            return
        kh, vh = self.tier.to_host(k), self.tier.to_host(v)
        rows = torch.arange(mb.size)[host]
        cache.host_k[rows, slots[host] - cache.device_slots] = kh[host]
        cache.host_v[rows, slots[host] - cache.device_slots] = vh[host]


def run_plan_once(spec: ModelSpec, weights: ModelWeights, policy: Policy, workload: Workload,
                  requests: list[Request], *, placement: Optional[Placement] = None, device: str = "auto",
                  track_memory: bool = True, keep_logits: bool = True, lanes: str = "auto") -> RunResult:
    """Build an executor, run ``requests``, close it."""
    with PlanExecutor(spec, weights, policy, workload, placement=placement, device=device,
                      track_memory=track_memory, keep_logits=keep_logits, lanes=lanes) as ex:
        return ex.run(requests)
