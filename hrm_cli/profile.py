"""``hrm profile``: measure this machine into a hardware profile YAML (docs/model.md §7)."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

from hrm import bounds
from hrm_cli.parser import ArgumentParser
from hrm.errors import HRMError
from hrm.machine.hardware import HardwareProfile, dump_hardware_yaml, load_hardware
from hrm.plan import write_atomic

from profiler.config import full_config, quick_config
from profiler.runner import DEVICES, run_profile

HEADER = ("# Hardware profile measured by `hrm profile` (source.methods says how, per number).\n"
          "# Units: *_gib = 2^30 bytes, *_gbps = 1e9 bytes/s, *_tflops = 1e12 FLOP/s.\n")


def parse_args(argv: list[str]):
    parser = ArgumentParser(prog="hrm profile", description="measure this machine into a hardware profile")
    parser.add_argument("--quick", action="store_true", help="coarse curves, 5 repeats, 40 s budget (under a minute)")
    parser.add_argument("--device", default="auto", choices=DEVICES, help="profile the GPU too (auto), "
                        "only the CPU, or require a CUDA GPU")
    parser.add_argument("--out", help="write the profile YAML here (default: print it on stdout)")
    parser.add_argument("--compare", metavar="PROFILE", help="print measured vs this reference profile")
    parser.add_argument("--name", help="profile name (default measured-<hostname>)")
    parser.add_argument("--budget", type=bounds.BUDGET_S.flag("--budget"), metavar="SECONDS",
                        help=f"override the time budget {bounds.BUDGET_S.describe()}")
    parser.add_argument("--no-disk", action="store_true", help="skip the disk read measurement")
    parser.add_argument("--disk-dir", help="folder for the disk probe file (default: the temp folder)")
    parser.add_argument("--no-progress", action="store_true", help="no progress display")
    parser.add_argument("--llama-cpp", metavar="DIR", help="a llama.cpp source tree with a CPU build (build/bin): "
                        "measure its CPU matmul kernels per weight type and thread count, its flash attention and "
                        "its graphs' elementwise ops (the ggml_cpu section "
                        "llama.cpp CPU predictions use; about 7 minutes per thread count on a 2-core machine), and "
                        "for the weight types llama.cpp repacks also their plain-buffer kernels (a GPU host's CPU "
                        "experts; -nr, which hrm fit searches)")
    parser.add_argument("--ggml-only", metavar="PROFILE", help="with --llama-cpp: add the ggml_cpu section to this "
                        "existing profile instead of measuring the rest again")
    parser.add_argument("--gguf", metavar="FILE", action="append", default=[],
                        help="with --llama-cpp: also measure this GGUF's per-head matmuls (MLA's attn_k_b / attn_v_b, "
                        "DeepSeek and Kimi files) at their own shapes and types; the header is enough (repeatable)")
    return parser.parse_args(argv)


def check_out_path(out: str) -> Path:
    """Fail before measuring when ``--out`` cannot be written (one-line HRMError)."""
    from hrm.plan import check_output_path

    return check_output_path(out, "--out")


def check_disk_dir(disk_dir: str | None) -> Path | None:
    if disk_dir is None:
        return None
    path = Path(disk_dir)
    if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
        raise HRMError(f"--disk-dir {disk_dir}: not a writable folder")
    return path


def profile_yaml(profile: HardwareProfile) -> str:
    """The YAML text written/printed (a units header + dump_hardware_yaml)."""
    return HEADER + dump_hardware_yaml(profile)


def main(argv: list[str]) -> int:
    """Entry point of ``hrm profile``; returns the exit code (HRMError for user errors)."""
    args = parse_args(argv)
    out = check_out_path(args.out) if args.out is not None else None
    if args.name is not None and (not args.name.strip() or not args.name.isprintable()):
        raise HRMError(f"--name: must be a non-empty printable name, got {args.name!r}")
    reference = load_hardware(args.compare) if args.compare else None
    disk_dir = check_disk_dir(args.disk_dir)
    if args.ggml_only is not None and args.llama_cpp is None:
        raise HRMError("--ggml-only: needs --llama-cpp DIR (the tree whose kernels to measure)")
    if args.gguf and args.llama_cpp is None:
        raise HRMError("--gguf: needs --llama-cpp DIR (the tree whose kernels to measure)")
    tree = None
    head_shapes: list[tuple[str, str]] = []
    if args.llama_cpp is not None:
        from profiler.ggml_cpu import llama_cpp_tree, per_head_shapes

        tree = llama_cpp_tree(args.llama_cpp)
        head_shapes = per_head_shapes(args.gguf)
    if args.ggml_only is not None:
        return _add_ggml_section(load_hardware(args.ggml_only), tree, out, head_shapes)
    cfg = quick_config() if args.quick else full_config()
    if args.budget is not None:
        cfg = dataclasses.replace(cfg, budget_s=args.budget)
    if args.no_disk:
        cfg = dataclasses.replace(cfg, disk_bytes=0)

    from hrm_cli.common import console

    err = console(stderr=True)
    if args.no_progress:
        run = run_profile(cfg, device=args.device, disk_folder=disk_dir, name=args.name)
    else:
        from profiler.progress import RichReporter

        # its own console: its notes are rich markup with the message escaped (profiler.progress)
        with RichReporter() as reporter:
            run = run_profile(cfg, device=args.device, reporter=reporter, disk_folder=disk_dir, name=args.name)
    profile = run.profile if tree is None else with_ggml_section(run.profile, tree, head_shapes)
    text = profile_yaml(profile)
    if out is not None:
        write_atomic(out, text)
        load_hardware(str(out))  # the file must read back through the schema
        err.print(f"wrote {out} ({run.elapsed_s:.1f} s)", highlight=False)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    if reference is not None:
        from profiler.compare import comparison_table

        (console() if out is not None else err).print(comparison_table(run.profile, reference))
    return 0


def with_ggml_section(profile: HardwareProfile, tree, head_shapes: list[tuple[str, str]] = ()) -> HardwareProfile:
    """``profile`` with llama.cpp's CPU kernels measured on this host (profiler.ggml_cpu), and the
    per-head matmuls of ``head_shapes`` ((type, "K:N:HEADS"), profiler.ggml_cpu.per_head_shapes)."""
    from hrm.machine.ggml_prior import thread_counts
    from profiler.ggml_cpu import DEFAULT_REPEATS, build_probe, measure_ggml_cpu, measure_per_head

    threads = thread_counts(profile.cpu.cores)
    # the plain buffer's kernels of the types llama.cpp repacks: a GPU host's CPU weights run them (the GPU's
    # pinned host buffer), and so does a CPU-only run with -nr, which hrm fit searches
    section, methods = measure_ggml_cpu(tree, threads, plain_buffer=True)
    if head_shapes:
        exe, kernels = build_probe(tree), list(section.kernels)
        for t in threads:
            measured, lines = measure_per_head(exe, t, DEFAULT_REPEATS, list(head_shapes))
            kernels += measured
            methods = {**methods, **lines}
        section = section.model_copy(update={"kernels": tuple(kernels)})
    source = profile.source.model_copy(update={"methods": {**profile.source.methods, **methods}})
    return profile.model_copy(update={"ggml_cpu": section, "source": source})


def _add_ggml_section(profile: HardwareProfile, tree, out, head_shapes: list[tuple[str, str]] = ()) -> int:
    text = profile_yaml(with_ggml_section(profile, tree, head_shapes))
    if out is None:
        sys.stdout.write(text)
        return 0
    write_atomic(out, text)
    load_hardware(str(out))
    return 0
