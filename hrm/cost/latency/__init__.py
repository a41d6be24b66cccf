"""Per-layer latency of a schedule (paper §4.2, eqs. 12–14) as affine *lanes*.

Each resource (GPU, CPU, CPU→GPU link, GPU→CPU link) accumulates, over the n micro-batches
of a layer, the time of its tasks; a task's time is max(FLOPs / FLOP/s, bytes / bandwidth)
(eq. 14, the roofline of eq. 8). For a fixed micro-batch size μ and placement (A_g, F_g) a
resource's time is affine in the remaining decisions (n, 1 − r_c, 1 − r_w); a schedule
combines resources into lanes that run concurrently, and the layer time is the max over
lanes (eq. 12). The solver uses these same coefficients, so the formulas exist once.

Modules (this package re-exports nothing: import a name from the module that defines it):

- :mod:`hrm.cost.latency.lane` — the affine :class:`~hrm.cost.latency.lane.Lane`, its sum and the max over lanes;
- :mod:`hrm.cost.latency.ops` — one operator's time on a tier (eq. 14: kernels, quantized families, ggml);
- :mod:`hrm.cost.latency.transfers` — transfer paths: link and DRAM rates, weight and KV paths, all-reduces;
- :mod:`hrm.cost.latency.offload` — offloaded weights: bytes crossing per load, CPU experts, expert-cache misses;
- :mod:`hrm.cost.latency.dispatch` — host overhead per operation: a profile's dispatch α, an engine's launches;
- :mod:`hrm.cost.latency.workspace_attention` — FlexGen's CPU attention: its fp32-workspace host passes per slot;
- :mod:`hrm.cost.latency.decode` — a decode layer's tasks per micro-batch and the resources they sum to;
- :mod:`hrm.cost.latency.prefill` — a prefill layer's resources;
- :mod:`hrm.cost.latency.lanes` — a schedule's lanes from resources, sync and disk lanes, the layer kinds.
"""
