"""Measure a machine into a hardware profile (docs/model.md §7): ``hrm profile``
(:mod:`hrm_cli.profile`).

- :mod:`profiler.config`: what a run measures: sizes, repeats and the time budget (quick and full presets);
- :mod:`profiler.timing`: timing primitives: a timed op, a time budget, median and spread of repeats;
- :mod:`profiler.cpu`: host facts, STREAM copy/triad, matmul curves, GQA decode attention, host copies, disk;
- :mod:`profiler.gpu`: the device interface, its torch.cuda implementation and the GPU measurements;
- :mod:`profiler.emulation`: a CPU-only host's emulated device tier, with the runtime's own operators;
- :mod:`profiler.dispatch`: the fixed cost of a task and of an operator call on the reference runtime;
- :mod:`profiler.ggml_cpu`: ``--llama-cpp DIR``: llama.cpp's CPU kernels per ggml type, op and thread
  count, timed by the C++ probe ``ggml_kernels.cpp`` built against the user's tree;
- :mod:`profiler.build`: measurements -> :class:`hrm.machine.hardware.HardwareProfile`;
- :mod:`profiler.runner`: the budgeted run: every measurement in order, then the profile;
- :mod:`profiler.progress`: progress reporting (a no-op reporter, and a rich one on stderr);
- :mod:`profiler.compare`: ``--compare``: a measured profile next to a reference, field by field.

Programmatic use::

    from profiler.config import quick_config
    from profiler.runner import run_profile
    profile = run_profile(quick_config()).profile
"""
