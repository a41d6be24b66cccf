"""Reference PyTorch runtime (SPEC §8): executes a plan and measures it.

model (decoder + plain forward), ops (shared kernels), device (device tier, lanes, memory),
experts (paged expert weights, double buffer), batch (slots, KV cache), requests
(Algorithm 2), executor (prefill + CGOPipe decode, Algorithm 1), measure, trace (Chrome
JSON), validate (model vs runtime), cli (``hrm run``), cli_validate (``hrm validate``).
torch is imported by the submodules only.
"""
