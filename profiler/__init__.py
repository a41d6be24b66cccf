"""Measure a machine into a hardware profile (docs/model.md §7): ``hrm profile``.

Modules: :mod:`profiler.timing` (timed ops, budget, median/spread), :mod:`profiler.cpu`
(STREAM copy/triad, matmul curves, GQA decode attention, disk), :mod:`profiler.gpu` (the
device interface, its torch.cuda implementation and the GPU measurements),
:mod:`profiler.ggml_cpu` (``--llama-cpp DIR``: llama.cpp's CPU kernels per ggml type, op and
thread count, with the C++ probe ``ggml_kernels.cpp`` built against the user's tree),
:mod:`profiler.build` (measurements -> HardwareProfile), :mod:`profiler.runner` (the
budgeted run), :mod:`hrm_cli.profile` (``hrm profile``). Programmatic use::

    from profiler.config import quick_config
    from profiler.runner import run_profile
    profile = run_profile(quick_config()).profile
"""
