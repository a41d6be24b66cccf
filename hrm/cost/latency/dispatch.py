"""Host overhead per operation as lane terms (the α of the α-β model).

A measured profile may carry a fixed cost per task and per operator call
(:class:`hrm.machine.hardware.Dispatch`: kernel launches and stream syncs on a GPU,
Python/torch dispatch on an emulated tier). Each lane then also pays, per micro-batch, the
α of the tasks the schedule puts on it (:func:`decode_dispatch`, :func:`prefill_dispatch`)
— still affine, so the solver carries it through the same coefficients. Without it
(datasheet profiles) every α is 0 and the lanes are the plain roofline of eq. 14.

A GPU host without a measured dispatch charges instead the engine's counted host operator
calls (:mod:`hrm.machine.launches`) at the machine's per-op costs
(:func:`launch_overhead_s`, added by :func:`with_launches`).
"""

from __future__ import annotations

import numpy as np

from .. import costs
from ...engines.engine import Engine
from ...machine.launches import (charged, cpu_issue_s, host_issue_s, layer_host_issue_s, layer_sync_bubbles_s,
    sync_bubbles_s)
from ...machine.rates import Rates
from ...model.spec import ModelSpec
from .lane import Lane, sum_lanes


def dispatch_alpha_s(dispatch, name: str) -> float:
    """Seconds of one α of a Dispatch (its field ``name``; 0 without a Dispatch)."""
    return float(getattr(dispatch, name)) if dispatch is not None else 0.0


def device_attention_alpha_s(dispatch) -> float:
    """Seconds of attention's α on the device tier (:meth:`hrm.machine.hardware.Dispatch.device_attention`;
    0 without a Dispatch)."""
    return dispatch.device_attention() if dispatch is not None else 0.0


def experts_call_dispatch_s(model: ModelSpec, dispatch, tokens):
    """α of one routed-expert call for ``tokens`` tokens: the call, plus one expert
    invocation per distinct expert touched (the loop runs over the experts the router
    picked, E = ne·(1 − (1 − k/ne)^tokens) of them in expectation)."""
    return (dispatch_alpha_s(dispatch, "experts_call_s")
            + costs.expected_distinct_experts(model, tokens) * dispatch_alpha_s(dispatch, "expert_s"))


def post_attn_dispatch_s(model: ModelSpec, dispatch, moe: bool = True) -> float:
    """α of post-attention: the call, plus one expert invocation for a shared expert (MoE
    layer) or the dense MLP (dense layer)."""
    extra = 1.0 if (not moe or model.shared_intermediate_size) else 0.0
    return dispatch_alpha_s(dispatch, "post_attn_s") + extra * dispatch_alpha_s(dispatch, "expert_s")


def decode_dispatch(model: ModelSpec, rates: Rates, micro_batch, attn, ffn, moe: bool = True) -> dict[str, tuple]:
    """Per micro-batch α of each lane in a decode layer, as (always, × (1 − r_c)): the tasks
    of the schedule (paper Algorithm 1; FlexGen S4 order with attention on the GPU) and
    the operator calls and transfers inside them.

    - gpu: PreAttn and PostAttn (one fused task when attention is on the GPU), the expert
      loop when the experts run there, the merge of CPU experts' output otherwise;
    - cpu: CPU attention; CPU experts;
    - d2h: D1 QKV (attention on the GPU: the new token's K and V, 2 copies and the cache
      indexing × (1 − r_c)); the 3 router outputs to the CPU experts;
    - h2d: D2 hidden (GPU attention: the K and V prefetch, 2 copies and the cache indexing
      × (1 − r_c)); the CPU
      experts' output; one weight page per micro-batch while experts run on the GPU
      (exact for r_w < 1; with r_w = 1 nothing is paged and this overcounts n page tasks).
    """
    g, c = rates.gpu_dispatch, rates.cpu_dispatch
    task_g, copy_g, task_c = dispatch_alpha_s(g, "task_s"), dispatch_alpha_s(g, "copy_s"), dispatch_alpha_s(c, "task_s")
    mu = np.asarray(micro_batch, dtype=float)
    ffn_g = experts_call_dispatch_s(model, g, mu) if moe else 0.0
    ffn_c = experts_call_dispatch_s(model, c, mu) if moe else 0.0
    routed = 1.0 if moe else 0.0
    device_attention = device_attention_alpha_s(g)
    gpu = ((2 - attn) * task_g + dispatch_alpha_s(g, "pre_attn_s") + post_attn_dispatch_s(model, g, moe)
           + attn * device_attention + ffn * ffn_g + routed * (1 - ffn) * task_g)
    cpu = (1 - attn) * (task_c + dispatch_alpha_s(c, "attention_s")) + routed * (1 - ffn) * (task_c + ffn_c)
    d2h = (1 - attn) * (task_g + copy_g) + attn * task_g + routed * (1 - ffn) * (task_g + 3 * copy_g)
    h2d = ((1 - attn) * (task_g + copy_g) + attn * task_g + routed * (1 - ffn) * (task_g + copy_g)
           + routed * ffn * (task_g + copy_g))
    kv_load = attn * (2 * copy_g + dispatch_alpha_s(g, "kv_load_s"))
    kv_store = attn * (2 * copy_g + dispatch_alpha_s(g, "kv_store_s"))
    return {"gpu": (gpu, 0.0), "cpu": (cpu, 0.0), "h2d": (h2d, kv_load), "d2h": (d2h, kv_store)}


def prefill_dispatch(model: ModelSpec, rates: Rates, micro_batch, prompt_len, moe: bool = True) -> dict:
    """Per micro-batch α of a prefill layer: one device task (pre-attention, causal
    attention once per sequence, post-attention, the expert loop over μ·s tokens), the
    hidden states parked on the host and loaded back (a copy each way), the prompt's KV
    written to the host (K and V of each sequence: 2μ copies), one weight page."""
    g = rates.gpu_dispatch
    if g is None:
        return {"gpu": 0.0, "h2d": 0.0, "d2h": 0.0}
    mu = np.asarray(micro_batch, dtype=float)
    task, copy = dispatch_alpha_s(g, "task_s"), dispatch_alpha_s(g, "copy_s")
    ffn = experts_call_dispatch_s(model, g, mu * prompt_len) if moe else 0.0
    gpu = (task + dispatch_alpha_s(g, "pre_attn_s") + mu * dispatch_alpha_s(g, "attention_s")
           + post_attn_dispatch_s(model, g, moe) + ffn)
    h2d = task + copy + ((task + copy) if moe else 0.0)
    d2h = 2 * task + copy + 2 * mu * copy
    return {"gpu": gpu, "h2d": h2d, "d2h": d2h}


def launch_overhead_s(model: ModelSpec, rates: Rates, engine: Engine, tokens, moe: bool = True) -> dict[str, Lane]:
    """The engine's host operator calls (:mod:`hrm.machine.launches`) in one layer of micro-batches of
    ``tokens`` tokens, as lanes: ``host`` — the host thread issuing its kernels and copies
    (a lane of its own: the GPU runs them asynchronously, so the layer takes at least the
    issue time); ``gpu`` — the GPU's idle time after each host sync; ``cpu`` — the dispatch
    of ops on CPU tensors (paid by the thread that computes CPU attention). Per micro-batch,
    plus once per layer the weight fetches' copies and syncs. {} where not charged (a
    measured dispatch, a CPU-only host, an engine without counts)."""
    ops, op = engine.launches, rates.op_costs
    if not charged(ops, op):
        return {}
    experts = costs.expected_distinct_experts(model, tokens) if moe else 0.0 * np.asarray(tokens, dtype=float)
    return {"host": Lane("host", host_issue_s(ops, op, experts), 0.0, 0.0, layer_host_issue_s(ops, op)),
            "gpu": Lane("gpu", sync_bubbles_s(ops, op, experts), 0.0, 0.0, layer_sync_bubbles_s(ops, op)),
            "cpu": Lane("cpu", cpu_issue_s(ops, op) + 0.0 * experts)}


def with_launches(lanes: dict[str, Lane], launch: dict[str, Lane], zero) -> dict[str, Lane]:
    """``lanes`` with the launch overhead's lanes added (the host lane new, the others summed)."""
    out = dict(lanes)
    for name, lane in launch.items():
        lane = Lane(name, lane.per_micro_batch_s + zero, lane.per_micro_batch_kv_cpu_s + zero,
                    lane.per_layer_offloaded_weights_s + zero, lane.per_layer_s + zero)
        out[name] = sum_lanes(name, [out[name], lane]) if name in out else lane
    return out
