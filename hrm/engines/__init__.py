"""The engines wing: how each real system executes a plan, and what it can run, as data and rules.

- :mod:`hrm.engines.engine`: the engine spec (its fields, kernels and policy space), its
  validation and its registry (``hrm/data/engines/*.yaml``);
- :mod:`hrm.engines.mechanisms`: the mechanism switch: fields set, a mechanism switched off to
  ideal's value (``--explain``), the mechanisms on, a command's flags applied;
- :mod:`hrm.engines.space`: the policy space an engine can run: placements, pins, fixed parts,
  batch limit, r_w snapped and its levels; a policy or pins checked against it;
- :mod:`hrm.engines.schedules`: the schedules (lanes, overlap, launch order) as data;
- :mod:`hrm.engines.rules`: the registries of engine rules (policy choosers, weight and KV levels);
- :mod:`hrm.engines.flexgen`: FlexGen's weight and KV placement;
- :mod:`hrm.engines.moe_lightning`: the MoE-Lightning server's own policy optimizer.

Adding an engine touches this folder: its YAML in ``hrm/data/engines/`` and, where it has code
of its own, one module here.
"""
