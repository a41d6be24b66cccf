"""Engine limits the search and the estimate honour (issue 25): an engine's own cap on the
sequences it runs at once, and the memory a pinned policy may use (physical memory less the
engine's reserve), with ``hrm estimate`` exiting 3 when a policy does not fit it."""

from __future__ import annotations

import pytest

from conftest import call
from hrm.engines.engine import Engine, load_engine
from hrm.errors import HRMError
from hrm.estimate import estimate
from hrm.machine.hardware import load_hardware
from hrm.cost.memory import memory_limits, physical_limits
from hrm.model.spec import load_model
from hrm.model.options import ModelOptions
from hrm.policy import parse_policy
from hrm.units import GIB
from hrm.workload import make_workload
from solver.search import search


def _capped(limit: int) -> Engine:
    base = load_engine("ideal")
    return Engine.model_validate({**base.model_dump(), "name": "capped",
                                  "policy": {**base.policy.model_dump(), "max_batch_size": limit}})


def test_search_keeps_the_batch_within_the_engines_own_limit():
    hw, model, workload = load_hardware("l4"), load_model("mixtral"), make_workload("mtbench")
    free = search(hw, model, workload, engine="ideal", top=0)
    assert free.best.policy.batch_size > 256  # the cap below binds
    capped = search(hw, model, workload, engine=_capped(256), top=0)
    assert capped.best.policy.batch_size <= 256
    assert any("own limit" in note for note in capped.stats.notes)
    with pytest.raises(HRMError, match="at most 256"):
        search(hw, model, workload, engine=_capped(256), fixed={"batch_size": 300, "micro_batch_size": 300})
    with pytest.raises(HRMError, match="at most 256"):
        estimate(hw, model, workload, parse_policy("N=512,mu=64,attn=cpu,ffn=gpu,rw=0,rc=0"), engine=_capped(256))


def test_physical_limits_are_capacity_less_the_engines_reserve_by_hand():
    hw = load_hardware("2xt4")
    engine = Engine.model_validate({**load_engine("ideal").model_dump(), "name": "reserved",
                                    "memory": {**load_engine("ideal").memory.model_dump(), "gpu_reserved_gib": 0.5,
                                               "host_reserved_gib": 2.0}})
    limits = physical_limits(hw, engine)
    assert limits.gpu_bytes == pytest.approx(hw.gpu.memory_bytes * hw.gpu.count - 2 * 0.5 * GIB, rel=1e-12)
    assert limits.cpu_bytes == pytest.approx(hw.cpu.memory_bytes - 2.0 * GIB, rel=1e-12)
    planning = memory_limits(hw, ModelOptions())
    assert planning.gpu_bytes < limits.gpu_bytes and planning.cpu_bytes < limits.cpu_bytes


def _between_caps_and_physical(hw, model, workload, engine):
    """A policy above the planning caps but within physical memory less the reserve."""
    physical = physical_limits(hw, load_engine(engine))
    for n in range(1, 400):
        policy = parse_policy(f"N={64 * n},mu=64,attn=cpu,ffn=gpu,rw=0,rc=0")
        result = estimate(hw, model, workload, policy, engine=engine)
        if not result.feasible and result.fits(physical):
            return policy
        if not result.fits(physical):
            break
    pytest.skip("no batch falls between the caps and physical memory here")


def test_hrm_estimate_warns_above_the_caps_and_exits_3_beyond_physical_memory(capsys):
    hw, model, workload = load_hardware("l4"), load_model("mixtral"), make_workload("mtbench")
    policy = _between_caps_and_physical(hw, model, workload, "moe-lightning")
    code, out, err = call(capsys, "estimate", "--hw", "l4", "--model", "mixtral", "--engine", "moe-lightning",
                          "--policy", policy.short())
    assert code == 0 and "above the planning caps" in out
    too_big = f"N={policy.batch_size * 8},mu=64,attn=cpu,ffn=gpu,rw=0,rc=0"
    code, out, err = call(capsys, "estimate", "--hw", "l4", "--model", "mixtral", "--engine", "moe-lightning",
                          "--policy", too_big)
    assert code == 3 and "generation throughput" in out and len(err.strip().splitlines()) == 1
    assert "physical memory" in err


def test_search_of_a_fully_pinned_policy_checks_physical_memory(capsys):
    """--fix of every field is a pinned policy: it is held to physical memory less the
    engine's reserve, with a note when it is above the planning caps the search uses."""
    hw, model, workload = load_hardware("l4"), load_model("mixtral"), make_workload("mtbench")
    policy = _between_caps_and_physical(hw, model, workload, "moe-lightning")
    pins = [f"N={policy.batch_size}", f"mu={policy.micro_batch_size}", "attn=cpu", "ffn=gpu", "rw=0", "rc=0"]
    code, out, err = call(capsys, "search", "--hw", "l4", "--model", "mixtral", "--engine", "moe-lightning", "--fix",
                          *pins)
    assert code == 0 and "above the planning caps" in out
    code, out, err = call(capsys, "search", "--hw", "l4", "--model", "mixtral", "--engine", "moe-lightning", "--fix",
                          f"N={policy.batch_size}", f"mu={policy.micro_batch_size}", "attn=cpu", "ffn=gpu")
    assert code == 3  # not fully pinned: the planning caps hold, and nothing fits them at this N


@pytest.mark.parametrize("engine", ["llama.cpp", "llama.cpp-nkvo"])
def test_llama_server_plans_hold_its_slot_limit(engine):
    """llama-server runs at most LLAMA_MAX_SEQ = 256 sequences (src/llama-cparams.h:7): the
    engine file says so and the search never plans more."""
    assert load_engine(engine).policy.max_batch_size == 256
    result = search(load_hardware("l4"), load_model("mixtral"), make_workload("mtbench"), engine=engine, top=0)
    assert result.best.policy.batch_size <= 256
