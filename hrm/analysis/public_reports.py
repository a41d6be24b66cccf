"""Public speed reports of MoE models run with llama.cpp on consumer machines
(``docs/validation/runs/public-reports.yaml``) beside what HRM predicts for them: the reported
command itself, read as ``hrm import --from llama.cpp`` reads it on the poster's machine composed
from the parts catalog, and ``hrm fit``'s own pick for that machine, model and context. Nothing
here is fitted to the reports: they are a check. One function serves the table's test
(tests/test_fit_reports.py) and its page (benchmarks/fit_reports.py -> docs/validation/fit_reports.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..errors import HRMError, read_input_text, strict_yaml_load
from ..export.real_commands import Parts

REPORTS = Path(__file__).resolve().parents[2] / "docs" / "validation" / "runs" / "public-reports.yaml"


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Measured(_Frozen):
    """The rates the report states (tok/s); a range (``decode_low``..``decode_high``) where it
    gives one, read at its middle."""

    prefill_tok_s: Optional[float] = Field(default=None, gt=0)
    decode_tok_s: Optional[float] = Field(default=None, gt=0)
    decode_low: Optional[float] = Field(default=None, gt=0)
    decode_high: Optional[float] = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one_decode(self):
        if (self.decode_low is None) != (self.decode_high is None):
            raise ValueError("decode_low and decode_high: give both (a range) or neither")
        if self.decode_low is not None and self.decode_tok_s is not None:
            raise ValueError("give decode_tok_s or a range (decode_low, decode_high), not both")
        if self.prefill_tok_s is None and self.decode() is None:
            raise ValueError("a report states a prefill or a decode rate")
        return self

    def decode(self) -> Optional[float]:
        if self.decode_low is not None:
            return (self.decode_low + self.decode_high) / 2
        return self.decode_tok_s


class PublicReport(_Frozen):
    key: str
    #: where the numbers are: the address, and the post/comment in it
    source: str
    #: the report's own words for its numbers (each measured number appears in it)
    quote: str
    parts: Parts
    model: str
    #: the command as posted
    command: str
    #: the command HRM reads, where flags without a policy field that hrm import does not know
    #: were dropped from the posted one (``dropped`` says which)
    read_as: str = ""
    dropped: str = ""
    #: the request the rates were measured on (server logs), or the one assumed (``assumed``)
    prompt_tokens: int = Field(default=512, gt=0)
    gen_tokens: int = Field(default=128, gt=0)
    #: hrm fit's --context: the command's context (its -c; 0 -> the model's)
    fit_context: int = Field(gt=0)
    measured: Measured
    #: what the report does not state and was assumed (besides the machine's parts.assumed)
    assumed: str = ""

    @property
    def hrm_command(self) -> str:
        return self.read_as or self.command


def load_reports(path: str | Path = REPORTS) -> list[PublicReport]:
    data = strict_yaml_load(read_input_text(path, "a list of public reports"))
    if not isinstance(data, list):
        raise HRMError(f"{path}: a list of reports expected")
    return [PublicReport.model_validate(item) for item in data]


@dataclass(frozen=True)
class Prediction:
    """HRM's rates for one report: the reported command, and hrm fit's pick."""

    prefill_tok_s: float
    decode_tok_s: float
    fits: bool
    policy: str
    fit_args: str
    fit_prefill_tok_s: float
    fit_decode_tok_s: float

    def ratio(self, measured: Measured, phase: str) -> Optional[float]:
        """predicted / reported for ``phase`` (prefill or decode), None where not reported."""
        m = measured.prefill_tok_s if phase == "prefill" else measured.decode()
        p = self.prefill_tok_s if phase == "prefill" else self.decode_tok_s
        return p / m if m else None


def report_model(report: PublicReport):
    """The catalog model with the weights the command's file name states (as hrm import does:
    hrm_cli.import_flags._with_named_format)."""
    from ..export.llama_cpp import gguf_name_format
    from ..model.spec import load_model

    model = load_model(report.model)
    named = gguf_name_format(report.hrm_command)
    return model if named is None else model.with_stored_format(named[2])


def command_rates(report: PublicReport, hw, model) -> tuple[float, float, bool, str]:
    """(prefill tok/s, decode tok/s, fits physical memory, policy) of the reported command:
    a llama-bench command per test (hrm.export.llama_tools.gpu_estimate), any other the way
    ``hrm import --from llama.cpp`` estimates it (hrm_cli/import_flags.py)."""
    from ..export.llama_tools import bench_runs, gpu_estimate, tool_of

    if tool_of(report.hrm_command) == "llama-bench":
        tests, _ = bench_runs(report.hrm_command, hw.cpu.cores)
        pre = next(t for t in tests if t.prompt_len and not t.gen_len)
        dec = next(t for t in tests if t.gen_len and not t.prompt_len)
        p, _, fits_p = gpu_estimate(pre, hw, model)
        _, d, fits_d = gpu_estimate(dec, hw, model)
        return p, d, fits_p and fits_d, f"llama-bench -ncmoe {pre.n_cpu_moe} -ub {pre.n_ubatch}"
    return _server_rates(report, hw, model)


def _server_rates(report: PublicReport, hw, model) -> tuple[float, float, bool, str]:
    from ..cost.memory import physical_limits
    from ..estimate import estimate
    from ..export.importing import fitted_policy, imported_engine, read_command
    from ..workload import make_workload

    asked = make_workload(None, prompt_len=report.prompt_tokens, gen_len=report.gen_tokens)
    imported = read_command("llama.cpp", report.hrm_command, model, asked, hw,
                            given={"prompt_len": report.prompt_tokens, "gen_len": report.gen_tokens})
    engine = imported_engine("llama.cpp", imported)
    limits = physical_limits(hw, engine)
    # -ngl auto: the placement llama.cpp's --fit reaches, as hrm import estimates it
    imported, _ = fitted_policy(imported, hw, model, engine, limits,
                                lambda p: estimate(hw, model, imported.workload, p, limits=limits, engine=engine))
    r = estimate(hw, model, imported.workload, imported.policy, limits=limits, engine=engine)
    prefill = imported.workload.effective_prompt_len / r.prefill_latency_s if r.prefill_latency_s else 0.0
    return prefill, r.decode_throughput_tok_s, r.fits(limits), imported.policy.short()


@lru_cache(maxsize=64)
def predict(report: PublicReport) -> Prediction:
    """HRM's rates for the reported command, and hrm fit's pick on the same machine and model
    at the report's context (``hrm fit --context fit_context --gen gen_tokens``)."""
    from .fit import fit_gpu

    from ..machine.parts import compose_profile

    p = report.parts
    hw = compose_profile(p.gpu, p.cpu, p.ram_gib, p.gpus)
    model = report_model(report)
    prefill, decode, fits, policy = command_rates(report, hw, model)
    pick = fit_gpu(hw, model, report.fit_context, min(report.gen_tokens, report.fit_context - 1)).best
    return Prediction(prefill, decode, fits, policy, pick.args(), pick.prefill_tok_s, pick.decode_tok_s)


__all__ = ["Measured", "PublicReport", "Prediction", "REPORTS", "load_reports", "report_model", "command_rates",
           "predict"]
