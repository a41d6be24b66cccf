"""``--compare``: a measured profile next to a reference profile, field by field."""

from __future__ import annotations

from hrm.machine.hardware import HardwareProfile

COMPARED_FIELDS = (
    "cpu.name", "cpu.cores", "cpu.memory_gib", "cpu.memory_bandwidth_gbps", "cpu.tflops.fp32", "cpu.tflops.bf16",
    "cpu.memcpy_one_thread_gbps", "cpu.memcpy_all_threads_gbps", "cpu.numa_nodes",
    "gpu.name", "gpu.count", "gpu.architecture", "gpu.memory_gib", "gpu.memory_bandwidth_gbps", "gpu.tflops.fp32",
    "gpu.tflops.fp16", "gpu.tflops.bf16", "gpu.tflops.int8", "gpu.gpu_to_gpu_gbps",
    "link.h2d_gbps", "link.d2h_gbps", "link.h2d_pageable_gbps", "link.d2h_pageable_gbps", "link.p2p",
    "disk.read_gbps",
)


def field_value(data: dict, dotted: str):
    """``data['a']['b']`` for ``'a.b'``; None when any part is missing."""
    value = data
    for part in dotted.split("."):
        if not isinstance(value, dict) or value.get(part) is None:
            return None
        value = value[part]
    return value


def comparison_rows(measured: HardwareProfile, reference: HardwareProfile) -> list[tuple[str, object, object, float | None]]:
    """(field, measured, reference, measured/reference) for every field present in either."""
    mine, theirs = measured.model_dump(mode="json"), reference.model_dump(mode="json")
    rows = []
    for name in COMPARED_FIELDS:
        a, b = field_value(mine, name), field_value(theirs, name)
        if a is None and b is None:
            continue
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b)) and b != 0
        rows.append((name, a, b, (a / b) if numeric else None))
    return rows


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def comparison_table(measured: HardwareProfile, reference: HardwareProfile):
    """A rich Table: field | measured | reference | ratio."""
    from rich.table import Table
    from rich.text import Text

    # rich Text, never markup: the names and the CPU/GPU names are the user's
    table = Table(title=Text(f"measured ({measured.name}) vs reference ({reference.name})"))
    table.add_column("field", no_wrap=True)
    table.add_column("measured", justify="right", overflow="fold")
    table.add_column("reference", justify="right", overflow="fold")
    table.add_column("measured/ref", justify="right")
    for name, a, b, ratio in comparison_rows(measured, reference):
        table.add_row(*(Text(cell) for cell in (name, _cell(a), _cell(b), "-" if ratio is None else f"{ratio:.2f}x")))
    return table
