"""``hrm fit``: the fastest llama.cpp command for a machine (a profile, or catalog parts), a
model (catalog name or config.json; a GGUF on a CPU-only machine) and a context length
(:mod:`hrm.analysis.fit`), and the same answer for ollama, vLLM and SGLang + kTransformers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hrm import bounds
from hrm.errors import HRMError
from hrm_cli.parser import ArgumentParser


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="hrm fit", description=(
        "The fastest llama.cpp command (-ngl, --n-cpu-moe, -c, -b/-ub, -t/-tb, -fa, KV type, -nr on CPU only) for one user or N "
        "parallel users on a machine, with its predicted tok/s, memory per device, why it is the best, the "
        "runners-up, and what it gains over llama.cpp's own fit (fewest CPU layers at the default -ub and -t); then "
        "the same answer for ollama (a Modelfile), vLLM (--cpu-offload-gb) and SGLang + kTransformers (--kt-*): each "
        "engine's best command with its predicted tok/s and memory, or one line saying why it cannot run the model "
        "there."))
    m = p.add_argument_group("machine: a profile, or parts from the catalog (hrm/data/parts)")
    m.add_argument("--hw", help="hardware profile: a YAML path or a shipped name")
    m.add_argument("--gpu", help="a GPU of the catalog (rtx-4090, rx-7900-xtx, ...); omit for CPU only")
    m.add_argument("--gpus", type=bounds.GPU_COUNT.flag("--gpus"), default=1, help="how many of --gpu (default 1)")
    m.add_argument("--cpu", help="a CPU platform of the catalog (ryzen-9-7950x, epyc-9654, ...)")
    m.add_argument("--sockets", type=int, default=1, help="CPU sockets (1 or 2; server platforms)")
    m.add_argument("--ram", type=bounds.CPU_MEMORY_GIB.flag("--ram"), help="host memory, GiB")
    m.add_argument("--cpu-stream-fraction", type=float,
                   help="override the platform class's achieved/datasheet DRAM prior (0-1)")
    p.add_argument("--model", help="catalog name/alias or a config.json path (machines with a GPU)")
    p.add_argument("--weight-dtype", help="override the model's weight dtype (e.g. int4 for a Q4 GGUF)")
    p.add_argument("--weight-format", help="how the weights are stored: a GGUF type (q4_k_m, q6_k, iq1_s, mxfp4, ...); "
                   "alone it also sets the weight dtype its bits imply")
    p.add_argument("--gguf", help="a GGUF file (or hrm tensor table): CPU-only machines are predicted from its tensors")
    p.add_argument("--context", type=bounds.TOKENS.flag("--context"), required=True,
                   help="tokens each user's context holds (prompt + generated)")
    p.add_argument("--gen", type=bounds.GEN_TOKENS.flag("--gen"), default=128,
                   help="tokens generated per request (default 128); the prompt is the rest of the context")
    p.add_argument("--users", type=int, default=1, help="parallel users (default 1: batch 1)")
    p.add_argument("--objective", default="latency", choices=["latency", "decode", "prefill"],
                   help="latency (default): the requests finish first; decode or prefill: that phase's tok/s")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    load = p.add_argument_group("a server's load (CPU-only machines): the llama-server command that serves it best")
    load.add_argument("--rate-per-s", type=bounds.REQUEST_RATE_PER_S.flag("--rate-per-s"),
                      help="requests arriving per second (Poisson), each of --context - --gen prompt and --gen generated "
                           "tokens; with --requests")
    load.add_argument("--requests", type=bounds.LOAD_REQUESTS.flag("--requests"), help="how many requests arrive")
    load.add_argument("--seed", type=bounds.SEED.flag("--seed"), default=0, help="seed of the Poisson arrivals (default 0)")
    load.add_argument("--load-objective", default="p90", choices=["p90", "p50", "makespan"],
                      help="p90 (default) or p50 request latency, or the makespan")
    return p


def machine(args):
    """The profile from --hw, or composed from --gpu/--cpu/--ram."""
    if args.hw and (args.gpu or args.cpu):
        raise HRMError("--hw and --gpu/--cpu: give a profile or parts, not both")
    if args.hw:
        from hrm.machine.hardware import load_hardware

        return load_hardware(args.hw)
    if not args.cpu or args.ram is None:
        raise HRMError("hrm fit: a machine is required: --hw PROFILE, or --cpu NAME --ram GIB [--gpu NAME]")
    from hrm.machine.parts import compose_profile

    return compose_profile(args.gpu, args.cpu, args.ram, args.gpus, args.sockets, args.cpu_stream_fraction)


def run_fit(args):
    from hrm.analysis.fit import fit_cpu, fit_gpu

    hw = machine(args)
    if hw.gpu is None:
        if not args.gguf:
            raise HRMError(f"hrm fit: {hw.name} has no GPU: give --gguf FILE (the CPU step model reads its tensors)")
        from hrm.model.gguf import read_inventory

        if not Path(args.gguf).is_file():
            raise HRMError(f"--gguf {args.gguf}: no such file")
        return hw, fit_cpu(hw, read_inventory(args.gguf), args.context, args.gen, args.users, args.objective)
    if not args.model:
        raise HRMError("hrm fit: --model is required on a machine with a GPU (catalog name or config.json)")
    from hrm.model.spec import load_model

    from hrm_cli.common import with_format_args

    model = with_format_args(load_model(args.model, weight_dtype=args.weight_dtype), args.weight_format,
                             args.weight_dtype)
    return hw, fit_gpu(hw, model, args.context, args.gen, args.users, args.objective)


def run_load_fit(args):
    """(machine, :class:`hrm.analysis.fit_load.LoadFit`) of --rate-per-s / --requests on a CPU-only
    machine (:func:`hrm.analysis.fit_load.fit_cpu_load`): the CLI's and the web page's."""
    from hrm.analysis.fit_load import fit_cpu_load
    from hrm.cost.ggml_server import poisson
    from hrm.model.gguf import read_inventory

    from hrm_cli.common import rate_and_requests_refusal

    refusal = rate_and_requests_refusal(args)
    if refusal:  # the web page's form; the CLI refused it already as a usage error
        raise HRMError(refusal)
    hw = machine(args)
    if hw.gpu is not None or not args.gguf:
        raise HRMError("--rate-per-s / --requests: a load is fitted on a CPU-only machine with --gguf FILE (the "
                       "llama-server loop runs on the CPU step model)")
    if not Path(args.gguf).is_file():
        raise HRMError(f"--gguf {args.gguf}: no such file")
    if args.gen >= args.context:
        raise HRMError(f"--gen {args.gen} must be below --context {args.context}: the prompt is the rest")
    requests = poisson(args.rate_per_s, args.requests, args.context - args.gen, args.gen, seed=args.seed)
    return hw, fit_cpu_load(hw, read_inventory(args.gguf), requests, args.load_objective)


def load_main(args) -> int:
    """--rate-per-s / --requests on a CPU-only machine: :func:`run_load_fit`, printed."""
    from hrm.analysis.fit import MODEL_PLACEHOLDER
    from hrm.analysis.fit_load import load_fit_json, load_fit_lines

    hw, fit = run_load_fit(args)
    model_path = args.gguf or MODEL_PLACEHOLDER
    if args.json:
        print(json.dumps(load_fit_json(fit, hw.name, model_path), indent=2))
        return 0
    print("\n".join(load_fit_lines(fit, hw.name, model_path)))
    for note in fit.notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


def main(argv) -> int:
    from hrm.analysis.fit import MODEL_PLACEHOLDER, fit_json, fit_report

    parser = build_parser()
    args = parser.parse_args(argv)
    from hrm_cli.common import check_rate_and_requests

    check_rate_and_requests(parser, args)
    if args.rate_per_s is not None:
        return load_main(args)
    hw, result = run_fit(args)
    model_path = args.gguf or MODEL_PLACEHOLDER
    if args.json:
        print(json.dumps(fit_json(result, hw.name, model_path), indent=2))
        return 0
    report = fit_report(result, hw.name, model_path)
    print("\n".join(report.lines()))
    for note in report.notes:
        print(f"note: {note}", file=sys.stderr)
    return 0

