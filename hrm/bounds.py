"""Plausible ranges of the numbers that enter the toolkit (issue 11: one validation boundary).

Every number a user can give — a hardware-profile field, a workload length, a policy value,
a CLI flag, a field of a plan file — must be finite and inside a plausible range for its
unit, or the input is refused with one line naming the field. The ranges are the named
constants below, each with the reason for its value; a :class:`Range` ties one to a unit and
serves all three entry points:

- ``Range.type`` — a pydantic ``Annotated`` type for the frozen models (``hrm.machine.hardware``,
  ``hrm.workload``, ``hrm.policy``, ``hrm.plan``): the invariant lives on the model;
- ``Range.flag(name)`` — an argparse ``type=`` that validates through the same range;
- ``Range.check(value, what)`` — the same test for a value computed in code (HRMError).

Booleans are not numbers here (``cores: true`` is refused), nor are strings (YAML 1.1 reads
``1e3`` without a dot as text: the message says so).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Annotated

from pydantic import BeforeValidator, Field, WithJsonSchema

from .errors import HRMError

# --- memory -----------------------------------------------------------------------------
#: no GPU has more than a few hundred GiB (B200: 180 GiB); 4 TiB per GPU catches 1000x unit slips
MAX_GPU_MEMORY_GIB = 4096.0
#: the largest single hosts hold 32 TiB of DRAM; 64 TiB catches a 1000x slip of a 192 GiB host
MAX_CPU_MEMORY_GIB = 65536.0
#: nothing that runs an LLM has under 10 MiB; catches 1e-300 and underflows
MIN_MEMORY_GIB = 0.01
#: a plan must be allowed at least 1% of a memory; below that no policy is meaningful
MIN_MEMORY_UTILIZATION = 0.01

# --- rates ------------------------------------------------------------------------------
#: 10 MB/s is slower than any disk, link or memory bus an LLM is offloaded over
MIN_BANDWIDTH_GBPS = 0.01
#: HBM3e is ~8 TB/s; 100 TB/s catches 1000x slips (MB/s written as GB/s)
MAX_BANDWIDTH_GBPS = 100_000.0
#: 1 MFLOP/s is slower than any computer since the 1980s; catches 1e-300 and sign slips
MIN_TFLOPS = 1e-6
#: the fastest single device is ~10 PFLOP/s dense (B200 FP4); 100 PFLOP/s catches 1000x slips (GFLOP/s as
#: TFLOP/s) of every tensor-core rate (>= 100 TFLOP/s) and leaves room for measured peaks
MAX_TFLOPS = 100_000.0
#: the slowest link a GPU is attached by is PCIe 1.0 x1 (0.25 GB/s); a PCIe 3.0 x16 link written
#: in MB/s as GB/s (16 -> 0.016) is 1000x slower and is refused (override: reassign before import
#: of hrm.machine.hardware)
MIN_LINK_GBPS = 0.25
#: a measured matmul curve point may exceed its dtype's peak by the rounding of both (the
#: profiler writes the peak as the curve's best point); more is a curve of another dtype or unit
CURVE_PEAK_TOLERANCE = 0.01
#: a kernel launch or an operator dispatch costs microseconds to milliseconds; a second means ms written as s
MAX_DISPATCH_S = 1.0
#: efficiency curves: matmul rows M (or legacy bytes / tokens) and rates, finite and below 1e15
MAX_CURVE_VALUE = 1e15

# --- counts -----------------------------------------------------------------------------
#: the largest shared-memory hosts have a few thousand cores; 4096 catches typos, not machines
MAX_CORES = 4096
#: NUMA nodes of one host (the largest have 32)
MAX_NUMA_NODES = 256
#: GPUs in one tensor-parallel group: 1024 is beyond any single NVLink/PCIe domain (NVL72: 72)
MAX_GPU_COUNT = 1024

# --- workload and policy ----------------------------------------------------------------
#: prompt + generated tokens of one sequence: the longest context windows are 10M tokens (Llama 4 Scout)
MAX_CONTEXT_TOKENS = 1 << 24
#: generated tokens per request: above the longest context window of the catalog (DeepSeek-V2-Lite,
#: 163840 tokens); a search sums the decode steps in closed form, so 2^18 stays in seconds, and it
#: catches --gen-len 1000000000 (a 447 GiB request); each model's own window is checked too
MAX_GEN_TOKENS = 1 << 18
#: sequences in one batch (N, mu, n, --max-batch, --requests): a million sequences' KV caches
#: exceed every host; the search's default cap is 16384
MAX_BATCH_SIZE = 1 << 20
#: hrm-search --max-batch: 4x the default cap (16384); the exact search's time grows faster than the
#: cap (2^17 takes a minute, 2^20 minutes and GiBs)
MAX_SEARCH_BATCH = 1 << 16

# --- CLI knobs --------------------------------------------------------------------------
#: alternatives printed by hrm-search --top (one per micro-batch/placement mode at most)
MAX_TOP = 1000
#: PNG resolution: print quality is 300-600 dpi; beyond, a figure runs to hundreds of megapixels
MAX_DPI = 600
#: CPU scaling factors of hrm plot policy-map: 1000x faster or slower is no longer a what-if
MIN_SCALE, MAX_SCALE = 1e-3, 1e3
#: seeds of the runtime's random weights and prompts: what numpy/torch accept
MAX_SEED = 2**32 - 1
#: hrm validate runs every policy in the pure-PyTorch reference runtime, --repeats times: beyond a few
#: thousand tokens per request one validation takes hours
MAX_VALIDATE_PROMPT_TOKENS = 8192
MAX_VALIDATE_GEN_TOKENS = 4096
#: timed runs per policy (hrm validate --repeats)
MAX_REPEATS = 100
#: policies of hrm validate --policies (each is a full runtime run)
MAX_POLICIES = 100
#: hrm profile --budget: a day is the longest measurement anyone waits for
MAX_BUDGET_S = 86_400.0
#: seconds a solver may have taken (a plan's solver.seconds): a week
MAX_SOLVER_S = 7 * 86_400.0


def _fmt(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def kind_of(value) -> str:
    """A value's kind for a message: 'a boolean', 'a string', 'a list', ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, Real):
        return f"the number {value!r}"
    return f"a {type(value).__name__}"


def strict_bool(value):
    """A boolean field: true/false only (not 1, "yes" or null); numpy booleans are booleans."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    if isinstance(value, str):  # YAML 1.2 (hrm.errors.StrictLoader): yes/no/on/off are text
        raise ValueError(f"expected true or false, got the string {value[:40]!r}")
    raise ValueError(f"expected true or false, got {kind_of(value)}")


#: a boolean field that refuses 0/1 and strings (pydantic's lax bool takes "yes" and 1)
Flag = Annotated[bool, BeforeValidator(strict_bool)]

# --- names ------------------------------------------------------------------------------
#: characters of a name or a label: NAME_MAX of Linux file systems (a profile or engine name
#: may become part of a file name); a device name is a few dozen (override: assign before
#: the models are built)
MAX_NAME_CHARS = 255


def name_refusal(value, identifier: bool = False) -> str | None:
    """Why ``value`` is not a plain name (None if it is): one line of printable text, not
    blank, at most :data:`MAX_NAME_CHARS`; an ``identifier`` (a profile or engine name, which
    plans record and exports may put in file names) also has no folder separator and does
    not start with a dot."""
    if not isinstance(value, str):
        return f"expected a name (text), got {kind_of(value)}"
    if not value.strip():
        return "empty name"
    if len(value) > MAX_NAME_CHARS:
        return f"a name of {len(value)} characters (at most {MAX_NAME_CHARS})"
    if not value.isprintable():
        bad = next(c for c in value if not c.isprintable())
        return f"control character {bad!r} in the name {value[:40]!r} (one line of printable text)"
    if identifier and ("/" in value or "\\" in value or value.startswith(".")):
        return f"{value!r} is a path, not a name (no '/', '\\' or leading '.')"
    return None


def _checked_name(identifier: bool):
    def check(value):
        refusal = name_refusal(value, identifier)
        if refusal:
            raise ValueError(refusal)
        return value

    return check


#: a profile's or an engine's name (identifier: no path)
Name = Annotated[str, BeforeValidator(_checked_name(True))]
#: a device's name or another label (printable text of one line)
Label = Annotated[str, BeforeValidator(_checked_name(False))]


@dataclass(frozen=True)
class Range:
    """A plausible range ``[lo, hi]`` (``lo`` excluded when ``lo_open``) of one unit."""

    lo: float
    hi: float
    unit: str = ""
    integer: bool = False
    lo_open: bool = False
    why: str = ""

    def _unit(self) -> str:
        return f" {self.unit}" if self.unit else ""

    def describe(self) -> str:
        left = "(" if self.lo_open else "["
        return f"{left}{_fmt(self.lo)}, {_fmt(self.hi)}]{self._unit()}"

    def refusal(self, value) -> str | None:
        """Why ``value`` is not a plausible number of this range (None if it is)."""
        if isinstance(value, bool) or not isinstance(value, Real):
            if isinstance(value, str):
                try:
                    float(value)
                except ValueError:
                    return f"expected a number, got a string {value!r}"
                if "_" in value:
                    return (f"expected a number, got the string {value!r} (digit separators '_' are not read "
                            f"as numbers; write {value.replace('_', '')})")
                return (f"expected a number, got the string {value!r} (YAML 1.1 reads 1e3 without a dot as text; "
                        f"write 1.0e3)")
            return f"expected {'an integer' if self.integer else 'a number'}, got {kind_of(value)}"
        try:
            number = float(value)
        except OverflowError:
            number = math.inf if value > 0 else -math.inf
        if not math.isfinite(number):
            return f"{value} is not a finite number"
        if self.integer and not isinstance(value, Integral) and not number.is_integer():
            return f"expected an integer, got {_fmt(number)}"
        if number < self.lo or (self.lo_open and number <= self.lo):
            bound = "above" if self.lo_open else "at least"
            return f"{_fmt(value)}{self._unit()} must be {bound} {_fmt(self.lo)}{self._unit()}"
        if number > self.hi:
            why = f" ({self.why})" if self.why else ""
            return f"{_fmt(value)}{self._unit()} is above the plausible maximum {_fmt(self.hi)}{self._unit()}{why}"
        return None

    def convert(self, value):
        return int(value) if self.integer else float(value)

    def check(self, value, what: str):
        """``value`` as int/float, or HRMError ``what: reason``."""
        refusal = self.refusal(value)
        if refusal:
            raise HRMError(f"{what}: {refusal}")
        return self.convert(value)

    def _validate(self, value):
        refusal = self.refusal(value)
        if refusal:
            raise ValueError(refusal)
        return self.convert(value)

    @property
    def type(self):
        """A pydantic type: a finite number in this range (bools and strings refused)."""
        schema = {"type": "integer" if self.integer else "number",
                  ("exclusiveMinimum" if self.lo_open else "minimum"): self.lo, "maximum": self.hi}
        base = int if self.integer else float
        return Annotated[base, BeforeValidator(self._validate), WithJsonSchema(schema)]

    def field(self, **kw):
        """``Field(...)`` with a description of the range (for defaults)."""
        return Field(description=f"plausible range {self.describe()}", **kw)

    def flag(self, name: str):
        """An argparse ``type=`` for flag ``name`` that validates through this range."""

        def parse(text: str):
            text = text.strip()
            try:
                value = parse_number(text, self.integer)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"expected {'an integer' if self.integer else 'a number'}, got {text!r}") from None
            refusal = self.refusal(value)
            if refusal:
                raise argparse.ArgumentTypeError(refusal)
            return value

        parse.__name__ = name
        return parse


def parse_number(text: str, integer: bool) -> int | float:
    """``text`` as an int or float, read as the YAML files are (hrm.errors' loader): Python's
    ``1_000`` digit groups are refused (ValueError), so a flag and a file agree on a number."""
    if "_" in text:
        raise ValueError(f"digit groups ('_') are not numbers here: {text!r}")
    return int(text) if integer else float(text)


# --- the ranges the models and flags use ------------------------------------------------
GPU_MEMORY_GIB = Range(MIN_MEMORY_GIB, MAX_GPU_MEMORY_GIB, "GiB", why="per GPU; a 1000x unit slip?")
CPU_MEMORY_GIB = Range(MIN_MEMORY_GIB, MAX_CPU_MEMORY_GIB, "GiB", why="a 1000x unit slip?")
#: a --gpu-mem total over several GPUs (checked per GPU against the profile in hrm.cost.memory)
TOTAL_GPU_MEMORY_GIB = Range(MIN_MEMORY_GIB, MAX_GPU_MEMORY_GIB * MAX_GPU_COUNT, "GiB")
MEMORY_UTILIZATION = Range(MIN_MEMORY_UTILIZATION, 1.0, why="a fraction of the capacity")
BANDWIDTH_GBPS = Range(MIN_BANDWIDTH_GBPS, MAX_BANDWIDTH_GBPS, "GB/s", why="a 1000x unit slip (MB/s vs GB/s)?")
LINK_GBPS = Range(MIN_LINK_GBPS, MAX_BANDWIDTH_GBPS, "GB/s", why="a 1000x unit slip (MB/s vs GB/s)?")
TFLOPS = Range(MIN_TFLOPS, MAX_TFLOPS, "TFLOP/s", why="a 1000x unit slip (GFLOP/s vs TFLOP/s)?")
DISPATCH_S = Range(0.0, MAX_DISPATCH_S, "s", why="milliseconds written as seconds?")
CURVE_VALUE = Range(0.0, MAX_CURVE_VALUE, lo_open=True)
FRACTION = Range(0.0, 1.0)
POSITIVE_FRACTION = Range(0.0, 1.0, lo_open=True)
CORES = Range(1, MAX_CORES, integer=True, why="cores of one host")
NUMA_NODES = Range(1, MAX_NUMA_NODES, integer=True)
GPU_COUNT = Range(1, MAX_GPU_COUNT, integer=True, why="GPUs of one tensor-parallel group")
TOKENS = Range(1, MAX_CONTEXT_TOKENS, "tokens", integer=True, why="context window of one sequence")
GEN_TOKENS = Range(1, MAX_GEN_TOKENS, "tokens", integer=True, why="tokens generated per request")
#: llama.cpp's -n: a count, or -1 (no limit) / -2 (until the context is full): common/arg.cpp:1657-1667
GEN_TOKENS_OR_UNLIMITED = Range(-2, MAX_GEN_TOKENS, "tokens", integer=True, why="tokens generated per request")
CONTEXT_TOKENS = Range(1, MAX_CONTEXT_TOKENS, "tokens", why="cached tokens of one sequence")
SEQUENCES = Range(1, MAX_BATCH_SIZE, integer=True, why="sequences of one batch")
SEARCH_BATCH = Range(1, MAX_SEARCH_BATCH, integer=True, why="the search's time grows with its batch cap")
#: layers of offloaded weights an engine buffers: the deepest published decoders have ~130 layers
MAX_BUFFER_LAYERS = 1024
BUFFER_LAYERS = Range(0, MAX_BUFFER_LAYERS, "layers", why="layers of weights one buffer holds")
#: memory an engine reserves outside its tensors (CUDA context, the process): a few GiB
RESERVED_GIB = Range(0.0, 64.0, "GiB", why="memory a process reserves beside its tensors")
COPY_THREADS = Range(0, MAX_CORES, integer=True, why="threads of one host (0: the profile's cores)")
COUNT = Range(0, 2**53, integer=True)
#: host-side operator calls of one layer: the heaviest engine counted issues ~170 (docs/engines/op_counts.md)
MAX_LAYER_OPS = 10_000.0
LAYER_OPS = Range(0.0, MAX_LAYER_OPS, "ops", why="operator calls of one layer")
INDEX = Range(0, 2**31 - 1, integer=True)
SECONDS = Range(0.0, MAX_SOLVER_S, "s")
NON_NEGATIVE = Range(0.0, 1e300)
TOP = Range(0, MAX_TOP, integer=True)
DPI = Range(1, MAX_DPI, integer=True)
SCALE = Range(MIN_SCALE, MAX_SCALE)
SEED = Range(0, MAX_SEED, integer=True)
#: a simulated load's requests: each one's steps are priced, so a few thousand take seconds
MAX_LOAD_REQUESTS = 10_000
LOAD_REQUESTS = Range(1, MAX_LOAD_REQUESTS, integer=True, why="requests of one simulated load")
#: arrivals per second of a load: above a few thousand a server is only ever saturated
REQUEST_RATE_PER_S = Range(0.0, 10_000.0, "requests/s", lo_open=True)
VALIDATE_PROMPT_TOKENS = Range(1, MAX_VALIDATE_PROMPT_TOKENS, "tokens", integer=True, why="a validation run")
VALIDATE_GEN_TOKENS = Range(2, MAX_VALIDATE_GEN_TOKENS, "tokens", integer=True,
                            why="a validation run compares decode steps: at least one after the prefill")
REPEATS = Range(1, MAX_REPEATS, integer=True)
POLICIES = Range(1, MAX_POLICIES, integer=True)
BUDGET_S = Range(0.0, MAX_BUDGET_S, "s", lo_open=True)
ROUTER_SKEW = Range(0.0, 100.0, why="beyond, the bias alone picks the top-k")
LATENCY_MS = Range(0.0, MAX_BUDGET_S * 1e3, "ms", lo_open=True, why="a day per token")
