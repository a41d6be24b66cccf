"""Turn llama_cpu_runs.py's raw samples into the committed runs file
(docs/validation/runs/llamacpp-cpu.yaml): per run its exact command (paths reduced to file
names), the engine version, the tensor table of its GGUF, and measured prefill, decode, total,
TTFT and TPOT (medians of the samples, with every sample and the spread kept).

    python runs_file.py RAW.json OUT.yaml --profile PROFILE.yaml [--only NAME ...]

``--only`` keeps the named runs (the three-run calibration example, llamacpp-cpu-3runs.yaml:
`--only "gt-qwen3moe q4_k_m t1 x64 (batched-bench)" ...`).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import yaml

ENGINE_VERSION = ("ggml-org/llama.cpp@0c1e5709 (the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp), CPU backend, "
                  "GGML_NATIVE=OFF with AVX-512/VNNI/BF16 on and AMX off (../shared/llamacpp-cpu/README.md)")


def short_command(cmd: list[str]) -> str:
    import shlex

    words = [w.rsplit("/", 1)[-1] if "/" in w and " " not in w else w for w in cmd]
    return shlex.join(words)


#: a sample slower than this factor x the point's fastest sample is another process's or a cold
#: start's time, not llama.cpp's (seen: the first invocation on a model after another model's runs,
#: 2x; a second invocation sharing the CPU with an unpaused process, 2x); it is dropped, and the
#: run keeps every sample in `samples` with the dropped ones listed in `dropped`
OUTLIER_FACTOR = 1.5


def kept(values: list[float]) -> list[float]:
    fastest = min(values)
    return [v for v in values if v <= OUTLIER_FACTOR * fastest]


def spread(values: list[float]) -> float:
    med = statistics.median(values)
    return round((max(values) - min(values)) / med, 4) if med else 0.0


def sig(x: float) -> float:
    return float(f"{x:.5g}")


def batched_run(point: dict) -> dict | None:
    res = [s["result"] for s in point["samples"] if "result" in s]
    if not res:
        return None
    pp_all = [r["t_pp"] for r in res]
    tg_all = [r["t_tg"] for r in res]
    pp, tg = kept(pp_all), kept(tg_all)
    k = point["key"]
    ntg, npl = res[0]["tg"], res[0]["pl"]
    total = statistics.median(pp) + statistics.median(tg)
    return {"measured": {"prefill_s": sig(statistics.median(pp)), "decode_s": sig(statistics.median(tg)),
                         "total_s": sig(total), "ttft_s": sig(statistics.median(pp)),
                         "tpot_s": sig(statistics.median(tg) / ntg),
                         "generation_throughput_tok_s": sig(npl * ntg / total)},
            "samples": {"prefill_s": [sig(x) for x in pp_all], "decode_s": [sig(x) for x in tg_all]},
            "dropped": {"prefill_s": len(pp_all) - len(pp), "decode_s": len(tg_all) - len(tg)},
            "spread": {"prefill_s": spread(pp), "decode_s": spread(tg)},
            "name": f"{k['model']} {k['format']} t{k['threads']} x{npl}{' kvu' if k.get('kv_unified') else ''} (batched-bench)"}


def phases(pre_all: list[float], dec_all: list[float], decode_steps: int) -> dict:
    """A run's measured prefill and decode (medians of the kept samples), its total, TTFT and TPOT
    (decode over ``decode_steps``), with every sample, the dropped count and the spread."""
    pre, dec = kept(pre_all), kept(dec_all)
    p, d = statistics.median(pre), statistics.median(dec)
    return {"measured": {"prefill_s": sig(p), "decode_s": sig(d), "total_s": sig(p + d), "ttft_s": sig(p),
                         "tpot_s": sig(d / decode_steps)},
            "samples": {"prefill_s": [sig(x) for x in pre_all], "decode_s": [sig(x) for x in dec_all]},
            "dropped": {"prefill_s": len(pre_all) - len(pre), "decode_s": len(dec_all) - len(dec)},
            "spread": {"prefill_s": spread(pre), "decode_s": spread(dec)}}


def bench_run(point: dict) -> dict | None:
    res = [s["result"] for s in point["samples"] if "result" in s]
    if not res:
        return None
    pp = [t for r in res for t in r if t["n_prompt"] > 0 and t["n_gen"] == 0]
    tg = [t for r in res for t in r if t["n_gen"] > 0 and t["n_prompt"] == 0]
    pre_all = [x / 1e9 for t in pp for x in t["samples_ns"]]
    dec_all = [x / 1e9 for t in tg for x in t["samples_ns"]]
    k = point["key"]
    shape = f"p{k['prompt']}" if "prompt" in k else f"d{k['depth']}"  # one_window.py --tiles: the prompt's length
    shape += f" ub{k['ubatch']}" if "ubatch" in k else ""  # one_window.py --ubatch
    return {**phases(pre_all, dec_all, tg[0]["n_gen"]),
            "name": f"{k['model']} {k['format']} t{k['threads']} {shape} (llama-bench)"}


def completion_run(point: dict) -> dict | None:
    """A llama-completion point: prefill = its prompt eval time, decode = its eval time (the
    n_predict - 1 decode steps after the first sampled token), both as the tool prints them; the
    workload is the prompt's token count the tool reports and -n."""
    res = [s["result"] for s in point["samples"] if "result" in s]
    if not res:
        return None
    pre_all = [r["prompt_ms"] / 1e3 for r in res]
    dec_all = [r["eval_ms"] / 1e3 for r in res]
    k = point["key"]
    cmd = point["command"]
    n_predict = int(cmd[cmd.index("-n") + 1])
    if any(r["eval_count"] != n_predict - 1 for r in res) or len({r["prompt_count"] for r in res}) != 1:
        raise SystemExit(f"{point['key']}: eval runs {[r['eval_count'] for r in res]} (expected {n_predict - 1}) or "
                         "prompt counts that differ between samples")
    made = phases(pre_all, dec_all, n_predict - 1)
    made["samples"]["sampling_s"] = [sig(r["sampling_ms"] / 1e3) for r in res]
    return {"workload": {"prompt_len": res[0]["prompt_count"], "gen_len": n_predict}, **made,
            "name": f"{k['model']} {k['format']} t{k['threads']} (llama-completion)"}


def server_run(point: dict) -> dict | None:
    """A llama-server point (server_runs.py): its users' prompts prefilled in one batch and decoded
    together, so a request's prefill is its slowest task's prompt_ms and its decode the slowest
    task's predicted_ms (the -n - 1 decode steps after each slot's first sampled token)."""
    if not point["samples"]:
        return None
    tasks = [t for s in point["samples"] for t in s["tasks"]]
    prompt_n, predicted_n = {t["prompt_n"] for t in tasks}, {t["predicted_n"] for t in tasks}
    if len(prompt_n) != 1 or len(predicted_n) != 1:
        raise SystemExit(f"{point['key']}: tasks of different prompt or generated lengths {prompt_n} {predicted_n}")
    pre_all = [max(t["prompt_ms"] for t in s["tasks"]) / 1e3 for s in point["samples"]]
    dec_all = [max(t["predicted_ms"] for t in s["tasks"]) / 1e3 for s in point["samples"]]
    k = point["key"]
    n = predicted_n.pop()
    return {"workload": {"prompt_len": prompt_n.pop(), "gen_len": n}, **phases(pre_all, dec_all, n - 1),
            "name": f"{k['model']} {k['format']} t{k['threads']} x{k['parallel']} (llama-server)"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--profile", required=True, help="the profile path as the runs file names it (relative to it)")
    ap.add_argument("--only", action="append", metavar="NAME", help="keep only this run (repeatable)")
    ap.add_argument("--points", default="points", help="the raw file's list of points to read (server_runs.py also "
                    "writes completion_again: §1.10's commands in its window)")
    args = ap.parse_args()
    raw = json.loads(args.raw.read_text())
    runs = []
    for point in raw[args.points]:
        k = point["key"]
        made = {"llama-batched-bench": batched_run, "llama-completion": completion_run,
                "llama-server": server_run}.get(k["tool"], bench_run)(point)
        if made is None:
            continue
        run = {"name": made.pop("name"), "engine": "llama.cpp", "from": "llama.cpp",
               "command": short_command(point["command"]),
               "model": f"../../../benchmarks/ground_truth/configs/{k['model']}.json",
               "gguf": f"gguf/{k['model']}-{k['format']}.tensors.json", **made}
        runs.append(run)
    if args.only:
        missing = set(args.only) - {r["name"] for r in runs}
        if missing:
            raise SystemExit(f"--only: no run named {sorted(missing)}")
        runs = [r for r in runs if r["name"] in args.only]
    doc = {"hardware": args.profile, "engine_version": ENGINE_VERSION, "host": raw.get("host"),
           "measured_between": [raw.get("started"), raw.get("finished")], "runs": runs}
    header = ("# three runs of one model file, as a user has them: hrm calibrate's example (docs/calibrate.md)\n"
              if args.only else "") + ("# Real llama.cpp runs on this project's CPU machine (benchmarks/ground_truth/llama_cpu_runs.py):\n"
              "# each run's exact command (paths reduced to file names), medians of its samples, the samples\n"
              "# and their spread. Predicted by hrm.export.llama_tools + hrm.cost.ggml_cpu on `hardware`\n"
              "# (tests/test_ground_truth_llamacpp.py; docs/validation/ground_truth.md).\n")
    args.out.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=120))
    print(f"{len(runs)} runs -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
