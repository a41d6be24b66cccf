"""llama.cpp's command surface as hrm import reads it (issue 34 item 3): one user is batch 1
(llama-cli; llama-server without -np), -np N is N users, ik_llama.cpp's flags and --numa on a
multi-node machine are refused in one line."""

import pytest

from hrm.errors import HRMError
from hrm.export.importing import read_command
from hrm.hardware import load_hardware
from hrm.model import load_model
from hrm.parts import compose_profile
from hrm.workload import make_workload


def _read(command, hw="l4"):
    hw = load_hardware(hw) if isinstance(hw, str) else hw
    return read_command("llama.cpp", command, load_model("mixtral"), make_workload(), hw)


@pytest.mark.parametrize("command", [
    "llama-cli -m mixtral-8x7b-v0.1.Q4_K_M.gguf -ngl 99 --n-cpu-moe 8 -c 4096 -p 'hello' -n 64",
    "llama-server -m mixtral-8x7b.gguf -ngl 99 --n-cpu-moe 8 -c 4096",
    "./main -m mixtral.gguf -ngl 99 --n-cpu-moe 8 -c 4096 -no-cnv",
])
def test_one_user_is_batch_one(command):
    p = _read(command).policy
    assert (p.batch_size, p.micro_batch_size, p.num_micro_batches) == (1, 1, 1)
    assert p.weights_gpu_ratio == pytest.approx((32 - 8) / 32)


def test_np_gives_the_users():
    p = _read("llama-server -m mixtral.gguf -ngl 99 --n-cpu-moe 8 -c 16384 -np 4 -kvu").policy
    assert p.batch_size == 4


@pytest.mark.parametrize("flag", ["-rtr", "-fmoe", "-amb 512", "-mla 2"])
def test_ik_llama_flags_refused_in_one_line(flag):
    with pytest.raises(HRMError, match="ik_llama.cpp flag") as exc:
        _read(f"llama-server -m mixtral.gguf -ngl 99 -c 4096 {flag}")
    assert "\n" not in str(exc.value)


def test_numa():
    two = compose_profile("rtx-4090", "epyc-9654", 512, sockets=2)
    with pytest.raises(HRMError, match="2 NUMA nodes"):
        _read("llama-server -m mixtral.gguf -ngl 99 --n-cpu-moe 20 -c 4096 --numa distribute", two)
    one = compose_profile("rtx-4090", "epyc-9654", 512)
    assert _read("llama-server -m mixtral.gguf -ngl 99 --n-cpu-moe 20 -c 4096 --numa distribute", one).policy


def test_threads_are_read():
    assert _read("llama-server -m mixtral.gguf -ngl 99 --n-cpu-moe 20 -c 4096 -t 12").engine_fields == \
        {"cpu_threads": 12}
