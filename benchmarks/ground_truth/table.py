"""docs/validation/ground_truth.md's tables: every committed llama.cpp CPU run, measured against
predicted (no calibration), and leave-out calibration from three runs.

    python benchmarks/ground_truth/table.py [--runs docs/validation/runs/llamacpp-cpu.yaml]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from hrm.analysis.validation import compare_runs, load_runs_file, ratios, summary, worst_factor

ROOT = Path(__file__).resolve().parents[2]


def rows_markdown(comparisons) -> str:
    lines = ["| run | command | prefill measured s | predicted | ratio | decode measured s | predicted | ratio |",
             "|---|---|---|---|---|---|---|---|"]
    for c in comparisons:
        cells = []
        for q in ("prefill_s", "decode_s"):
            if q in c.measured:
                cells += [f"{c.measured[q]:.4g}", f"{c.predicted[q]:.4g}", f"{c.ratio(q):.2f}"]
            else:
                cells += ["-", "-", "-"]
        lines.append(f"| {c.name} | `{c.command}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=str(ROOT / "docs/validation/runs/llamacpp-cpu.yaml"))
    ap.add_argument("--write", metavar="MD", help="write the tables into this markdown file between its markers")
    args = ap.parse_args()
    comparisons = compare_runs(load_runs_file(args.runs))
    s = summary(comparisons)
    print(f"{len(comparisons)} runs, {s['quantities']} quantities: median predicted/measured {s['median_ratio']:.3f}, "
          f"worst {s['worst_factor']:.3f}x, beyond 1.25x: {s['beyond_1_25x']}")
    for q in ("prefill_s", "decode_s"):
        rs = ratios(comparisons, q)
        print(f"  {q}: median {statistics.median(rs):.3f}, min {min(rs):.3f}, max {max(rs):.3f}")
    from hrm.analysis.validation import held_out

    runs_file = load_runs_file(args.runs)
    held = held_out(runs_file, group_of, fitted_of)
    lo = ["| model file | fitted (3 runs) | stream_scale | compute_scale | held-out runs | worst before | worst after |",
          "|---|---|---|---|---|---|---|"]
    for h in held:
        lo.append(f"| {h.group} | {'; '.join(h.fitted)} | {h.calibration.stream_scale:.3f} | "
                  f"{h.calibration.compute_scale:.3f} | {len(h.before) // 2} | {h.worst_before:.3f}x | "
                  f"{h.worst_after:.3f}x |")
    after_all = [r for h in held for r in h.after]
    before_all = [r for h in held for r in h.before]
    lo_summary = (f"Held out, all groups: worst {worst_factor(before_all):.3f}x before, "
                  f"{worst_factor(after_all):.3f}x after; within 1.15x: "
                  f"{sum(max(r, 1 / r) <= 1.15 for r in before_all)} of {len(before_all)} before, "
                  f"{sum(max(r, 1 / r) <= 1.15 for r in after_all)} after.")
    print("\n".join(lo))
    print(lo_summary)
    summary_line = (f"{len(comparisons)} runs, {s['quantities']} measured times: median predicted/measured "
                    f"**{s['median_ratio']:.3f}**, worst **{s['worst_factor']:.3f}x**, "
                    f"{s['beyond_1_25x']} beyond 1.25x.")
    if args.write:
        path = Path(args.write)
        text = path.read_text()
        blocks = {"summary": summary_line, "runs": rows_markdown(comparisons), "held-out": "\n".join(lo) + "\n\n" + lo_summary}
        for key, body in blocks.items():
            start, end = f"<!-- table:{key} -->", f"<!-- /table:{key} -->"
            head, _, rest = text.partition(start)
            _, _, tail = rest.partition(end)
            text = f"{head}{start}\n{body}\n{end}{tail}"
        path.write_text(text)
    return 0



def group_of(run: dict) -> str:
    """One model file: what one user calibrates on (its GGUF)."""
    return run["gguf"].rsplit("/", 1)[-1].replace(".tensors.json", "")


def fitted_of(runs: list[dict]) -> list[int]:
    """Three runs a user would have: one llama-bench line (pp + tg, one user, 2 threads) and two
    batched points (16 sequences at 2 threads, 64 at 1 thread)."""
    names = [r["name"] for r in runs]
    want = ("t2 d0 (llama-bench)", "t2 x16 (batched-bench)", "t1 x64 (batched-bench)")
    return [next(i for i, n in enumerate(names) if n.endswith(w)) for w in want]


if __name__ == "__main__":
    raise SystemExit(main())
