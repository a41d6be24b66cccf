"""The web planner's requests: fields named as the CLI's flags, checked and turned into the
CLI's own parsed arguments (the same parser, the same :mod:`hrm.bounds` ranges), so an API
answer is what the command prints. They are parsed once, here; a worker takes the parsed
arguments as they are.

A request is a JSON object (or a form / query string: every value may then be text) of the
fields of :data:`FIELDS`; each endpoint takes the fields of its command
(:data:`ENDPOINT_FIELDS`). Hardware and model are shipped names or uploads (``hw_yaml``,
``model_config``: the file's text), never a path on the server. Every refusal is an
:class:`hrm.errors.HRMError` with one line.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import dataclass, field

from hrm.errors import HRMError

#: a request body (JSON or form, uploads included) larger than this is refused (our choice:
#: a hardware profile is ~5 KiB, the largest catalog config.json ~10 KiB)
MAX_BODY_BYTES = 1 << 20
#: one uploaded file (profile YAML, config.json) larger than this is refused
MAX_UPLOAD_BYTES = 256 << 10
#: the head of a GGUF file the fit page uploads (our choice): the header alone is read
#: (hrm.model.gguf: its metadata, the tokenizer's vocabulary the bulk of it, and its tensor
#: table), never the weights; a header longer than this is refused by the reader, in one line
MAX_GGUF_HEAD_BYTES = 16 << 20
#: a request body of the fit page: its fields and a GGUF's head
MAX_FIT_BODY_BYTES = MAX_GGUF_HEAD_BYTES + MAX_BODY_BYTES
#: the first bytes of every GGUF file (ggml-org/ggml docs/gguf.md: the magic "GGUF")
GGUF_MAGIC = b"GGUF"
#: one text field (a name, a --fix list, a policy) longer than this is refused
MAX_FIELD_CHARS = 400

#: JSON field -> (CLI flag, kind): kind "text", "number" (the flag's own range checks it),
#: "flag" (a boolean switch), "pins" (--fix: text or a list of KEY=VALUE)
FIELDS: dict[str, tuple[str, str]] = {
    "hw": ("--hw", "text"),
    "model": ("--model", "text"),
    "engine": ("--engine", "text"),
    "schedule": ("--schedule", "text"),
    "workload": ("--workload", "text"),
    "prompt_len": ("--prompt-len", "number"),
    "max_prompt_len": ("--max-prompt-len", "number"),
    "gen_len": ("--gen-len", "number"),
    "padding": ("--padding", "flag"),
    "weight_dtype": ("--weight-dtype", "text"),
    "kv_dtype": ("--kv-dtype", "text"),
    "routing": ("--routing", "text"),
    "gpu_mem": ("--gpu-mem", "number"),
    "cpu_mem": ("--cpu-mem", "number"),
    "gpu_util": ("--gpu-util", "number"),
    "cpu_util": ("--cpu-util", "number"),
    "fix": ("--fix", "pins"),
    "objective": ("--objective", "text"),
    "max_tpot_ms": ("--max-tpot-ms", "number"),
    "max_ttft_s": ("--max-ttft-s", "number"),
    "max_batch": ("--max-batch", "number"),
    "top": ("--top", "number"),
    "time_limit": ("--time-limit", "number"),
    "export": ("--export", "text"),
    "policy": ("--policy", "text"),
    "explain": ("--explain", "flag"),
    # hrm fit's machine from the parts catalog, and its context
    "gpu": ("--gpu", "text"),
    "cpu": ("--cpu", "text"),
    "ram": ("--ram", "number"),
    "weight_format": ("--weight-format", "text"),
    "context": ("--context", "number"),
    "gen": ("--gen", "number"),
    "users": ("--users", "number"),
    "rate_per_s": ("--rate-per-s", "number"),
    "requests": ("--requests", "number"),
}
#: the web planner's own fields: uploads (the file's text, and a name for it) and what-ifs
#: of the profile (hrm.machine.whatif), applied before the search
EXTRA_FIELDS = ("hw_yaml", "hw_name", "model_config", "model_name", "link_gbps", "cpu_scale", "model_gguf")

_MACHINE = ("hw", "model", "weight_dtype", "kv_dtype", "routing", "workload", "prompt_len", "max_prompt_len",
            "gen_len", "padding", "gpu_mem", "cpu_mem", "gpu_util", "cpu_util", *EXTRA_FIELDS)
_SEARCH = (*_MACHINE, "engine", "schedule", "fix", "objective", "max_tpot_ms", "max_ttft_s", "max_batch", "top",
           "time_limit")
#: the fields each endpoint takes (the command's flags)
ENDPOINT_FIELDS: dict[str, tuple[str, ...]] = {
    "search": _SEARCH,
    "view": _SEARCH,
    "exports": _SEARCH,
    "plot": _SEARCH,
    "compare": tuple(f for f in _SEARCH if f not in ("engine", "schedule", "top")),
    "export": (*_SEARCH, "export"),
    "estimate": (*_MACHINE, "engine", "schedule", "policy", "explain"),
    # hrm fit: a machine (a profile, or parts), a model (the catalog, a config.json or a GGUF's
    # head), a context, and optionally the tokens generated and the parallel users, or a server's
    # load (CPU-only: requests per second and how many)
    "fit": ("hw", "gpu", "cpu", "ram", "model", "weight_dtype", "weight_format", "context", "gen", "users",
            "rate_per_s", "requests", "hw_yaml", "hw_name", "model_config", "model_gguf", "model_name"),
}
#: which CLI parser reads an endpoint's fields
PARSERS = {"estimate": "estimate", "fit": "fit"}
#: the upload fields that stand for the model (a config.json's text, a GGUF's head)
MODEL_UPLOADS = ("model_config", "model_gguf")

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_TRUE, _FALSE = ("true", "1", "on", "yes"), ("false", "0", "off", "no", "")


@dataclass
class Request:
    """A checked request: the CLI's parsed arguments of its fields and the web's own fields."""

    endpoint: str
    #: the fields as the CLI's parser parsed them (:func:`parse_argv`)
    args: argparse.Namespace
    uploads: dict = field(default_factory=dict)
    whatif: dict = field(default_factory=dict)
    #: the fields as given (the page's shareable URL is built from them)
    fields: dict = field(default_factory=dict)


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _text(name: str, value) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise HRMError(f"{name}: expected text, got {type(value).__name__}")
    text = value if isinstance(value, str) else repr(value)
    if len(text) > MAX_FIELD_CHARS:
        raise HRMError(f"{name}: longer than {MAX_FIELD_CHARS} characters")
    if _CONTROL.search(text):
        raise HRMError(f"{name}: control characters are not allowed")
    return text.strip()


def _number(name: str, value) -> str:
    """A number as the flag's text; the flag's own range (hrm.bounds) checks it."""
    if isinstance(value, bool):
        raise HRMError(f"{name}: expected a number, got a boolean")
    if isinstance(value, float) and not math.isfinite(value):
        raise HRMError(f"{name}: {value} is not a finite number")
    if isinstance(value, (int, float)):
        return repr(value)
    text = _text(name, value)
    if not text:
        raise HRMError(f"{name}: empty; give a number")
    return text


def _flag(name: str, value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise HRMError(f"{name}: expected true or false")


def _pins(name: str, value) -> str:
    items = value if isinstance(value, list) else [value]
    if len(items) > 16:
        raise HRMError(f"{name}: more than 16 pins")
    return " ".join(_text(name, item) for item in items).strip()


def _shipped_name(name: str, text: str, known: list[str], shown: list[str], upload: str) -> None:
    """Only shipped names: a path on the server is refused (upload the file instead)."""
    if any(c in text for c in "/\\~") or text.startswith(".") or ":" in text:
        raise HRMError(f"{name}: '{one_line(text, 80)}' looks like a path; give a shipped name or upload the file "
                       f"({upload})")
    stem = re.sub(r"\.(ya?ml|json)$", "", text, flags=re.IGNORECASE)
    if stem.lower() not in known:
        raise HRMError(f"{name}: unknown '{one_line(text, 80)}' (shipped: {one_line(', '.join(shown), 200)}; "
                       f"or upload the file as {upload})")


#: how a plan, a title and a shareable URL name an uploaded profile or config.json
UPLOAD_PREFIX = "upload:"


def check_machine_names(values: dict) -> None:
    """hw, model and engine name shipped data; routing is not a trace file on the server."""
    from hrm.engines.engine import list_engines
    from hrm.machine.hardware import list_profiles
    from hrm.model.spec import ALIASES, list_catalog

    for name, uploads, what in (("hw", ("hw_yaml",), "profile YAML"), ("model", MODEL_UPLOADS, "config.json")):
        text = values.get(name) or ""
        if text.startswith(UPLOAD_PREFIX) and not any(u in values for u in uploads):  # a shared URL of a plan with an upload
            raise HRMError(f"{name}: this URL was made with an uploaded {what} ({one_line(text[len(UPLOAD_PREFIX):], 64)}), "
                           f"which a URL cannot carry: upload the file again and plan")
    if values.get("hw") and "hw_yaml" not in values:
        _shipped_name("hw", values["hw"], [p.lower() for p in list_profiles()], list_profiles(), "hw_yaml")
    if values.get("model") and not any(u in values for u in MODEL_UPLOADS):
        _shipped_name("model", values["model"], [m.lower() for m in (*list_catalog(), *ALIASES)], list_catalog(),
                      "model_config")
    if values.get("engine") and values["engine"] not in list_engines():
        raise HRMError(f"engine: unknown '{one_line(values['engine'], 80)}' (shipped: {', '.join(list_engines())}); "
                       "engine files are not read by the web planner")
    routing = values.get("routing")
    if routing and routing.lower().startswith("trace"):
        raise HRMError("routing: trace:FILE reads a file on the server; give uniform or zipf:S")


def _upload_name(text: str | None, default: str) -> str:
    """A file name for an upload (letters, digits, '.', '-', '_'; at most 64)."""
    name = re.sub(r"\.(ya?ml|json|gguf)$", "", (text or "").strip(), flags=re.IGNORECASE)
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-")[:64]
    return name or default


def _model_upload_name(file_name: str | None, config_text: str) -> str:
    """One name for an uploaded config.json, used everywhere (the plan's ``upload:NAME``, the
    title, the URL): the file's name, or the config's ``_name_or_path`` (its last part) when
    the file is called ``config.json``; ``uploaded-model`` when neither says more."""
    name = _upload_name(file_name, "")
    if name.lower() in ("", "config"):  # "config" names no model
        name = ""
        try:
            data = json.loads(config_text)
        except ValueError:
            data = None
        given = data.get("_name_or_path") if isinstance(data, dict) else None
        if isinstance(given, str) and given.strip():
            name = _upload_name(given.strip().rstrip("/").rsplit("/", 1)[-1], "")
    return name or "uploaded-model"


def _upload_text(name: str, value) -> str:
    if not isinstance(value, str):
        raise HRMError(f"{name}: expected the file's text")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_UPLOAD_BYTES:
        raise HRMError(f"{name}: larger than {MAX_UPLOAD_BYTES >> 10} KiB")
    if not value.strip():
        raise HRMError(f"{name}: empty file")
    return value


def _gguf_head(name: str, value) -> bytes:
    """A GGUF's head as uploaded: bytes that start with the GGUF magic, within the limit."""
    if not isinstance(value, bytes):
        raise HRMError(f"{name}: a GGUF file's head is uploaded as a file (multipart model_file)")
    if len(value) > MAX_GGUF_HEAD_BYTES:
        raise HRMError(f"{name}: larger than {MAX_GGUF_HEAD_BYTES >> 20} MiB (send the file's head only)")
    if not value.startswith(GGUF_MAGIC):
        raise HRMError(f"{name}: not a GGUF file (it does not start with {GGUF_MAGIC.decode()})")
    return value


def _uploads(data: dict, values: dict) -> dict:
    """The uploads of a request (a profile's and a config.json's text, a GGUF's head) and the
    name of each; each one's field is marked given in ``values``."""
    uploads: dict = {}
    for key, default in (("hw_yaml", "uploaded-profile"), ("model_config", "uploaded-model")):
        if data.get(key) not in (None, ""):
            uploads[key] = _upload_text(key, data[key])
            label = "hw_name" if key == "hw_yaml" else "model_name"
            given = _text(label, data.get(label) or "")
            uploads[label] = (_model_upload_name(given, uploads[key]) if key == "model_config"
                              else _upload_name(given, default))
            values[key] = True
    if data.get("model_gguf") not in (None, b"", ""):
        if "model_config" in uploads:
            raise HRMError("model_file: give a config.json or a GGUF, not both")
        uploads["model_gguf"] = _gguf_head("model_file", data["model_gguf"])
        uploads["model_name"] = _upload_name(_text("model_name", data.get("model_name") or ""), "uploaded-model")
        values["model_gguf"] = True
    return uploads


def parse_request(endpoint: str, data) -> Request:
    """A request object -> :class:`Request` (HRMError with one line for any refusal). The
    fields are parsed once, here, with the CLI's parser, so a bad flag is refused (with the
    flag's own message) before a worker is asked."""
    if not isinstance(data, dict):
        raise HRMError("the request body must be a JSON object of fields")
    allowed = ENDPOINT_FIELDS[endpoint]
    unknown = [k for k in data if k not in allowed]
    if unknown:
        raise HRMError(f"unknown field '{one_line(unknown[0], 40)}' for /api/{endpoint} (fields: {', '.join(allowed)})")
    values: dict = {}
    argv: list[str] = []
    for key, value in data.items():
        if value is None or key in EXTRA_FIELDS:
            continue
        flag, kind = FIELDS[key]
        if kind == "flag":
            if _flag(key, value):
                argv.append(flag)
                values[key] = True
            continue
        text = {"number": _number, "text": _text, "pins": _pins}[kind](key, value)
        if kind == "text" and not text:
            continue  # an empty form field: the command's default
        if kind == "pins" and not text:
            continue
        values[key] = text
        argv.append(f"{flag}={text}")
    uploads, whatif = _uploads(data, values), {}
    for key in ("link_gbps", "cpu_scale"):
        if data.get(key) not in (None, ""):
            whatif[key] = _whatif_number(key, data[key])
    if "hw_yaml" in uploads and "hw" not in values:
        argv.append("--hw=upload")
    if any(u in uploads for u in MODEL_UPLOADS) and "model" not in values:
        argv.append("--model=upload")
    if endpoint == "export" and "export" not in values:
        from hrm.export import EXPORTERS

        raise HRMError(f"export: give the target engine ({', '.join(EXPORTERS)})")
    check_machine_names(values)
    args = parse_argv(endpoint, argv)
    shown = {k: v for k, v in values.items() if k not in ("hw_yaml", *MODEL_UPLOADS)}
    return Request(endpoint, args, uploads, whatif, shown)


def _whatif_number(name: str, value) -> float:
    from hrm import bounds

    text = _number(name, value)
    rng = bounds.LINK_GBPS if name == "link_gbps" else bounds.SCALE
    try:
        return rng.flag(name)(text)
    except Exception as exc:  # argparse.ArgumentTypeError: the range's one line
        raise HRMError(f"{name}: {one_line(str(exc))}") from None


def parse_argv(endpoint: str, argv: list[str]):
    """The CLI's parsed arguments of ``argv`` (``hrm estimate``'s parser for estimate, ``hrm fit``'s
    for fit, else ``hrm-search``'s), with usage errors as HRMError instead of exit 2."""
    if PARSERS.get(endpoint) == "estimate":
        from hrm_cli.estimate import build_parser
    elif PARSERS.get(endpoint) == "fit":
        from hrm_cli.fit import build_parser
    else:
        from hrm_cli.search import build_parser
    parser = build_parser()

    def refuse(message):  # the line the command prints after "error: " (hrm_cli.parser.ArgumentParser.error)
        raise HRMError(one_line(f"{parser.prog}: {message}"))

    parser.error = refuse
    extra = ["--json"] + (["--compare"] if endpoint == "compare" else [])
    return parser.parse_args([*argv, *extra])
