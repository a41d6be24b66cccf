"""The Hierarchical Roofline Model's costs: each equation in one place.

- :mod:`hrm.cost.costs`: FLOPs and bytes of every operator (docs/model.md §4.1);
- :mod:`hrm.cost.roofline`: the roofline and the hierarchical roofline (paper §3);
- :mod:`hrm.cost.latency`: per-layer latency of a schedule as affine lanes (paper §4.2), one module per concern;
- :mod:`hrm.cost.ggml_cells`: the KV cells llama.cpp's CPU flash attention computes: its query tiles, a unified cache's cells;
- :mod:`hrm.cost.ggml_cpu`: llama.cpp's CPU backend, from the host's measured ggml kernels;
- :mod:`hrm.cost.ggml_elementwise`: the elementwise nodes of llama.cpp's CPU layer graphs;
- :mod:`hrm.cost.ggml_server`: llama-server's loop under a load of requests, over the CPU step model;
- :mod:`hrm.cost.memory`: GPU and CPU peak memory as affine forms (docs/model.md §4.5);
- :mod:`hrm.cost.throughput`: end-to-end time and throughput of a batch.
"""
