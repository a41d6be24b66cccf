"""The registries of engine rules: code an engine YAML names by a rule name, because what the
engine does there is a computation of its own, not a field value.

- :data:`CHOOSERS` (an engine's ``policy.chosen_by``): engines that pick their own policy at
  launch. Some servers take no policy: at launch they run an optimizer of their own and serve
  what it returns (the MoE-Lightning artifact: ``fastmoe/backend/execution_engine.py:476-495``).
  HRM's search finds the best policy in such an engine's space, but the engine will run its
  own pick; a chooser reproduces that pick so ``hrm-search`` can show both. A chooser is a
  function ``(hw, model, workload) -> (Policy, notes)`` that raises a one-line HRMError when
  the engine would pick nothing (no GPU, a model it cannot serve);
- :data:`WEIGHT_LEVELS` (``policy.weights_levels``): the r_w an engine's weight placement can
  realise for a model (FlexGen's whole-tensor midpoint rule, :mod:`hrm.engines.flexgen`);
- :data:`KV_LEVELS` (``policy.kv_gpu_shares``): the r_c an engine's KV split can realise for a
  model at a micro-batch size (FlexGen's whole rows).

This module is a leaf of the engine: :mod:`hrm.engines.engine` validates those names against
these registries, so nothing here imports the engine, the estimate or the exporters.
"""

from __future__ import annotations

from typing import Callable

from pydantic import BaseModel, ConfigDict

from ..errors import HRMError
from ..policy import Policy
from ..units import GIB
from .flexgen import realisable_cache_shares, realisable_shares
from .moe_lightning import (ServerFlags, largest_feasible_count, micro_batch_sizes, optimizer_constants,
                            optimizer_inputs, server_choice, server_model)

#: what a chooser returns: the policy the engine will run and notes on the pick
ChooserPick = tuple[Policy, tuple[str, ...]]


class Chooser(BaseModel):
    """One engine's own policy optimizer: ``choose`` reproduces its pick, ``program`` is the
    command that runs it, ``source`` the lines it is read from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    choose: Callable[..., ChooserPick]
    program: str
    source: str


def moe_lightning_launch_flags(hw, workload) -> ServerFlags:
    """The launch flags ``hrm export --to moe-lightning`` prints for ``hw`` and ``workload``
    (hrm/export/moe_lightning.py ``server_flags`` calls this): the workload's lengths, the
    profile's CPU bandwidth in GiB/s to one decimal, one rank per GPU. No GPU: the defaults
    (the optimizer then refuses, one line)."""
    gpu = getattr(hw, "gpu", None)
    if gpu is None:
        return ServerFlags(avg_prompt_len=workload.prompt_len, gen_len=workload.gen_len)
    bandwidth_gib_s = round(hw.cpu.memory_bandwidth_gbps * 1e9 / GIB, 1)
    return ServerFlags(avg_prompt_len=workload.prompt_len, gen_len=workload.gen_len,
                       cpu_mem_bdw_gib_s=bandwidth_gib_s, tp_size=int(gpu.count))


#: the most (micro-batch size, count) candidates the chooser follows the server's optimizer
#: through (about 20 us each here; the artifact solves a CBC linear program for each at
#: launch). Mixtral on an L4 at mtbench's 77/128: 6,550; at prompt 8, gen 2: 131,646; a
#: model of a few MiB has millions (its search ends only when one micro-batch no longer fits)
MAX_OPTIMIZER_CANDIDATES = 200_000


def optimizer_candidates_bound(hw, model, workload, flags: ServerFlags, budget: int) -> int:
    """An upper bound of the candidates the server's optimizer visits: over the micro-batch
    sizes it tries, the most micro-batches of each that fit (its count loop may stop earlier,
    backend/optimizer.py:256-293), counted until the sum passes ``budget``."""
    m = server_model(model)
    s, n, server_hw = optimizer_inputs(hw, workload, flags)
    scaled = optimizer_constants(server_hw)
    total = 0
    for g in micro_batch_sizes():
        most = largest_feasible_count(m, scaled, s, n, g)
        total += most
        if most == 0 or total > budget:
            return total


def moe_lightning_optimizer_pick(hw, model, workload) -> ChooserPick:
    """The MoE-Lightning artifact server's pick (:func:`hrm.engines.moe_lightning.server_choice`)
    when launched with the flags an export prints; a one-line HRMError where its search is
    longer than :data:`MAX_OPTIMIZER_CANDIDATES`."""
    flags = moe_lightning_launch_flags(hw, workload)
    if optimizer_candidates_bound(hw, model, workload, flags, MAX_OPTIMIZER_CANDIDATES) > MAX_OPTIMIZER_CANDIDATES:
        raise HRMError(f"moe-lightning: the server's optimizer would weigh over {MAX_OPTIMIZER_CANDIDATES:,} "
                       f"(micro-batch size, count) candidates for {model.name} at prompt {flags.avg_prompt_len}, "
                       f"gen {flags.gen_len}, a linear program each at launch (fastmoe/backend/optimizer.py:256-293); "
                       "HRM does not follow it that far")
    choice = server_choice(hw, model, workload, flags)
    return choice.policy, choice.notes


#: engines' own policy optimizers, by the name an engine's ``policy.chosen_by`` gives
CHOOSERS: dict[str, Chooser] = {
    "moe-lightning-optimizer": Chooser(
        choose=moe_lightning_optimizer_pick, program="python -m fastmoe.serve.launch_server",
        source="caoshiyi/artifacts@6bc86009 fastmoe/backend/execution_engine.py:476-495, "
               "backend/optimizer.py:256-293"),
}


#: placement rules an engine's ``policy.weights_levels`` names: ``(model) -> r_w levels``, the
#: r_w the engine can realise for a model, as a share of what its ``offloaded_weights``
#: offloads (FlexGen: every layer's bytes)
WEIGHT_LEVELS: dict[str, Callable[..., tuple[float, ...]]] = {
    "flexgen-midpoint": realisable_shares,
}

#: KV split rules an engine's ``policy.kv_gpu_shares`` names: ``(model, micro_batch) -> r_c
#: levels``, the r_c the engine can realise for a model at a micro-batch size (FlexGen: whole
#: rows, a multiple of the query heads)
KV_LEVELS: dict[str, Callable[..., tuple[float, ...]]] = {
    "flexgen-rows": realisable_cache_shares,
}
