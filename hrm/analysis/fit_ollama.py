"""``hrm fit``'s answer for ollama: the best llama.cpp command as a Modelfile (num_gpu, num_ctx,
num_thread, num_batch, and OLLAMA_* server variables; :func:`hrm.export.ollama.ollama_settings`,
the reverse of how ``hrm import --from ollama`` reads them). ollama passes no ``--n-cpu-moe``,
``-ot`` or ``-nkvo`` to llama-server (ollama/ollama@fb307609 llm/llama_server.go:368-416): where
the best command needs one, the answer says so in one line and gives the best candidate ollama
can express instead — every layer, experts included, on the GPU, KV there — with its own
predicted rates from the same search; if none fits, ``num_gpu`` the layers the llama.cpp pick
keeps wholly on the GPU, whose whole CPU layers (attention too) HRM's llama.cpp engines do not
price: its decode is at most the pick's, which keeps those layers' attention on the GPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

#: llama.cpp's -ngl N puts blocks L+1-N .. L-1 and the output layer (block L) on the GPU
#: (src/llama-model.cpp:1589-1593 at ggml-org/llama.cpp@0c1e5709): N counts the output layer
OUTPUT_LAYERS = 1


@dataclass(frozen=True)
class OllamaAnswer:
    """The ollama form of a fit: its Modelfile, whether it is the llama.cpp pick itself, the
    predicted rates (None where HRM does not price the placement), and the one-line why."""

    modelfile: str
    num_gpu: int
    same_as_llama_cpp: bool
    prefill_tok_s: Optional[float]
    decode_tok_s: Optional[float]
    decode_at_most_tok_s: Optional[float]
    line: str

    def to_json(self) -> dict:
        return {"modelfile": self.modelfile, "num_gpu": self.num_gpu, "same_as_llama_cpp": self.same_as_llama_cpp,
                "prefill_tok_s": self.prefill_tok_s, "decode_tok_s": self.decode_tok_s,
                "decode_at_most_tok_s": self.decode_at_most_tok_s, "line": self.line}


def _values(candidate) -> dict[str, list[str]]:
    return {flag: [value] if value else [] for flag, value in candidate.flags}


def whole_gpu_layers(model, n_cpu_moe: int) -> int:
    """ollama's num_gpu for the layers a ``--n-cpu-moe n_cpu_moe`` command keeps wholly on the
    GPU: blocks n_cpu_moe .. L-1 and the output layer."""
    return int(model.num_layers) - int(n_cpu_moe) + OUTPUT_LAYERS


def _expressible(candidate) -> bool:
    from ..export.ollama import ollama_settings

    cannot = ollama_settings(_values(candidate))[2]
    return not [flag for flag in cannot if flag in ("--n-cpu-moe", "-ot", "-nkvo")]


def ollama_answer(best, ranked: list, model, ollama_model: str = "MODEL") -> OllamaAnswer:
    """The ollama form of ``best`` (a :class:`hrm.analysis.fit.Candidate`); ``ranked`` the
    fitting candidates best first, from which the best ollama can express is taken."""
    from ..export.ollama import modelfile_text, ollama_settings

    params, env, cannot = ollama_settings(_values(best))
    if _expressible(best):
        return OllamaAnswer(modelfile_text(ollama_model, params, env), int(params["num_gpu"]), True,
                            best.prefill_tok_s, best.decode_tok_s, None,
                            "ollama runs the same command" + (f" (less {', '.join(cannot)}: no change to the "
                                                              "estimate)" if cannot else ""))
    why = "; ".join(f"{flag} {dict(best.flags)[flag]}".strip() for flag in cannot if flag in ("--n-cpu-moe", "-nkvo"))
    head = f"ollama cannot express {why} (llm/llama_server.go:368-416 passes none)"
    alt = next((c for c in ranked if _expressible(c)), None)
    if alt is not None:
        params, env, _ = ollama_settings(_values(alt))
        return OllamaAnswer(modelfile_text(ollama_model, params, env), int(params["num_gpu"]), False,
                            alt.prefill_tok_s, alt.decode_tok_s, None,
                            f"{head}; its best: every layer on the GPU, decode {alt.decode_tok_s:,.2f} tok/s vs "
                            f"{best.decode_tok_s:,.2f}")
    num_gpu = whole_gpu_layers(model, best.knobs["n_cpu_moe"])
    params["num_gpu"] = str(num_gpu)
    return OllamaAnswer(modelfile_text(ollama_model, params, env), num_gpu, False, None, None, best.decode_tok_s,
                        f"{head}, and no command with every layer on the GPU fits; num_gpu {num_gpu} keeps the same "
                        f"layers wholly on the GPU and the other {best.knobs['n_cpu_moe']} whole on the CPU (attention "
                        f"too, which HRM does not price): decode at most {best.decode_tok_s:,.2f} tok/s")
