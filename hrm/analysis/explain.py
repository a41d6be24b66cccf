"""``hrm estimate --explain``: what each mechanism of an engine costs, and its share of the
gap to the ideal roofline.

For an engine E and a policy, every active mechanism m (a field that differs from
``ideal``, :data:`hrm.engines.mechanisms.MECHANISMS`) is switched off in turn
(:func:`hrm.engines.mechanisms.without`) and the policy re-estimated: m *alone* costs
T(E) − T(E without m) of end-to-end time, in decode time per layer and in prefill, and the
GPU, CPU and disk bytes it adds to the peaks (buffers, what is offloaded, what spills beyond
host memory: the disk column appears only where a mechanism spills). Alone costs need not
add up to the gap: mechanisms interact through the max over lanes (one hidden behind another
bottleneck costs nothing alone, and two that share a lane can each cost more than their
joint share).

The **share of the gap** is additive instead (:data:`SHARE_DEFINITION`): the mechanisms are
switched off one after another, largest alone cost first, and each one's share is the time
that step removes over the whole gap T(E) − T(ideal), where ideal is E with every
mechanism off (same schedule and policy). The steps telescope, so the shares add up to
exactly 100%; a step can be negative where switching a mechanism off (with those above it
already off) makes the policy slower.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engines.engine import Engine
from ..engines.mechanisms import MECHANISMS, active_mechanisms, without
from ..estimate import EstimateResult, estimate
from ..units import GIB


#: the share of the gap in one line, as --explain prints it under its table
SHARE_DEFINITION = ("share of gap: the time each mechanism removes when switched off after the ones above it "
                    "(largest alone cost first), over the gap to ideal on the same policy; the shares add up to 100%. "
                    "'alone s' is its cost with every other mechanism on")


@dataclass(frozen=True)
class MechanismCost:
    mechanism: str
    label: str
    total_s: float           # end-to-end seconds it adds
    decode_layer_s: float    # mean decode seconds per layer it adds
    prefill_s: float         # prefill seconds it adds
    share_of_gap: float      # step_s / (T(engine) − T(ideal)): additive, the shares sum to 1
    step_s: float = 0.0      # seconds removed when it is switched off after those listed above it
    gpu_bytes: float = 0.0   # GPU peak bytes it adds
    cpu_bytes: float = 0.0   # CPU peak bytes it adds
    disk_bytes: float = 0.0  # bytes it spills to disk (docs/model.md §4.9)


@dataclass(frozen=True)
class Explanation:
    engine: str
    engine_estimate: EstimateResult
    ideal_estimate: EstimateResult
    costs: list[MechanismCost]

    @property
    def gap_s(self) -> float:
        return self.engine_estimate.total_time_s - self.ideal_estimate.total_time_s

    def as_dict(self) -> dict:
        return {
            "engine": self.engine,
            "generation_throughput_tok_s": self.engine_estimate.generation_throughput_tok_s,
            "ideal_generation_throughput_tok_s": self.ideal_estimate.generation_throughput_tok_s,
            "gap_s": self.gap_s,
            "share_definition": SHARE_DEFINITION,
            "mechanisms": [c.__dict__ for c in self.costs],
        }

    def table(self):
        """The mechanisms as a rich Table. Every cell and the title are rich Text, never
        markup: the engine's name comes from the user's engine file."""
        from rich.table import Table
        from rich.text import Text

        eng, ideal = self.engine_estimate, self.ideal_estimate
        table = Table(title=Text(f"{self.engine}: {eng.generation_throughput_tok_s:,.1f} tok/s vs ideal "
                                 f"{ideal.generation_throughput_tok_s:,.1f} tok/s on the same policy "
                                 f"(gap {self.gap_s:,.1f} s end to end); each mechanism switched off in turn"),
                      caption=Text(SHARE_DEFINITION), caption_justify="left")
        # two-line headers keep the numbers whole at 80 columns; the labels wrap between words
        # the disk tier's column only where a mechanism spills (weights beyond host memory)
        disk = any(c.disk_bytes for c in self.costs)
        for col in ("mechanism", "decode\nms/layer", "prefill\ns", "alone\ns", "share\nof gap", "GPU\nGiB",
                    "CPU\nGiB", *(("disk\nGiB",) if disk else ())):
            mechanism = col == "mechanism"
            table.add_column(col, justify="left" if mechanism else "right", no_wrap=not mechanism, overflow="fold")
        for c in self.costs:
            table.add_row(*(Text(cell) for cell in (
                c.label, f"{c.decode_layer_s * 1e3:.3f}", f"{c.prefill_s:.2f}", f"{c.total_s:.2f}",
                f"{c.share_of_gap:.0%}", f"{c.gpu_bytes / GIB:+.2f}", f"{c.cpu_bytes / GIB:+.2f}",
                *((f"{c.disk_bytes / GIB:+.2f}",) if disk else ()))))
        return table


def explain(hw, model, workload, policy, engine: Engine, options, limits) -> Explanation:
    """Each active mechanism's cost for ``policy`` under ``engine`` (see the module doc)."""
    from ..engines.space import engine_for_policy

    engine = engine_for_policy(engine, policy)  # FlexGen's CPU attention: flexgen-cpu-attn's mechanisms
    base = estimate(hw, model, workload, policy, options=options, limits=limits, engine=engine)
    policy = base.policy  # as the engine realises it
    ideal_engine = engine
    for mechanism in active_mechanisms(engine):
        ideal_engine = without(ideal_engine, mechanism)
    ideal = estimate(hw, model, workload, policy, options=options, limits=limits, engine=ideal_engine)
    gap = base.total_time_s - ideal.total_time_s
    alone = []
    for mechanism in active_mechanisms(engine):
        other = estimate(hw, model, workload, policy, options=options, limits=limits, engine=without(engine, mechanism))
        alone.append((mechanism, other))
    alone.sort(key=lambda item: -(base.total_time_s - item[1].total_time_s))
    # the additive share: switched off one after another (largest alone cost first); the steps
    # telescope from T(engine) to T(ideal)
    steps, current, current_time = {}, engine, base.total_time_s
    for index, (mechanism, _) in enumerate(alone):
        current = without(current, mechanism)
        after = ideal.total_time_s if index == len(alone) - 1 else \
            estimate(hw, model, workload, policy, options=options, limits=limits, engine=current).total_time_s
        steps[mechanism], current_time = current_time - after, after
    costs = []
    for mechanism, other in alone:
        total = base.total_time_s - other.total_time_s
        costs.append(MechanismCost(
            mechanism, MECHANISMS[mechanism], total, base.decode_layer_latency_s - other.decode_layer_latency_s,
            base.prefill_latency_s - other.prefill_latency_s, steps[mechanism] / gap if gap > 0 else 0.0,
            steps[mechanism], base.gpu_peak_bytes - other.gpu_peak_bytes, base.cpu_peak_bytes - other.cpu_peak_bytes,
            base.disk_bytes - other.disk_bytes))
    return Explanation(engine.name, base, ideal, costs)
