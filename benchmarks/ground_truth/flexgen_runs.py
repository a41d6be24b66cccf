#!/usr/bin/env python3
"""FlexGen's results JSONL (the GPU harness's flexgen_bench.py) as a runs file `hrm calibrate` reads.

    python benchmarks/ground_truth/flexgen_runs.py RESULTS.jsonl --out docs/validation/runs/flexgen-h100.yaml \\
        [--hardware PROFILE.yaml] [--model CONFIG.json] [--gpu-check GPU_CHECK.json] [--no-check]

One run per distinct policy (records whose FlexGen flags are the same are repeats: the run holds
their median and, per quantity, the [min, max] under ``spread``). Every number is FlexGen's own
timer as its --log-file reports it (flexgen/flex_moe.py:1300-1314, utils.py:263-281):

    prefill_s = ttft_s  = prefill latency (costs[0]: all N prompts' first token)
    decode_s            = decode latency (sum of costs[1:])
    total_s             = total latency = prefill_s + decode_s
    tpot_s              = decode_s / (gen_len - 1)
    generation_throughput_tok_s = total throughput = N * gen_len / total_s

The policy, the engine and the workload are what ``hrm import --from flexgen`` reads from the
command, so that ``hrm calibrate`` predicts each run as the import would. ``command`` is
``python3 -m flexgen.flex_moe`` with the flags exactly as run (the harness runs flex_moe through
its flexgen_main.py, which is that module run as __main__; its wrapper command stays in the JSONL).
A failed, timed-out, skipped or projected record becomes no run: it is listed in the file's
header and on stderr. Standard library and hrm only (no harness import).

With ``--gpu-check`` (the harness's gpu_check.json from the same box) every run also gets
``harness_fields: {launches.custom_ops_host_s: ...}``: the harness ran FlexGen's three vLLM ops
as torch/Triton stand-ins (../shared/gpu/flexgen/README.md, "shim/vllm"), whose host time per
MoE call gpu_check measured (:func:`shim_host_s`); vLLM's own ops are one CUDA kernel each.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shlex
import statistics
import sys
from pathlib import Path

import yaml

from hrm.errors import HRMError
from hrm.export import FLEXGEN_VERSION, get_exporter, read_command
from hrm.machine.hardware import load_hardware
from hrm.model.spec import load_model
from hrm.workload import make_workload

#: what the harness adds to every policy's flags (paths of the box's temporary folder)
HARNESS_FLAGS = ("--model", "--offload-dir", "--log-file")
#: the harness's stand-ins for vLLM's ops, as gpu_check.json times them (one call each per MoE call:
#: lynnliu030/FlexGen@a80c8d15 flexgen/fused_moe.py:170,272,315)
SHIM_OPS = ("topk_softmax", "moe_align_block_size", "silu_and_mul")
#: the measured quantities, in the order written
QUANTITIES = ("prefill_s", "decode_s", "total_s", "ttft_s", "tpot_s", "generation_throughput_tok_s")
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = ROOT / "docs/validation/runs/mixtral-8x7b-4l.json"
DEFAULT_HARDWARE = ROOT / "docs/validation/h100-measured.yaml"


def read_records(path: str | Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def flags_as_run(record: dict) -> list[str]:
    """FlexGen's flags as the harness passed them: the words of ``cmd`` after its entry script
    (timeout ... PYTHON ENTRY.py FLAGS...)."""
    words = shlex.split(record["cmd"])
    entry = next(i for i, w in enumerate(words) if w.endswith(".py"))
    return words[entry + 1:]


def policy_key(record: dict) -> tuple[str, ...]:
    """Repeats share FlexGen's flags less the harness's per-run paths."""
    return tuple(record["policy_flags"])


def why_not(record: dict) -> str | None:
    """Why a record gives no run (None: it does)."""
    if record.get("skipped"):
        return f"skipped ({record['skipped']})"
    if not record.get("ok"):
        return f"failed rc={record.get('rc')}: {record.get('error', '')}".strip()
    if record.get("metrics", {}).get("projected"):
        return "projected (--cut-gen-len/--debug-mode): not a full run"
    if record.get("args", {}).get("gen_len", 0) < 2:
        return "gen_len < 2: no decode step"
    return None


def measured_of(record: dict) -> dict[str, float]:
    """The six quantities of one record from FlexGen's logged metrics, with FlexGen's own
    throughput checked against N * gen_len / total latency (its 3-decimal rounding)."""
    m, args = record["metrics"], record["args"]
    gen_len, n = args["gen_len"], record["num_prompts"]
    prefill, decode, total = m["prefill_latency_s"], m["decode_latency_s"], m["total_latency_s"]
    throughput = m["total_throughput_tok_s"]
    if not math.isclose(throughput, n * gen_len / total, rel_tol=2e-3, abs_tol=2e-3):
        raise HRMError(f"total throughput {throughput} != N*gen/total = {n * gen_len / total:.4g}")
    if not math.isclose(total, prefill + decode, abs_tol=2.5e-3):
        raise HRMError(f"total latency {total} != prefill {prefill} + decode {decode}")
    return {"prefill_s": prefill, "decode_s": decode, "total_s": total, "ttft_s": prefill,
            "tpot_s": decode / (gen_len - 1), "generation_throughput_tok_s": throughput}


def significant(x: float, digits: int = 6) -> float:
    return float(f"{x:.{digits}g}")


def relative_to(path: Path, folder: Path) -> str:
    return os.path.relpath(path.resolve(), folder.resolve())


def shim_host_s(gpu_check: dict, tokens: int) -> float:
    """Host seconds of the three stand-in ops of one MoE call of ``tokens`` tokens: the sum of
    their ``host_ms`` in gpu_check's ``timing`` row whose M is nearest ``tokens`` (on a log
    scale; the smaller M on a tie)."""
    rows = {int(key.split("=")[1]): row for key, row in gpu_check["timing"].items() if key.startswith("M=")}
    m = min(sorted(rows), key=lambda x: abs(math.log(x / tokens)))
    return significant(sum(rows[m][op]["host_ms"] for op in SHIM_OPS) / 1e3, 4)


def convert(records: list[dict], hardware: str | Path, model: str | Path, out: str | Path,
            engine_version: str = FLEXGEN_VERSION, gpu_check: dict | None = None) -> tuple[dict, list[str], list[dict]]:
    """(runs file mapping, lines on the records left out, per-run notes) for ``records``."""
    hw, spec = load_hardware(str(hardware)), load_model(str(model))
    target = get_exporter("flexgen")
    groups: dict[tuple, list[dict]] = {}
    left_out = []
    for rec in records:
        reason = why_not(rec)
        if reason:
            left_out.append(f"{rec.get('label')}: {reason}")
            continue
        groups.setdefault(policy_key(rec), []).append(rec)
    runs, notes = [], []
    for recs in groups.values():
        first = recs[0]
        command = shlex.join(["python3", "-m", "flexgen.flex_moe", *flags_as_run(first)])
        try:  # a command hrm import refuses, or numbers that disagree with FlexGen's own: no run
            imported = read_command("flexgen", command, spec, make_workload(), hw)
            per = [measured_of(r) for r in recs]
        except HRMError as exc:
            left_out += [f"{r['label']}: {exc}" for r in recs]
            continue
        engine = target.hrm_engine(imported.policy)
        measured = {q: significant(statistics.median(p[q] for p in per)) for q in QUANTITIES}
        w = imported.workload
        run = {"name": first["label"], "engine": engine, "from": "flexgen", "engine_version": engine_version,
               "command": command,
               "workload": {"prompt_len": w.prompt_len, "max_prompt_len": w.max_prompt_len,
                            "gen_len": w.gen_len, "padding": w.padding},
               "policy": imported.policy.short(), "measured": measured}
        if gpu_check is not None:  # a decode step's MoE call has one micro-batch of tokens
            run["harness_fields"] = {"launches.custom_ops_host_s":
                                     shim_host_s(gpu_check, imported.policy.micro_batch_size)}
        if len(recs) > 1:
            run["spread"] = {"n": len(recs), **{q: [significant(min(p[q] for p in per)),
                                                    significant(max(p[q] for p in per))] for q in QUANTITIES}}
        runs.append(run)
        peak = [r.get("metrics", {}).get("peak_gpu_mem_gb") for r in recs]
        notes.append({"labels": [r["label"] for r in recs], "elapsed_s": [r.get("elapsed_s") for r in recs],
                      "peak_gpu_mem_gb": peak, "engine_fields": dict(imported.engine_fields)})
    if not runs:
        raise HRMError("no record of the JSONL is a finished run: nothing to write")
    folder = Path(out).parent
    hardware_text = relative_to(Path(hardware), folder) if Path(str(hardware)).exists() else str(hardware)
    model_text = relative_to(Path(model), folder) if Path(str(model)).exists() else str(model)
    return {"hardware": hardware_text, "model": model_text, "runs": runs}, left_out, notes


def render(data: dict, left_out: list[str], notes: list[dict], source: str, digest: str) -> str:
    """The runs file as YAML, with a header and a comment above each run (labels, wall time,
    peak GPU memory): what the calibrate format has no key for."""
    lines = ["# FlexGen ground truth: written by benchmarks/ground_truth/flexgen_runs.py from",
             f"# {source} (sha256 {digest[:16]}); see docs/validation/flexgen_gpu_plan.md.",
             "# measured: FlexGen's own timers (its --log-file); dummy weights route every token to",
             "# experts 0 and 1 (all router logits tie), so the GPU's expert compute is that of two experts."]
    if any("harness_fields" in run for run in data["runs"]):
        lines += ["# harness_fields: the harness ran vLLM's three ops as torch/Triton stand-ins; their host time",
                  "# per MoE call is gpu_check.json's (docs/engines/flexgen.md §10), not vLLM's one kernel each."]
    lines += [f"# left out: {line}" for line in left_out]
    keys = {"hardware": data["hardware"], "model": data["model"]}
    if data.get("routing"):
        lines += ["# routing: the experts the dummy weights' tied router logits choose (docs/validation/runs/",
                  "# flexgen-dummy-routing.json), so HRM predicts the expert reads the runs made."]
        keys["routing"] = data["routing"]
    head = yaml.safe_dump(keys, sort_keys=False)
    lines += head.rstrip("\n").split("\n") + ["runs:"]
    for run, note in zip(data["runs"], notes):
        lines.append(f"  # harness labels {', '.join(note['labels'])}; wall {', '.join(map(str, note['elapsed_s']))} s; "
                     f"peak GPU {', '.join(map(str, note['peak_gpu_mem_gb']))} GB"
                     + (f"; engine fields read from the command: {note['engine_fields']}" if note["engine_fields"] else ""))
        body = yaml.safe_dump([run], sort_keys=False, width=100000)
        lines += ["  " + line for line in body.rstrip("\n").split("\n")]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="flexgen_results.jsonl from the harness")
    ap.add_argument("--out", required=True, help="runs YAML to write")
    ap.add_argument("--hardware", default=str(DEFAULT_HARDWARE),
                    help="the profile measured on the box (default: docs/validation/h100-measured.yaml)")
    ap.add_argument("--model", default=str(DEFAULT_MODEL), help="the model FlexGen ran (default: 4-layer Mixtral)")
    ap.add_argument("--engine-version", default=FLEXGEN_VERSION)
    ap.add_argument("--gpu-check", help="the harness's gpu_check.json: the vLLM stand-ins' host time per MoE call")
    ap.add_argument("--routing", help="the runs file's routing (--routing syntax; a trace path relative to --out's "
                                      "folder), e.g. trace:flexgen-dummy-routing.json")
    ap.add_argument("--no-check", action="store_true", help="skip reading the file back with hrm.analysis.calibration_runs.load_runs")
    args = ap.parse_args(argv)
    tmp = Path(str(args.out) + ".tmp")
    try:
        text_bytes = Path(args.results).read_bytes()
        gpu_check = json.loads(Path(args.gpu_check).read_text()) if args.gpu_check else None
        data, left_out, notes = convert(read_records(args.results), args.hardware, args.model, args.out,
                                        args.engine_version, gpu_check)
        if args.routing:
            data["routing"] = args.routing
        text = render(data, left_out, notes, args.results, hashlib.sha256(text_bytes).hexdigest())
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        if not args.no_check:
            from hrm.analysis.calibration_runs import load_runs

            load_runs(tmp)
        tmp.replace(args.out)
    except (HRMError, OSError, KeyError, ValueError, StopIteration) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        tmp.unlink(missing_ok=True)
        return 2
    for line in left_out:
        print(f"left out: {line}", file=sys.stderr)
    print(f"wrote {args.out}: {len(data['runs'])} runs ({len(left_out)} records left out)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
