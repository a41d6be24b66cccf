"""Reference PyTorch runtime (docs/model.md §8): executes a plan and measures it.

model (decoder + plain forward), ops (shared kernels), device (device tier, lanes, memory),
experts (paged expert weights, double buffer), batch (slots, KV cache), requests
(Algorithm 2), executor (prefill + CGOPipe decode, Algorithm 1), measure (timing a run), trace (Chrome
JSON), validate (model vs runtime), report (measured vs predicted), resolve (plan vs
hardware and model hashes), routing_trace (expert activations). The commands ``hrm run``
and ``hrm validate`` are :mod:`hrm_cli.run` and :mod:`hrm_cli.validate`.
torch is imported by the submodules only.
"""
