"""``hrm profile --llama-cpp DIR``: llama.cpp's CPU kernels measured on this host.

The probe (``ggml_kernels.cpp``, hrm's own code) is compiled against the user's llama.cpp tree
(its ``ggml/include`` headers and the libraries its CMake build put in ``build/bin``) and times
ggml's CPU matmuls per weight type, op and thread count (docs/model.md §4.10): the rate
llama.cpp's CPU experts and dense weights really run at on this machine, where a datasheet or a
numpy GEMM would say something else. Without a tree nothing is measured and the ``ggml_cpu``
section is absent (llama.cpp CPU predictions then refuse, saying what to run).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hrm.cost.ggml_elementwise import ELEMENTWISE_KINDS
from hrm.errors import HRMError
from hrm.machine.hardware import CurvePoint, GgmlCpu, GgmlKernel

PROBE_SOURCE = Path(__file__).resolve().with_name("ggml_kernels.cpp")
#: weight types llama.cpp's common GGUF files use for their matrices (f16 and Q8_0 files,
#: and the K-quant mixes: Q4_K_M puts q4_K, q5_K, q6_K, q5_0 and q8_0 tensors side by side,
#: src/llama-quant.cpp); ``--ggml-types`` changes the list
DEFAULT_TYPES = ("f16", "q8_0", "q4_K", "q5_K", "q6_K", "q5_0", "q4_0", "f32")
#: rows (tokens per weight matrix) measured: one user's decode (1) to a 512-token prompt ubatch
#: (llama.cpp's default -ub, common/common.h:455); experts see rows / (experts touched)
MM_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 512)
MMID_ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
#: cached tokens the flash-attention probe attends over (f16 K/V, llama.cpp's default cache type)
FA_CONTEXTS = (128, 512, 1024, 4096)
#: head shapes DK:DV:HEADS:KV_HEADS the flash-attention probe measures (its per-element cost
#: moves with them: up to 2x between these on one host): grouped heads of 64 and 128 (Mixtral,
#: Qwen3, Llama), MLA's latent of 512 + 64 rope (DeepSeek-V2/V3, Kimi-K2) and of 256 + 32 (the
#: ground-truth DeepSeek-V2 at reduced width)
FA_SHAPES = ("64:64:16:4", "128:128:16:4", "576:512:16:1", "288:256:16:1")
#: smaller weight pools: the probe cycles its pool, so a pool is its weights' reuse distance, and
#: the rate against it is the last-level cache's curve that the step model reads each tensor's
#: reuse distance on (hrm.cost.ggml_cpu.reuse_distances_mib). Spaced around the 32-128 MiB where this
#: project's VM turns from cache to DRAM (docs/validation/ground_truth.md); past
#: SMALL_POOL_ROWS[-1] rows a matmul is compute-bound and the pool no longer matters
SMALL_POOLS_MIB = (16.0, 32.0, 48.0, 64.0, 96.0, 128.0, 256.0)
SMALL_POOL_ROWS = (1, 2, 4, 8, 16)
#: the weight pool each kernel cycles through: larger than the caches' share a VM is likely to
#: get, as a model's weights are (a step reads each weight once, cold)
DEFAULT_POOL_MIB = 1024.0
#: tokens the elementwise probe measures its kinds over (hrm.cost.ggml_elementwise): one user's
#: decode to a 512-token prompt ubatch
EW_ROWS = (1, 4, 16, 64, 128, 512)
#: graph nodes the node-cost probe chains
NODE_PROBE_NODES = 4000
DEFAULT_REPEATS = 5
#: environment variable naming the llama.cpp tree when ``--llama-cpp`` is not given
TREE_ENV = "HRM_LLAMA_CPP"


@dataclass(frozen=True)
class ProbePoint:
    rows: int
    s_per_elem: float
    spread: float
    buffer: str


def llama_cpp_tree(path: Optional[str | Path]) -> Path:
    """The llama.cpp source tree with a CPU build (``ggml/include/ggml.h``, ``build/bin/libggml-cpu.*``);
    one line HRMError naming what is missing."""
    if path is None:
        path = os.environ.get(TREE_ENV)
        if not path:
            raise HRMError(f"--llama-cpp: no llama.cpp tree given (or ${TREE_ENV})")
    tree = Path(path).expanduser().resolve()
    if not (tree / "ggml" / "include" / "ggml.h").is_file():
        raise HRMError(f"--llama-cpp {path}: no ggml/include/ggml.h (not a llama.cpp source tree)")
    if not list((tree / "build" / "bin").glob("libggml-cpu.*")):
        raise HRMError(f"--llama-cpp {path}: no build/bin/libggml-cpu.* (build it with cmake -B build && "
                       f"cmake --build build, shared libraries as by default)")
    return tree


def build_probe(tree: Path, cache_dir: Optional[Path] = None) -> Path:
    """Compile the probe against ``tree`` (cached by the source's and tree's hash)."""
    compiler = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if compiler is None:
        raise HRMError("--llama-cpp: no C++ compiler (g++, c++ or clang++) on PATH to build the kernel probe")
    key = hashlib.sha256(PROBE_SOURCE.read_bytes() + str(tree).encode()).hexdigest()[:16]
    cache = cache_dir or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hrm"
    cache.mkdir(parents=True, exist_ok=True)
    exe = cache / f"ggml_kernels-{key}"
    if exe.exists():
        return exe
    lib = tree / "build" / "bin"
    cmd = [compiler, "-O2", "-std=c++17", f"-I{tree / 'ggml' / 'include'}", str(PROBE_SOURCE), "-o", str(exe) + ".tmp",
           f"-L{lib}", "-lggml", "-lggml-base", "-lggml-cpu", f"-Wl,-rpath,{lib}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise HRMError(f"--llama-cpp {tree}: the kernel probe did not compile: {done.stderr.strip().splitlines()[-1:]}")
    os.replace(str(exe) + ".tmp", exe)
    return exe


def parse_probe(stdout: str) -> list[ProbePoint]:
    """The probe's lines: ``rows R s_per_elem S spread X nodes M buffer B``."""
    points = []
    for line in stdout.splitlines():
        words = line.split()
        if len(words) == 10 and words[0] == "rows":
            points.append(ProbePoint(int(words[1]), float(words[3]), float(words[5]), words[9]))
    return points


def run_probe(exe: Path, ggml_type: str, threads: int, op: str, rows: tuple[int, ...], pool_mib: float,
              repeats: int, plain_buffer: bool = False, head_shape: Optional[str] = None) -> list[ProbePoint]:
    """One probe run; ``plain_buffer``: the weights in the plain CPU buffer (HRM_PROBE_NO_REPACK), as
    llama.cpp keeps CPU experts beside a GPU; ``head_shape`` "K:N:HEADS": a MUL_MAT of one [K x N]
    matrix per head over permuted activations (HRM_PROBE_K/N/HEADS), as MLA's absorbed k_b / v_b."""
    cmd = [str(exe), ggml_type, str(threads), op, f"{pool_mib:g}", str(repeats), ",".join(map(str, rows))]
    env = {**os.environ, "HRM_PROBE_NO_REPACK": "1"} if plain_buffer else None
    if head_shape is not None:
        k, n, h = head_shape.split(":")
        env = {**(env or os.environ), "HRM_PROBE_K": k, "HRM_PROBE_N": n, "HRM_PROBE_HEADS": h}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    points = parse_probe(done.stdout)
    if done.returncode != 0 or len(points) != len(rows):
        raise HRMError(f"--llama-cpp: the kernel probe failed for {ggml_type} {op} at {threads} threads "
                       f"(exit {done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    return points


#: a matmul's seconds per element cannot fall by this factor when its rows grow (more rows is
#: more work per weight): a point that does was disturbed and is measured again
BUMP_FACTOR = 1.3


def remeasured(exe: Path, ggml_type: str, threads: int, op: str, points: list[ProbePoint], pool_mib: float,
               repeats: int, plain_buffer: bool = False) -> list[ProbePoint]:
    """``points`` with every bump (a point above BUMP_FACTOR x the next one) measured again,
    keeping the lower of the two medians (another process's work only ever adds time)."""
    bumps = tuple(a.rows for a, b in zip(points, points[1:]) if a.s_per_elem > BUMP_FACTOR * b.s_per_elem)
    if not bumps:
        return points
    again = {p.rows: p for p in run_probe(exe, ggml_type, threads, op, bumps, pool_mib, repeats, plain_buffer)}
    return [again[p.rows] if p.rows in again and again[p.rows].s_per_elem < p.s_per_elem else p for p in points]


def per_head_shapes(paths) -> list[tuple[str, str]]:
    """Every (probe type, "K:N:HEADS") of the per-head weights (``GgufTensor.per_head_shape``) of
    the GGUF files (or committed tensor tables) at ``paths``, once each, sorted."""
    from hrm.cost.ggml_cpu import probe_type
    from hrm.model.gguf import read_inventory

    return sorted({(probe_type(t.ggml_type), t.per_head_shape) for path in paths
                   for t in read_inventory(path).tensors if t.per_head_shape is not None})


#: rows of a per-head matmul: one token to a 512-token ubatch (a stream's tokens for v_b)
PER_HEAD_ROWS = (1, 4, 16, 32, 128, 512)


def measure_per_head(exe: Path, threads: int, repeats: int, shapes: list[tuple[str, str]],
                     pool_mib: float = DEFAULT_POOL_MIB) -> tuple[list[GgmlKernel], dict[str, str]]:
    """MLA's per-head matmuls (hrm.model.gguf ``GgufTensor.per_head_shape``): for each (ggml type,
    "K:N:HEADS") the probe's MUL_MAT of a [K, N, HEADS] weight over activations [K, HEADS, rows]
    permuted to [K, rows, HEADS] (src/models/deepseek2.cpp:556-560, src/llama-graph.cpp:2678-2679), in
    the plain CPU buffer a 3-D weight stays in (ggml-cpu/repack.cpp:5191-5196); op ``mmh``."""
    kernels, methods = [], {}
    for ggml_type, shape in shapes:
        points = run_probe(exe, ggml_type, threads, "mm", PER_HEAD_ROWS, pool_mib, repeats, head_shape=shape)
        kernels.append(GgmlKernel(type=ggml_type, op="mmh", threads=threads, buffer=points[0].buffer, shape=shape,
                                  s_per_elem_vs_rows=[CurvePoint(x=p.rows, y=p.s_per_elem) for p in points]))
        methods[f"ggml_cpu.kernels.{ggml_type}.mmh.{shape}.{threads}"] = (
            f"MUL_MAT of one [K x N] {ggml_type} matrix per head, K:N:HEADS = {shape}, over activations permuted "
            f"as MLA's absorbed k_b / v_b are, {points[0].buffer} buffer, cycled through {pool_mib:g} MiB, "
            f"{threads} threads; seconds per weight element, median of {repeats}")
    return kernels, methods


def measure_elementwise(exe: Path, threads: int, repeats: int) -> tuple[list[GgmlKernel], dict[str, str]]:
    """The elementwise kinds of a layer's graph (hrm.cost.ggml_elementwise) at ``threads``: their
    curves and ``source.methods`` lines."""
    kernels, methods = [], {}
    for kind in ELEMENTWISE_KINDS:
        points = run_probe(exe, "f32", threads, f"ew:{kind}", EW_ROWS, 0, repeats)
        kernels.append(GgmlKernel(type="f32", op=kind, threads=threads, buffer="CPU",
                                  s_per_elem_vs_rows=[CurvePoint(x=p.rows, y=p.s_per_elem) for p in points]))
        methods[f"ggml_cpu.kernels.f32.{kind}.{threads}"] = (
            f"the elementwise op '{kind}' of a layer's graph (profiler/ggml_kernels.cpp ew:{kind}), f32 over "
            f"1024-wide rows, {threads} threads; seconds per output element, median of {repeats}; spread per "
            f"point: " + ", ".join(f"{p.rows}: {p.spread:.0%}" for p in points))
    return kernels, methods


def measure_ggml_cpu(tree: Path, threads: tuple[int, ...], types: tuple[str, ...] = DEFAULT_TYPES,
                     pool_mib: float = DEFAULT_POOL_MIB, repeats: int = DEFAULT_REPEATS,
                     cache_dir: Optional[Path] = None, plain_buffer: bool = False) -> tuple[GgmlCpu, dict[str, str]]:
    """The ``ggml_cpu`` section and its ``source.methods`` lines. ``plain_buffer``: also every kernel
    of a type a CPU-only llama.cpp repacks in the plain CPU buffer, where a GPU host's CPU weights
    and a ``--no-repack`` run's run (hrm.cost.ggml_cpu.placed_kernels)."""
    exe = build_probe(tree, cache_dir)
    kernels, methods, node_s = [], {}, []
    for t in threads:
        node = run_probe(exe, "f32", t, "node", (NODE_PROBE_NODES,), 0, repeats)[0]
        node_s.append(CurvePoint(x=t, y=node.s_per_elem))
        methods[f"ggml_cpu.node_s_vs_threads.{t}"] = (f"a chain of {NODE_PROBE_NODES} tiny ADD nodes on ggml's CPU backend at {t} "
                                          f"threads, time / nodes; median of {repeats}, spread {node.spread:.1%}")
        ew_kernels, ew_methods = measure_elementwise(exe, t, repeats)
        kernels += ew_kernels
        methods.update(ew_methods)
        for op in ("fa1", "fat"):
            for shape in FA_SHAPES:
                points = run_probe(exe, "f16", t, f"{op}:{shape}", FA_CONTEXTS, pool_mib, repeats)
                kernels.append(GgmlKernel(type="f16", op=op, threads=t, buffer="CPU", shape=shape,
                                          s_per_elem_vs_rows=[CurvePoint(x=p.rows, y=p.s_per_elem) for p in points]))
                methods[f"ggml_cpu.kernels.f16.{op}.{shape}.{t}"] = (
                    f"FLASH_ATTN_EXT, {'1 query row' if op == 'fa1' else '64 query rows (the tiled path)'} per head, "
                    f"heads DK:DV:HEADS:KV_HEADS = {shape}, f16 K/V in llama.cpp's cache layout (a cell's heads in one "
                    f"row), 8 layers' caches, {t} threads; seconds per "
                    f"(row x head x cached token x (dk + dv)), median of {repeats}; spread per context: "
                    + ", ".join(f"{p.rows}: {p.spread:.0%}" for p in points))
        for ggml_type in types:
            for op, rows in (("mm", MM_ROWS), ("mmid", MMID_ROWS)):
                what = ("MUL_MAT of [1024 x 1024] weights" if op == "mm" else
                        "MUL_MAT_ID of [1024 x 1024 x 8] experts, top-2, every expert given `rows` tokens")
                for pool in (pool_mib, *SMALL_POOLS_MIB):
                    wanted = rows if pool == pool_mib else tuple(r for r in rows if r <= SMALL_POOL_ROWS[-1])
                    points = remeasured(exe, ggml_type, t, op, run_probe(exe, ggml_type, t, op, wanted, pool, repeats),
                                        pool, repeats)
                    kernels.append(GgmlKernel(type=ggml_type, op=op, threads=t, buffer=points[0].buffer,
                                              pool_mib=None if pool == pool_mib else pool,
                                              s_per_elem_vs_rows=[CurvePoint(x=p.rows, y=p.s_per_elem) for p in points]))
                    methods[f"ggml_cpu.kernels.{ggml_type}.{op}.{t}.{pool:g}"] = (
                        f"{what}, {ggml_type} in the {points[0].buffer} buffer (as llama.cpp places it), cycled "
                        f"through {pool:g} MiB, {t} threads; seconds per weight element, median of {repeats} after a "
                        f"warm-up; spread per point: " + ", ".join(f"{p.rows}: {p.spread:.0%}" for p in points))
                    if plain_buffer and points[0].buffer != "CPU":
                        plain = remeasured(exe, ggml_type, t, op, run_probe(exe, ggml_type, t, op, wanted, pool,
                                                                            repeats, plain_buffer=True), pool, repeats,
                                           plain_buffer=True)
                        kernels.append(GgmlKernel(type=ggml_type, op=op, threads=t, buffer="CPU",
                                                  pool_mib=None if pool == pool_mib else pool,
                                                  s_per_elem_vs_rows=[CurvePoint(x=p.rows, y=p.s_per_elem)
                                                                      for p in plain]))
                        methods[f"ggml_cpu.kernels.{ggml_type}.{op}.{t}.{pool:g}.CPU"] = (
                            f"{what}, {ggml_type} in the plain CPU buffer (HRM_PROBE_NO_REPACK: where llama.cpp keeps "
                            f"CPU weights beside a GPU, or with --no-repack), cycled through {pool:g} MiB, {t} threads; "
                            f"median of {repeats}")
    section = GgmlCpu(llama_cpp=str(tree), pool_mib=pool_mib, node_s_vs_threads=node_s, kernels=tuple(kernels))
    return section, methods
