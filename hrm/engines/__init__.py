"""The engines wing: how each real system executes a plan, as data and rules.

- :mod:`hrm.engines.engine`: the engine spec, its registry (``hrm/data/engines/*.yaml``) and
  its mechanisms;
- :mod:`hrm.engines.schedules`: the schedules (lanes, overlap, launch order) as data;
- :mod:`hrm.engines.rules`: the registries of engine rules (policy choosers);
- :mod:`hrm.engines.flexgen`: FlexGen's weight placement;
- :mod:`hrm.engines.moe_lightning`: the MoE-Lightning server's own policy optimizer.

Adding an engine touches this folder: its YAML in ``hrm/data/engines/`` and, where it has code
of its own, one module here.
"""
