"""hrm import --from ollama: ollama's options read as the llama-server command ollama launches
(ollama/ollama@fb307609 llm/llama_server.go:368-416), then as llama.cpp reads it. Each expected
value is derived by hand from ollama's source (docs/engines/ollama.md) and the model's layers."""

from __future__ import annotations

import pytest

from hrm.errors import HRMError
from hrm.export.importing import read_command
from hrm.export.ollama import catalog_name, llama_server_values, read_settings
from hrm.export.target import Context
from hrm.machine.parts import compose_profile
from hrm.model.spec import load_model
from hrm.workload import make_workload

QWEN = load_model("qwen3-30b-a3b")  # 48 layers, all MoE; training context 40960
ONE_4090 = compose_profile("rtx-4090", "ryzen-9-7950x", 64)  # 24 GiB of GPU memory
TWO_4090 = compose_profile("rtx-4090", "ryzen-9-7950x", 64, gpu_count=2)  # 48 GiB
ONE_3060 = compose_profile("rtx-3060-12gb", "ryzen-7-5800x", 32)  # 12 GiB


def flags(text: str, hw=ONE_4090, model=QWEN) -> dict[str, list[str]]:
    ctx = Context(model=model, workload=make_workload(), hardware=hw)
    return llama_server_values(read_settings(text), ctx)[0]


def read(text: str, hw=ONE_4090, model=QWEN):
    return read_command("ollama", text, model, make_workload(), hw)


def test_modelfile_parameters_become_llama_server_flags():
    text = "FROM qwen3:30b\nPARAMETER num_gpu 49\nPARAMETER num_ctx 8192\nPARAMETER num_thread 16\nPARAMETER num_batch 256"
    # -c num_ctx x 1 slot, -np 1, -b/-ub num_batch, -ngl num_gpu, -t num_thread (:375-416)
    assert flags(text) == {"-c": ["8192"], "-np": ["1"], "-fa": ["auto"], "-b": ["256"], "-ub": ["256"],
                           "-ngl": ["49"], "-t": ["16"]}
    imported = read(text)
    assert imported.policy.short() == "N=1,mu=1,n=1,attn=gpu,ffn=gpu,rw=1,rc=1"
    assert imported.engine_fields == {"cpu_threads": 16, "prefill.max_tokens_per_pass": 256}  # -t 16; -ub 256 <= -b 256


def test_num_parallel_multiplies_the_context_and_sets_the_slots():
    text = "OLLAMA_NUM_PARALLEL=4 ollama serve\nPARAMETER num_ctx 2048"
    assert flags(text)["-c"] == ["8192"] and flags(text)["-np"] == ["4"]  # 2048 x 4 slots
    policy = read(text).policy
    assert (policy.batch_size, policy.micro_batch_size) == (4, 4)  # -ub 512 (llama.cpp's default) cut to 4 slots


@pytest.mark.parametrize("hw, tokens", [(ONE_3060, 4096), (ONE_4090, 32768), (TWO_4090, 40960)])
def test_default_num_ctx_follows_gpu_memory_and_the_training_context(hw, tokens):
    # routes.go:2043-2057: < 23 GiB 4096, 23-47 GiB 32768, >= 47 GiB 262144, cut to 40960 (llm/server.go:112-116)
    assert flags("ollama run qwen3:30b", hw)["-c"] == [str(tokens)]


def test_ollama_context_length_sets_the_default():
    assert flags("OLLAMA_CONTEXT_LENGTH=16384 ollama serve")["-c"] == ["16384"]
    assert flags("OLLAMA_CONTEXT_LENGTH=16384 ollama serve\n/set parameter num_ctx 4096")["-c"] == ["4096"]


def test_a_systemd_drop_in_sets_the_server_variables():
    # docs/faq.mdx:91-102: `systemctl edit ollama.service`, Environment= lines under [Service]
    text = '[Service]\nEnvironment="OLLAMA_NUM_PARALLEL=2"\nEnvironment="OLLAMA_CONTEXT_LENGTH=8192"'
    assert flags(text)["-c"] == ["16384"] and flags(text)["-np"] == ["2"]  # 8192 x 2 slots


def test_request_json_and_curl_read_alike():
    body = '{"model": "qwen3:30b-a3b", "prompt": "hi", "options": {"num_ctx": 12288, "num_gpu": 99}}'
    as_json = flags(body)
    assert as_json == flags(f"curl http://localhost:11434/api/generate -d '{body}'")
    assert as_json["-c"] == ["12288"] and as_json["-ngl"] == ["99"]
    assert flags('{"num_ctx": 12288.0}')["-c"] == ["12288"]  # a bare options object; JSON numbers truncate


def test_num_gpu_below_the_layers_is_refused_naming_it():
    with pytest.raises(HRMError, match=r"^ollama: num_gpu 20: 28 of 48 whole layers"):
        read("/set parameter num_gpu 20")
    with pytest.raises(HRMError, match="num_gpu 0: every layer on the CPU"):
        read("PARAMETER num_gpu 0")
    assert "-ngl" not in flags("PARAMETER num_gpu -1")  # -1: no -ngl (:410)


@pytest.mark.parametrize("text, message", [
    ("PARAMETER mirostat 2", "unknown option 'mirostat'"),
    ('{"options": {"num_gpus": 2}}', "did you mean 'num_gpu'?"),
    ("PARAMETER num_ctx lots", "num_ctx 'lots': not an int value"),
    ("OLLAMA_NUM_PARALLEL=-2 ollama serve", "OLLAMA_NUM_PARALLEL='-2'"),
    ("ADAPTER ./lora.gguf", "ADAPTER: a LoRA adapter"),
    ("FROM gpt-oss:120b", "model 'gpt-oss:120b' is not the model being planned"),
    ("PARAMETER num_ctx 256", "ollama: as the llama.cpp command it launches (-c 256 -np 1 -fa auto)"),
    ("num_ctx 8192", "not a Modelfile command"),
])
def test_bad_input_is_one_line_naming_it(text, message):
    with pytest.raises(HRMError) as info:
        read(text)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_modelfile_text_blocks_and_sampling_options_set_no_flag():
    text = 'FROM qwen3:30b\nTEMPLATE """{{ .Prompt }}\nline two"""\nPARAMETER temperature 0.6\nPARAMETER stop "<|im_end|>"'
    assert flags(text) == {"-c": ["32768"], "-np": ["1"], "-fa": ["auto"]}


@pytest.mark.parametrize("named, catalog", [
    ("qwen3:30b", "qwen3-30b-a3b"), ("qwen3:30b-a3b", "qwen3-30b-a3b"),
    ("qwen3:30b-a3b-q4_K_M", "qwen3-30b-a3b-q4_k_m"), ("qwen3:30b-q8_0", "qwen3-30b-a3b-q8_0"),
    ("gpt-oss:120b", "gpt-oss-120b"), ("hf.co/unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M", "qwen3-30b-a3b-gguf-q4_k_m"),
])
def test_ollama_names_as_the_catalog_spells_them(named, catalog):
    assert catalog_name(named) == catalog


def test_hrm_import_cli_reads_ollama(capsys):
    from hrm_cli.import_flags import main

    from hrm.errors import InfeasibleError

    try:  # qwen3-30b-a3b's 16-bit weights on one L4: the pinned policy may not fit (exit 3), printed first
        main(["--from", "ollama", "--hw", "l4", "--model", "qwen3-30b-a3b", "--json",
              "PARAMETER num_gpu 49\nPARAMETER num_ctx 4096"])
    except InfeasibleError:
        pass
    out = capsys.readouterr().out
    assert '"source": "ollama"' in out and '"policy_short": "N=1,mu=1,n=1,attn=gpu,ffn=gpu,rw=1,rc=1"' in out
