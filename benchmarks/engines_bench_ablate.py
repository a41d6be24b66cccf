"""engines_bench.py --md with one of issue 32's model changes undone, to name the mechanism
behind each row that moved (docs/engines_bench_delta.md): the after/ablated ratio of a row is
that change's effect on it.

Run: python benchmarks/engines_bench_ablate.py pageable|launch|buffer [engines_bench.py flags]
  pageable  the pageable-copy default back to pinned / 2.25 (the shipped t4/l4 guesses too)
  launch    the eager per-op cost back to 4 us and the sync bubble to 4.9 us
  buffer    the FlexGen engines' GPU weight buffer back to two layers
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hrm.machine.achieved as ach  # noqa: E402
import hrm.engines.engine as eng  # noqa: E402
import hrm.engines.mechanisms as mechanisms  # noqa: E402
import hrm.machine.rates as rates  # noqa: E402


def undo(which: str) -> None:
    if which == "pageable":
        for key, pinned in (("h2d", "h2d_gbps"), ("d2h", "d2h_gbps")):
            field = f"link.{key}_pageable_gbps"
            ach.DEFAULTS[field] = ach.Default(field, "pinned / 2.25 (before issue 32)",
                                              lambda hw, pinned=pinned: getattr(hw.link, pinned) / 2.25)
    elif which == "launch":
        rates.EAGER_GPU_OP_S, rates.SYNC_BUBBLE_S = 4e-6, 4.9e-6
    elif which == "buffer":
        real = eng.load_engine

        def two_layers(name):
            engine = real(name)
            if getattr(engine, "name", "").startswith("flexgen"):
                engine = mechanisms.with_fields(engine, {"memory.gpu_weight_buffer_layers": 2})
            return engine

        eng.load_engine = two_layers
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    undo(sys.argv.pop(1))
    import engines_bench

    engines_bench.load_engine = eng.load_engine
    engines_bench.main()
