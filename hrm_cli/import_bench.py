"""``hrm import --from llama.cpp "llama-bench ..."`` / ``"llama-batched-bench ..."``: every test
the command runs, predicted on the CPU step model (hrm.cost.ggml_cpu) from the GGUF's own tensors and
the profile's measured ggml kernels (its ``ggml_cpu`` section: ``hrm profile --llama-cpp DIR``); and
``"llama-server ..."`` / ``"llama-cli ..."`` on a machine without a GPU, as the one run it serves."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hrm.errors import HRMError
from hrm.export.llama_tools import bench_runs, predict, unified_stream_note
from hrm.model.gguf import read_inventory


def gguf_path(model_flag: str, given: str | None) -> Path:
    """The GGUF (or tensor table) to read: ``--gguf`` when given, else the command's ``-m``."""
    path = Path(given if given is not None else model_flag)
    if not path.is_file():
        which = "--gguf" if given is not None else "-m"
        raise HRMError(f"{which} {path}: no such file here (the CPU prediction reads the GGUF's tensor list; "
                       f"give --gguf FILE.gguf or a tensor table when the command's path is another machine's)")
    return path


def command_gguf(command: str) -> Path | None:
    """The GGUF file a llama.cpp command's -m names, when it is on this machine (else None)."""
    from hrm.export.llama_cpp import model_files

    for name in model_files(command):
        if name.lower().endswith(".gguf") and Path(name).expanduser().is_file():
            return Path(name).expanduser()
    return None


def cpu_only_main(source: str, command: str, hw, model, workload, gguf, as_json: bool) -> int:
    """A llama-server / llama-cli command (or ollama's settings) on a machine without a GPU: the run
    it serves on the CPU step model (:func:`hrm.export.importing.estimate_without_gpu`), printed;
    exit 3 when the weights and the KV cache it allocates do not fit the machine's memory."""

    from hrm.errors import InfeasibleError
    from hrm.export.importing import estimate_without_gpu
    from hrm.units import GIB

    # gguf: --gguf as given, or the command's -m file found here (command_gguf)
    est = estimate_without_gpu(source, command, model, workload, hw, read_inventory(gguf_path("", str(gguf))))
    run, times, served = est.served.run, est.times, est.served
    row = {"program": run.tool, "model": run.model_path, "users": run.sequences, "threads": run.threads,
           "threads_batch": run.threads_batch, "n_batch": run.n_batch, "n_ubatch": run.n_ubatch, "repack": run.repack,
           "prompt_len": run.prompt_len, "gen_len": served.workload.gen_len, "decode_steps": run.gen_len,
           "ttft_s": times.prefill_s, "prefill_tok_s": times.prefill_tok_s, "decode_s": times.decode_s,
           "tpot_s": times.tpot_s, "decode_tok_s": times.decode_tok_s, "memory_bytes": est.memory_bytes,
           "kv_tokens": served.kv_tokens, "fits_memory": est.fits}
    if as_json:
        print(json.dumps({"source": source, "hardware": hw.name, "predicted_by": "cpu step model (hrm.cost.ggml_cpu)",
                          "run": row, "notes": list(served.notes)}, indent=2))
    else:
        from rich.table import Table

        from hrm_cli.common import console

        table = Table(title=f"{run.tool} on {hw.name} (no GPU: every layer on the CPU backend; ggml kernels measured "
                            f"by hrm profile --llama-cpp), {model.name}")
        table.add_column("quantity")
        table.add_column("value", justify="right")
        for name, value in (
                ("users (sequences decoded together)", str(run.sequences)),
                ("threads (-t / -tb)", f"{run.threads} / {run.threads_batch}"),
                ("ubatch (-ub, cut to -b and -c)", str(run.n_ubatch)),
                ("weights", "repacked (llama.cpp's default)" if run.repack else "plain CPU buffer (-nr)"),
                ("prompt tokens per user", str(run.prompt_len)),
                ("TTFT (prefill)", f"{times.prefill_s:.3f} s ({times.prefill_tok_s:,.1f} tok/s)"),
                ("generated tokens per user", f"{served.workload.gen_len} ({run.gen_len} decode steps after the first)"),
                ("TPOT", f"{times.tpot_s * 1e3:.2f} ms"),
                ("decode throughput", f"{times.decode_tok_s:,.1f} tok/s"),
                ("memory: weights + KV cache", f"{est.memory_bytes / GIB:.2f} GiB of {hw.cpu.memory_gib:g} GiB "
                                               f"(KV {served.kv_tokens} tokens; compute buffers not counted)"),
                ("fits", "yes" if est.fits else "NO")):
            table.add_row(name, value)
        console().print(table)
        for note in served.notes:
            print(f"note: {note}", file=sys.stderr)
    if not est.fits:
        raise InfeasibleError(f"{run.tool}: the weights and the KV cache ({est.memory_bytes / GIB:.2f} GiB) exceed "
                              f"{hw.name}'s {hw.cpu.memory_gib:g} GiB of memory")
    return 0


def load_requests(args, workload):
    """The load ``hrm import`` was asked to serve (:class:`hrm.cost.ggml_server.Request` list), or
    None: --load FILE, else --rate-per-s with --requests, each request of the workload's prompt and
    generated tokens (the command's -n when it sets one)."""
    from hrm.cost.ggml_server import evenly_spaced, poisson, requests_from_file

    if args.load is not None:
        return requests_from_file(args.load)
    if args.rate_per_s is None:
        return None
    shape = (args.rate_per_s, args.requests, int(workload.effective_prompt_len), int(workload.gen_len))
    return poisson(*shape, seed=args.seed) if args.arrivals == "poisson" else evenly_spaced(*shape)


def load_main(source: str, command: str, hw, model, workload, gguf, args, as_json: bool) -> int:
    """A llama-server command (or ollama's settings) on a machine without a GPU under a load of
    requests (--rate-per-s/--requests, or --load FILE): each request's TTFT, TPOT and latency as
    the server's continuous batching serves them (:func:`hrm.export.importing.serve_without_gpu`)."""

    from hrm.export.importing import estimate_without_gpu, serve_without_gpu

    inventory = read_inventory(gguf_path("", str(gguf)))
    one = estimate_without_gpu(source, command, model, workload, hw, inventory)  # -n sets each request's tokens
    requests = load_requests(args, one.served.workload)
    served = serve_without_gpu(source, command, model, workload, hw, inventory, requests)
    load, est = served.load, served.estimate
    run = est.served.run
    q = (50, 90, 99)
    summary = {"program": run.tool, "model": run.model_path, "slots": est.served.slots,
               "kv": "unified" if run.kv_unified else "a stream per slot", "threads": run.threads,
               "threads_batch": run.threads_batch, "n_batch": run.n_batch, "n_ubatch": run.n_ubatch,
               "requests": len(load.requests), "makespan_s": load.makespan_s, "generated_tok_s": load.generated_tok_s,
               "batches": load.iterations, "graph_passes": load.passes,
               **{f"ttft_p{p}_s": load.percentile("ttft_s", p) for p in q},
               **{f"tpot_p{p}_s": load.percentile("tpot_s", p) for p in q},
               **{f"latency_p{p}_s": load.percentile("latency_s", p) for p in q}}
    if as_json:
        rows = [{"arrival_s": r.request.arrival_s, "prompt_tokens": r.request.prompt_tokens,
                 "gen_tokens": r.request.gen_tokens, "slot": r.slot, "ttft_s": r.ttft_s, "tpot_s": r.tpot_s,
                 "latency_s": r.latency_s, "prompt_s": r.prompt_s, "decode_s": r.decode_s} for r in load.requests]
        print(json.dumps({"source": source, "hardware": hw.name, "predicted_by":
                          "llama-server's loop (hrm.cost.ggml_server) on the cpu step model (hrm.cost.ggml_cpu)",
                          "load": summary, "requests": rows, "notes": list(est.served.notes)}, indent=2))
        return 0
    from rich.table import Table

    from hrm_cli.common import console

    table = Table(title=f"{run.tool} on {hw.name} under {len(load.requests)} requests (no GPU: CPU step model, "
                        f"llama-server's continuous batching), {model.name}")
    table.add_column("quantity")
    table.add_column("p50", justify="right")
    table.add_column("p90", justify="right")
    table.add_column("p99", justify="right")
    for name, key, scale, unit in (("TTFT (arrival to first token)", "ttft", 1.0, "s"),
                                   ("TPOT (per generated token)", "tpot", 1e3, "ms"),
                                   ("latency (arrival to last token)", "latency", 1.0, "s")):
        table.add_row(name, *(f"{summary[f'{key}_p{p}_s'] * scale:.3f} {unit}" for p in q))
    console().print(table)
    kv = "one unified KV cache" if run.kv_unified else "a KV stream per slot"
    print(f"{est.served.slots} slots, {kv}, -t {run.threads} -tb {run.threads_batch}, -b {run.n_batch} "
          f"-ub {run.n_ubatch}: {len(load.requests)} requests in {load.makespan_s:.2f} s, "
          f"{load.generated_tok_s:,.1f} generated tok/s; {load.iterations} batches in {load.passes} graph passes"
          + (" (a KV stream per slot: slots whose ids are not consecutive decode in separate passes)"
             if load.passes > load.iterations else ""))
    for note in est.served.notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


def gpu_main(command: str, hw, model, as_json: bool, model_notes: tuple[str, ...] = ()) -> int:
    """A llama-bench sweep on a machine with a GPU: every point by HRM's llama.cpp engine
    (``model_notes``: how the model was read, e.g. its weights from the file's name)."""
    from hrm.export.llama_tools import gpu_estimate, tool_of

    if tool_of(command) != "llama-bench":
        raise HRMError("llama-batched-bench on a GPU profile: only llama-bench sweeps are predicted there")
    tests, notes = bench_runs(command, hw.cpu.cores)
    notes = [*model_notes, *notes]
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
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
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
        note = unified_stream_note(t, times, inv, hw.ggml_cpu)
        if note and note not in notes:
            notes.append(note)
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

    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return 0
