"""Before/after of `benchmarks/engines_bench.py --md`: per hardware, workload and engine, the
generation throughput of each run, their ratio, and each run's largest --explain shares.

Run: python benchmarks/engines_bench_delta.py BEFORE.md AFTER.md  (each the --md output of
engines_bench.py at one commit; rows are matched by hardware, workload and engine)
"""

from __future__ import annotations

import sys


def rows(path: str) -> dict[tuple[str, str, str], tuple[float, str, str]]:
    """(hw, workload, engine) -> (gen tok/s, policy, largest mechanisms) of one --md table."""
    out = {}
    for line in open(path, encoding="utf-8"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 8 or cells[0] in ("hw", "---"):
            continue
        try:
            tok_s = float(cells[3].replace(",", ""))
        except ValueError:
            continue
        out[(cells[0], cells[1], cells[2])] = (tok_s, cells[5], cells[7])
    return out


def main(before_path: str, after_path: str) -> None:
    before, after = rows(before_path), rows(after_path)
    print("| hw | workload | engine | before tok/s | after tok/s | after/before | before: largest shares | "
          "after: largest shares |")
    print("|---|---|---|---|---|---|---|---|")
    for key in after:
        if key not in before:
            print(f"| {' | '.join(key)} | - | {after[key][0]:,.1f} | new | - | {after[key][2]} |")
            continue
        (b, _, b_mech), (a, _, a_mech) = before[key], after[key]
        print(f"| {' | '.join(key)} | {b:,.1f} | {a:,.1f} | {a / b:.2f}x | {b_mech} | {a_mech} |")
    for key in before.keys() - after.keys():
        print(f"| {' | '.join(key)} | {before[key][0]:,.1f} | - | gone | {before[key][2]} | - |")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
