"""``hrm import --from llama.cpp "llama-bench ..."`` / ``"llama-batched-bench ..."``: every test
the command runs, predicted on the CPU step model (hrm.cost.ggml_cpu) from the GGUF's own tensors and
the profile's measured ggml kernels (its ``ggml_cpu`` section: ``hrm profile --llama-cpp DIR``)."""

from __future__ import annotations

import json
from pathlib import Path

from hrm.errors import HRMError
from hrm.export.llama_tools import bench_runs, predict
from hrm.model.gguf import read_inventory


def gguf_path(model_flag: str, given: str | None) -> Path:
    """The GGUF (or tensor table) to read: ``--gguf`` when given, else the command's ``-m``."""
    path = Path(given if given is not None else model_flag)
    if not path.is_file():
        which = "--gguf" if given is not None else "-m"
        raise HRMError(f"{which} {path}: no such file here (the CPU prediction reads the GGUF's tensor list; "
                       f"give --gguf FILE.gguf or a tensor table when the command's path is another machine's)")
    return path


def gpu_main(command: str, hw, model, as_json: bool) -> int:
    """A llama-bench sweep on a machine with a GPU: every point by HRM's llama.cpp engine."""
    from hrm.export.llama_tools import gpu_estimate, tool_of

    if tool_of(command) != "llama-bench":
        raise HRMError("llama-batched-bench on a GPU profile: only llama-bench sweeps are predicted there")
    tests, notes = bench_runs(command, hw.cpu.cores)
    rows = []
    for t in tests:
        prefill, decode, fits = gpu_estimate(t, hw, model)
        rows.append({"test": t.label, "threads": t.threads, "n_cpu_moe": t.n_cpu_moe, "n_ubatch": t.n_ubatch,
                     "prefill_tok_s": prefill, "decode_tok_s": decode, "fits_memory": fits})
    if as_json:
        print(json.dumps({"source": "llama.cpp", "tool": "llama-bench", "hardware": hw.name, "model": model.name,
                          "tests": rows, "notes": notes}, indent=2))
        return 0
    from rich.table import Table

    from hrm_cli.common import console

    table = Table(title=f"llama-bench on {hw.name}, {model.name} (HRM's llama.cpp engine, one sequence)")
    for col in ("test", "threads", "ncmoe", "ub", "prefill tok/s", "decode tok/s", "fits"):
        table.add_column(col, justify="right" if col != "test" else "left")
    for r in rows:
        table.add_row(r["test"], str(r["threads"]), str(r["n_cpu_moe"]), str(r["n_ubatch"]),
                      f"{r['prefill_tok_s']:,.1f}" if r["prefill_tok_s"] else "-",
                      f"{r['decode_tok_s']:,.2f}" if r["decode_tok_s"] else "-", "yes" if r["fits_memory"] else "NO")
    console().print(table)
    return 0


def main(command: str, hw, gguf: str | None, as_json: bool) -> int:
    if hw.ggml_cpu is None:
        raise HRMError(f"--hw {hw.name}: no ggml_cpu section: measure this machine's llama.cpp kernels with "
                       f"hrm profile --llama-cpp DIR (the llama.cpp tree you run)")
    tests, notes = bench_runs(command, hw.cpu.cores)
    rows = []
    inventories: dict[str, object] = {}
    for t in tests:
        path = gguf_path(t.model_path, gguf)
        inv = inventories.setdefault(str(path), read_inventory(path))
        times = predict(t, inv, hw.ggml_cpu)
        rows.append({"test": t.label, "model": t.model_path, "threads": t.threads, "sequences": t.sequences,
                     "prompt_len": t.prompt_len, "gen_len": t.gen_len, "depth": t.depth,
                     "prefill_s": times.prefill_s, "decode_s": times.decode_s,
                     "prefill_tok_s": times.prefill_tok_s, "decode_tok_s": times.decode_tok_s})
    if as_json:
        print(json.dumps({"source": "llama.cpp", "tool": tests[0].tool if tests else None, "hardware": hw.name,
                          "tests": rows, "notes": notes}, indent=2))
        return 0
    from rich.table import Table

    from hrm_cli.common import console

    table = Table(title=f"{tests[0].tool if tests else 'llama.cpp'} on {hw.name} (CPU backend, ggml kernels "
                        f"measured by hrm profile --llama-cpp)")
    for col in ("test", "threads", "seqs", "prefill s", "prefill tok/s", "decode s", "decode tok/s"):
        table.add_column(col, justify="right" if col != "test" else "left")
    for r in rows:
        table.add_row(r["test"], str(r["threads"]), str(r["sequences"]),
                      f"{r['prefill_s']:.3f}" if r["prompt_len"] else "-",
                      f"{r['prefill_tok_s']:,.1f}" if r["prompt_len"] else "-",
                      f"{r['decode_s']:.3f}" if r["gen_len"] else "-",
                      f"{r['decode_tok_s']:,.1f}" if r["gen_len"] else "-")
    console().print(table)
    import sys

    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return 0
