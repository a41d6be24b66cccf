"""HRM: plan and explain Mixture-of-Experts inference on machines whose GPU memory is smaller
than the model, with a Hierarchical Roofline Model (docs/ARCHITECTURE.md).

The core, in wings by concept (each lists its modules in its own ``__init__``):

- ``model/``: the model being planned (spec, config.json, GGUF, quantized formats, routing);
- ``machine/``: the hardware profile and the rates it achieves;
- ``engines/``: how each real engine executes a plan, as data, and the policy space it runs;
- ``cost/``: the roofline costs, latency lanes, memory forms and throughput;
- ``pipelines/``: how a schedule turns a layer's work into time (lanes, expert level);
- ``analysis/``: explain, calibrate, validate against real runs, ``hrm fit``;
- ``export/``: plans as other engines' command lines, and back;
- ``plots/``: figures.

What every wing uses, and what joins them:

- :mod:`hrm.units`: units and dtype sizes;
- :mod:`hrm.bounds`: the plausible range of every input number;
- :mod:`hrm.errors`: user-facing errors and strict reading of input files;
- :mod:`hrm.progress`: progress of long steps, on standard error;
- :mod:`hrm.workload`: workloads and their presets;
- :mod:`hrm.policy`: the offloading policy and its rules;
- :mod:`hrm.problem`: a planning problem (hardware, model, workload, engine, limits, rates);
- :mod:`hrm.estimate`: the estimate of one policy;
- :mod:`hrm.plan`: the plan schema, loading, checking, atomic writes;
- :mod:`hrm.placement`: which static experts of which layers sit on the GPU.
"""
