"""Plans as other engines' command lines, and back (issue 15).

``export_plan(plan, "llama.cpp")`` turns a plan into the flags that make a real engine run
its policy; ``import_flags("llama.cpp", "-np 64 -ub 16 --n-cpu-moe 20", model, ...)`` reads
such flags back into a :class:`~hrm.policy.Policy` (``read_command``: with the workload the
command itself runs). Each engine is one target module
(``flexgen``, ``moe_lightning``, ``llama_cpp``, ``vllm``, ``sglang``) over the protocol of
:mod:`hrm.export.target`, listed once in :data:`EXPORTERS` (:mod:`hrm.export.registry`);
llama.cpp's tensor overrides (``-ot``, ``--n-cpu-moe``) are read by
:mod:`hrm.export.llama_overrides`; kTransformers' ``--kt-*`` flags of SGLang (GPU experts, the
CPU experts' format per ``--kt-method``, threads and NUMA pools) by :mod:`hrm.export.sglang_kt`. A target's policy space is its HRM engines' ``policy:``
blocks (:mod:`hrm.export.space`); :func:`fix_pins` gives it as ``hrm-search --fix`` pins.
:mod:`hrm.export.exporting` exports a plan (re-planned where the target cannot run it) and
:mod:`hrm.export.importing` reads a pasted command; :mod:`hrm.export.values` holds what the
targets share (policies from fields, flag values against their ranges, whole counts nearest a
fraction); :mod:`hrm.export.llama_tools` reads llama-bench / llama-batched-bench commands as
the runs they make; :mod:`hrm.export.ollama` reads ollama's options as the llama-server
command ollama launches (a :class:`~hrm.export.target.Frontend` of :data:`FRONTENDS`, import
only); :mod:`hrm.export.real_commands` reads the real commands users posted
(tests/data/real_commands.yaml) as ``hrm import`` does.
"""

from .exporting import Export, FlagValue, choose_nearest, command_lines, export_plan, export_policy
from .flexgen import FLEXGEN, FLEXGEN_VERSION, all_weights_ratio
from .importing import Imported, import_command, import_flags, read_command, split_flags
from .llama_cpp import LLAMA_CPP, LLAMA_CPP_VERSION
from .llama_overrides import LLAMA_EXPS_REGEX
from .moe_lightning import MOE_LIGHTNING, MOE_LIGHTNING_VERSION
from .registry import EXPORTERS, FRONTENDS, IMPORT_SOURCES, get_exporter, import_source
from .sglang import SGLANG, SGLANG_VERSION
from .space import fix_pins, policy_space
from .target import Context, EngineFlags, FlagSpec
from .vllm import VLLM, VLLM_VERSION

__all__ = [
    "EXPORTERS", "FRONTENDS", "IMPORT_SOURCES", "FLEXGEN", "FLEXGEN_VERSION", "LLAMA_CPP", "LLAMA_CPP_VERSION", "LLAMA_EXPS_REGEX", "MOE_LIGHTNING",
    "MOE_LIGHTNING_VERSION", "SGLANG", "SGLANG_VERSION", "VLLM", "VLLM_VERSION", "Context", "EngineFlags", "Export",
    "FlagSpec", "FlagValue", "Imported", "all_weights_ratio", "choose_nearest", "command_lines", "export_plan",
    "export_policy", "fix_pins", "get_exporter", "import_command", "import_source", "import_flags", "policy_space", "read_command",
    "split_flags",
]
