"""llama.cpp's llama-server as it runs (issue 25): slots (-np <= 256, 4 sharing one KV cache
when -np is absent), each slot's context padded to 256 tokens unless -kvu, -ub cut to -b,
first-match tensor overrides (-ot, --n-cpu-moe), and real commands from llama.cpp's docs and
issues (docs/engines/llama_cpp.md).

Expected numbers are derived here by hand from the facts table (Mixtral-8x7B: 32 layers, the
workload's longest sequence 418 + 128 = 546 tokens), never copied from hrm's output."""

from __future__ import annotations

import shlex

import pytest

from hrm.engines.engine import load_engine
from hrm.errors import HRMError
from hrm.export import LLAMA_CPP, Context, export_policy, import_command, split_flags
from hrm.machine.hardware import load_hardware
from hrm.model.spec import load_model
from hrm.workload import make_workload
from solver.search import search

LONGEST = 418 + 128  # the default workload's longest sequence
LAYERS = 32  # Mixtral-8x7B's blocks, every one MoE
MAX_SEQ = 256  # src/llama-cparams.h:7


def pad256(tokens: int) -> int:
    return -(-tokens // 256) * 256


def run(text: str, hw_name: str = "l4"):
    return import_command("llama.cpp", text, load_model("mixtral"), make_workload(), load_hardware(hw_name))


# --- exports of searched plans -----------------------------------------------------------

@pytest.fixture(scope="module")
def exports():
    out = []
    for hw_name in ("l4", "t4"):
        hw, model, workload = load_hardware(hw_name), load_model("mixtral"), make_workload()
        for engine in ("llama.cpp", "llama.cpp-nkvo"):
            plan = search(hw, model, workload, top=0, engine=engine, hw_name=hw_name, model_name="mixtral").plan
            export = export_policy("llama.cpp", plan.policy, Context(model=model, workload=workload, hardware=hw),
                                   hw=hw, plan_engine=load_engine(engine))
            out.append((hw_name, engine, plan, export))
    return out


def test_exports_start_within_llama_cpp_limits(exports):
    """-np <= 256, -ub <= -b, -c the slots' context, every flag in the table, and the KV cache
    a stream per slot (never -kvu, whose masked compute the GPU engines do not price), each slot padded to 256
    tokens on the GPU or with -nkvo in host memory, as the llama.cpp engines' memory counts it."""
    for hw_name, engine, plan, export in exports:
        assert export.exact and export.exported_feasible, (hw_name, engine)
        words = shlex.split(export.commands[0])
        assert words[0] == "llama-server"
        values = split_flags(LLAMA_CPP, export.commands[0])
        n = plan.policy.batch_size
        assert all(LLAMA_CPP.spec(flag) for flag in values)
        assert int(values["-np"][0]) == n <= MAX_SEQ
        assert int(values["-ub"][0]) <= int(values["-b"][0])
        assert int(values["-c"][0]) == n * LONGEST
        assert int(values["-ngl"][0]) == LAYERS + 1 and values["--fit"] == ["off"]
        cpu_layers = round((1 - plan.policy.weights_gpu_ratio) * LAYERS)
        assert int(values["--n-cpu-moe"][0]) == cpu_layers
        assert "-kvu" not in values and ("-nkvo" in values) == (not plan.policy.attn_on_gpu)
        per_slot = pad256(pad256(n * LONGEST) // n)  # src/llama-context.cpp:290-305
        assert per_slot == 768 or n != MAX_SEQ  # the 768-token slots
        assert f"padded to {per_slot} tokens" in export.notes[0] and "the estimate counts the padding" in export.notes[0]
        assert f"{per_slot * n / (n * LONGEST):.3g}x" in export.notes[0]
        back, _ = run(export.commands[0], hw_name)
        assert back == export.exported_policy


def test_export_caps_slots_at_llama_max_seq():
    """A plan of 2548 sequences (the ideal engine's) exports at most 256 slots."""
    from hrm.policy import parse_policy

    ctx = Context(model=load_model("mixtral"), workload=make_workload(), hardware=load_hardware("l4"))
    export = export_policy("llama.cpp", parse_policy("N=2548,mu=2548,n=1,attn=gpu,ffn=gpu,rw=0.25,rc=1"), ctx)
    values = split_flags(LLAMA_CPP, export.commands[0])
    assert values["-np"] == ["256"] and values["-ub"] == ["256"] and values["--n-cpu-moe"] == ["24"]


# --- real commands -----------------------------------------------------------------------

#: (source, command, hardware, N, mu, r_w, a piece of a note or None): N 1 where -np is absent
#: (one user: the server's 4 auto slots, tools/server/server.cpp:156-160, serve its requests one
#: at a time); r_w = GPU-kept MoE layers / 32, by hand. The commands
#: posted in llama.cpp's docs and issues are in tests/data/real_commands.yaml (the import table).
REAL = [
    # the issue's: a server with no -np serves one user at batch 1 (issue 34)
    ("issue 25", "llama-server -m mixtral.gguf -ngl 99 --n-cpu-moe 20 -c 8192 -b 2048 -ub 512", "l4", 1, 1,
     12 / 32, "no -np"),
    # the issue's: first match keeps blocks 0-3's experts on the GPU, the rest on the CPU
    ("issue 25", r'./build/bin/llama-server -ngl 99 -np 8 -c 8192 -ot "blk\.([0-3])\.ffn_.*_exps\.=CUDA0" '
     '-ot "exps=CPU"', "l4", 8, 8, 4 / 32, None),
]


@pytest.mark.parametrize("source,command,hw_name,n,mu,rw,note", REAL, ids=[r[0] for r in REAL])
def test_real_commands_import_to_hand_derived_policies(source, command, hw_name, n, mu, rw, note):
    policy, notes = run(command, hw_name)
    assert (policy.batch_size, policy.micro_batch_size, policy.num_micro_batches) == (n, mu, n // mu)
    assert policy.weights_gpu_ratio == pytest.approx(rw) and policy.ffn_on_gpu and policy.attn_on_gpu
    if note:
        assert any(note in line for line in notes), notes


#: (source, command, hardware, a piece of the one-line refusal)
REFUSED = [
    # PR 11397 (ubergarm) on one GPU: no CUDA1
    ("PR 11397 one GPU", r"-c 32768 -ot blk\.[0-4]\.ffn.*=CUDA0 -ot blk\.[5-9]\.ffn.*=CUDA1 -ot exps=CPU -ngl 99",
     "l4", "CUDA1"),
    ("issue 25 per-tensor", '-np 4 -c 8192 -ot "ffn_down_exps=CPU"', "l4", "place a layer's experts whole"),
    ("issue 25 -np 300", "llama-server -np 300 -c 300000", "l4", "256"),
    ("regex length", f'-np 4 -ot "{"a" * 501}=CPU"', "l4", "at most 500"),
    ("regex nesting", '-np 4 -ot "(.*)*exps=CPU"', "l4", "catastrophic"),
    ("buffer name", "-np 4 -ot exps=cpu", "l4", "unknown buffer type"),
]


@pytest.mark.parametrize("source,command,hw_name,piece", REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_in_one_line(source, command, hw_name, piece):
    with pytest.raises(HRMError) as info:
        run(command, hw_name)
    assert piece in str(info.value) and "\n" not in str(info.value)


def test_ubatch_above_batch_is_cut_to_batch():
    """-ub 512 -b 256: llama.cpp runs ubatches of 256 (src/llama-context.cpp:248)."""
    policy, notes = run("-np 256 -c 139776 -b 256 -ub 512 -ngl 99")
    assert policy.micro_batch_size == 256 and any("-ub 512 above -b 256" in n for n in notes)


def test_override_order_decides():
    """--n-cpu-moe's overrides come after an earlier -ot (first match): -ot sends blocks 0-1 to
    the GPU, then --n-cpu-moe 10 keeps blocks 2-9 on the CPU (8 layers)."""
    policy, _ = run(r'-np 4 -c 8192 -ot "blk\.[01]\.ffn_.*_exps=CUDA0" --n-cpu-moe 10')
    assert policy.weights_gpu_ratio == pytest.approx((LAYERS - 8) / LAYERS)
    policy, _ = run(r'-np 4 -c 8192 --n-cpu-moe 10 -ot "blk\.[01]\.ffn_.*_exps=CUDA0"')
    assert policy.weights_gpu_ratio == pytest.approx((LAYERS - 10) / LAYERS)
