"""ollama's options (``hrm import --from ollama``): a Modelfile's ``FROM`` and ``PARAMETER``
lines, ``/set parameter`` lines, an API request's ``"options"`` JSON (or a ``curl ... -d``
carrying one) and the server's ``OLLAMA_*`` variables, read as the llama-server command
ollama launches with them — ollama runs every GGUF model through upstream llama-server
(ollama/ollama@fb307609 llm/server.go:106-119), its flags built at llm/llama_server.go:348-416 —
which the llama.cpp target then reads (:mod:`hrm.export.llama_cpp`).

``num_gpu`` counts whole layers (``-ngl``: attention and experts together); ollama has no
``--n-cpu-moe`` or ``-ot``, so an ollama command places experts on the CPU only by moving whole
layers, which HRM's llama.cpp engines do not model: ``num_gpu`` below the layer count is
refused in one line, as ``-ngl`` is. Facts: ``docs/engines/ollama.md`` (file:line at the pin).
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Optional

from ..errors import HRMError
from .target import Context, FlagSpec, Frontend, Frozen
from .values import served_model_notes, shown_word

OLLAMA_COMMIT = "ollama/ollama@fb307609"
OLLAMA_VERSION = f"{OLLAMA_COMMIT} (llama-server launcher, llm/llama_server.go)"
_LS = "llm/llama_server.go"
_TYPES = "api/types.go"

#: every option api.Options takes at the pin (api/types.go:568-596), by its JSON name, with its
#: Go kind: "int", "float", "bool", "strings"; FormatParams refuses any other name (:1291-1292)
OPTION_KINDS = {
    "num_ctx": "int", "num_batch": "int", "num_gpu": "int", "main_gpu": "int", "use_mmap": "bool",
    "num_thread": "int", "draft_num_predict": "int",  # Runner, :588-596
    "num_keep": "int", "seed": "int", "num_predict": "int", "top_k": "int", "top_p": "float", "min_p": "float",
    "typical_p": "float", "repeat_last_n": "int", "temperature": "float", "repeat_penalty": "float",
    "presence_penalty": "float", "frequency_penalty": "float", "stop": "strings",  # Options, :568-585
}
#: the server variables that change the llama-server command (envconfig/config.go)
SERVER_VARIABLES = ("OLLAMA_NUM_PARALLEL", "OLLAMA_CONTEXT_LENGTH", "OLLAMA_KV_CACHE_TYPE", "OLLAMA_FLASH_ATTENTION")
#: OLLAMA_NUM_PARALLEL's default (envconfig/config.go:275), at least 1 (server/sched.go:497)
DEFAULT_NUM_PARALLEL = 1
#: num_ctx when neither the options nor OLLAMA_CONTEXT_LENGTH (default 0, envconfig/config.go:230)
#: set it: by the GPUs' total memory (server/routes.go:2043-2057): (at least GiB, tokens)
VRAM_CONTEXT_TIERS = ((47, 262144), (23, 32768), (0, 4096))
#: ollama library tags whose name is not the catalog model's with ':' as '-' (ollama.com/library/qwen3:
#: the 30b tag is Qwen3-30B-A3B, the only 30B Qwen3)
LIBRARY_TAGS = {"qwen3:30b": "qwen3-30b-a3b"}
#: Modelfile commands (parser/parser.go:697-700) that set nothing llama-server's placement reads
_MODELFILE_TEXT = ("template", "system", "license", "message", "renderer", "parser", "requires")
#: Modelfile commands that add a model HRM's estimate does not (a LoRA, a speculative draft)
_MODELFILE_MODELS = {"adapter": "a LoRA adapter (llama-server --lora, llm/llama_server.go:386-389)",
                     "draft": "a draft model for speculative decoding (llm/llama_server.go:382)"}
#: a systemd unit's section header: ollama's FAQ sets the server's variables as Environment= lines
#: under ``[Service]`` (docs/faq.mdx:91-102 at the pin)
_SYSTEMD_SECTION = re.compile(r"\[[A-Za-z]+\]")
#: the API request's own fields besides model and options (api/types.go:63-130): read, no effect
_REQUEST_FIELDS = {"prompt", "suffix", "system", "template", "context", "stream", "raw", "format", "keep_alive",
                   "images", "think", "truncate", "shift", "logprobs", "top_logprobs", "messages", "tools"}


class OllamaSettings(Frozen):
    """What a pasted ollama text sets: the model (FROM / "model"), the options (name -> the
    value as written; later settings override earlier ones, as request options override the
    Modelfile's, server/routes.go:141-148) and the server's variables."""

    model: Optional[str] = None
    options: dict[str, str] = {}
    env: dict[str, str] = {}


def _value_text(name: str, value) -> str:
    """An option's value as text in its documented form (a JSON number or bool, or a word)."""
    kind = OPTION_KINDS[name]
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, list):
        text = " ".join(str(v) for v in value)
    else:
        text = str(value)
    if kind == "int" and isinstance(value, float):  # JSON numbers are float64, truncated (api/types.go:1022-1024)
        text = str(int(value))
    ok = {"int": r"[+-]?\d+", "float": r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?",
          "bool": r"(?i)1|0|t|f|true|false", "strings": r".*"}[kind]
    if not re.fullmatch(ok, text.strip()):
        raise HRMError(f"ollama: {name} {shown_word(text)}: not {'an' if kind == 'int' else 'a'} {kind} value "
                       f"({_TYPES}:1296-1318)")
    return text.strip()


def _set_option(out: dict, name: str, value) -> None:
    if name not in OPTION_KINDS:
        import difflib

        close = difflib.get_close_matches(name, list(OPTION_KINDS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise HRMError(f"ollama: unknown option {shown_word(name)} (not an option of {OLLAMA_COMMIT} "
                       f"{_TYPES}:568-596: a Modelfile refuses it, :1291-1292, a request's options ignore it with a warning, "
                       f":1004-1008){hint}")
    out[name] = _value_text(name, value)


def _json_settings(data, where: str) -> dict:
    """An API request ({"model": ..., "options": {...}}) or an options object, as settings fields."""
    if not isinstance(data, dict):
        raise HRMError(f"ollama: {where}: a JSON object expected")
    out: dict = {"options": {}}
    request = "options" in data or "model" in data or bool(_REQUEST_FIELDS & set(data))
    options = data.get("options") or {} if request else data
    if not isinstance(options, dict):
        raise HRMError(f"ollama: {where}: \"options\" must be a JSON object")
    if request:
        extra = set(data) - _REQUEST_FIELDS - {"model", "options"}
        if extra:
            raise HRMError(f"ollama: {where}: unknown request field {shown_word(sorted(extra)[0])} "
                           f"({_TYPES}:63-180)")
        if data.get("model") is not None:
            out["model"] = str(data["model"])
    for name, value in options.items():
        _set_option(out["options"], name, value)
    return out


def _curl_json(words: list[str]) -> str:
    """The body of a ``curl ... -d '{...}'`` command."""
    for i, word in enumerate(words):
        if word in ("-d", "--data", "--data-raw", "--data-binary") and i + 1 < len(words):
            return words[i + 1]
        for flag in ("--data=", "--data-raw="):
            if word.startswith(flag):
                return word[len(flag):]
    raise HRMError("ollama: a curl command without -d '{...}': give the request's JSON body")


def _env_words(words: list[str], env: dict) -> list[str]:
    """``words`` less leading ``VAR=value`` words (``export``/``set`` too), kept in ``env``."""
    if words and words[0] in ("export", "set"):
        words = words[1:]
    while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
        key, _, value = words[0].partition("=")
        env[key] = value
        words = words[1:]
    return words


def _modelfile_line(words: list[str], line: str, settings: dict) -> None:
    """One Modelfile command (FROM, PARAMETER, ... : parser/parser.go:697-700, case-insensitive)."""
    command = words[0].lower()
    if command == "from" and len(words) == 2:
        settings["model"] = words[1]
    elif command == "parameter" and len(words) >= 3:
        _set_option(settings["options"], words[1], " ".join(words[2:]))
    elif command in _MODELFILE_MODELS:
        raise HRMError(f"ollama: {words[0]}: {_MODELFILE_MODELS[command]}, which HRM's estimate does not model")
    elif command not in _MODELFILE_TEXT:
        raise HRMError(f"ollama: {shown_word(line)}: not a Modelfile command, /set parameter, an ollama command "
                       "or an options JSON")


def _line(line: str, settings: dict) -> None:
    """One line of a pasted text: a shell command (ollama ..., curl ... -d JSON, VAR=value),
    ``/set parameter NAME VALUE``, or a Modelfile command."""
    try:
        words = shlex.split(line, comments=False)
    except ValueError as exc:
        raise HRMError(f"ollama: {shown_word(line)}: {exc}") from None
    if len(words) >= 2 and words[0] == "Environment":  # systemd: Environment="OLLAMA_NUM_PARALLEL=4"
        words = words[1:]
    if words and words[0].startswith("Environment="):
        words = [words[0].partition("=")[2], *words[1:]]
    words = _env_words(words, settings["env"])
    if not words:
        return
    if words[0].rsplit("/", 1)[-1] in ("ollama", "ollama.exe"):
        if len(words) >= 3 and words[1] == "run":
            settings["model"] = words[2]
        return
    if words[0] == "curl":
        read = _json_settings(_json_body(_curl_json(words)), "curl -d")
        settings["options"].update(read["options"])
        settings["model"] = read.get("model", settings["model"])
        return
    if words[0] == "/set" and len(words) >= 4 and words[1] == "parameter":
        _set_option(settings["options"], words[2], " ".join(words[3:]))
        return
    _modelfile_line(words, line, settings)


def _json_body(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise HRMError(f"ollama: the JSON does not parse: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None


def _lines(text: str) -> list[str]:
    """Lines of ``text`` without comments, blanks and Modelfile triple-quoted blocks."""
    out, quoted = [], False
    for raw in text.replace("\\\n", " ").splitlines():
        line = raw.strip()
        if quoted:
            quoted = line.count('"""') % 2 == 0
            continue
        if line.count('"""') % 2 == 1:  # TEMPLATE """ ... over several lines
            quoted = True
            continue
        if _SYSTEMD_SECTION.fullmatch(line):  # systemctl edit ollama.service: [Service] above Environment= lines
            continue
        if line and not line.startswith("#") and not line.startswith(">>>"):
            out.append(line)
        elif line.startswith(">>> /set"):  # ollama run's prompt shown before the command
            out.append(line[4:])
    return out


def read_settings(text: str) -> OllamaSettings:
    """A pasted ollama text as :class:`OllamaSettings` (one-line HRMError for what is not one)."""
    stripped = text.strip()
    if not stripped:
        raise HRMError("ollama: empty text; give a Modelfile, /set parameter lines, an options JSON or a curl command")
    if stripped.startswith("{"):
        return OllamaSettings(**_json_settings(_json_body(stripped), "the JSON"))
    settings: dict = {"model": None, "options": {}, "env": {}}
    for line in _lines(text):
        _line(line, settings)
    env = {k: v for k, v in settings["env"].items() if k in SERVER_VARIABLES}
    return OllamaSettings(model=settings["model"], options=settings["options"], env=env)


# --- the llama-server command ollama launches ------------------------------------------------

def _int_option(settings: OllamaSettings, name: str) -> Optional[int]:
    text = settings.options.get(name)
    return None if text is None else int(text)


def _env_count(settings: OllamaSettings, name: str, default: int) -> int:
    """An unsigned server variable (envconfig.Uint, envconfig/config.go:259-271)."""
    text = settings.env.get(name)
    if text is None:
        return default
    if not re.fullmatch(r"\d+", text):
        raise HRMError(f"ollama: {name}={shown_word(text)}: an unsigned integer (envconfig/config.go:259-271)")
    return int(text)


def num_parallel(settings: OllamaSettings) -> int:
    """The slots ollama starts llama-server with: OLLAMA_NUM_PARALLEL, at least 1 (server/sched.go:497)."""
    return max(_env_count(settings, "OLLAMA_NUM_PARALLEL", DEFAULT_NUM_PARALLEL), 1)


def default_num_ctx(ctx: Context) -> tuple[int, str]:
    """(num_ctx, why) without a num_ctx option: OLLAMA_CONTEXT_LENGTH is read by the caller;
    else the tier of the GPUs' total memory (server/routes.go:2043-2057; OLLAMA_GPU_OVERHEAD 0)."""
    gpu = getattr(ctx.hardware, "gpu", None)
    total_gib = float(gpu.memory_gib) * int(gpu.count) if gpu is not None else 0.0
    tokens = next(t for floor, t in VRAM_CONTEXT_TIERS if total_gib >= floor)
    return tokens, (f"no num_ctx: ollama's default for {total_gib:g} GiB of GPU memory, {tokens} tokens "
                    "(server/routes.go:2043-2057)")


def num_ctx(settings: OllamaSettings, ctx: Context) -> tuple[int, list[str]]:
    """(each slot's context, notes): num_ctx, else OLLAMA_CONTEXT_LENGTH, else the VRAM tier;
    cut to the model's training context (llm/server.go:112-116)."""
    notes: list[str] = []
    given = _int_option(settings, "num_ctx")
    if given is None:
        env = _env_count(settings, "OLLAMA_CONTEXT_LENGTH", 0)
        if env:
            given = env
        else:
            given, why = default_num_ctx(ctx)
            notes.append(f"ollama: {why}")
    if given < 1:
        raise HRMError(f"ollama: num_ctx {given}: a context of at least one token")
    train = ctx.model.max_context_len
    if train and given > int(train):
        notes.append(f"ollama: num_ctx {given} is above {ctx.model.name}'s training context: ollama cuts it to "
                     f"{int(train)} (llm/server.go:112-116)")
        given = int(train)
    return given, notes


def _check_num_gpu(num_gpu: Optional[int], ctx: Context) -> list[str]:
    """num_gpu counts whole layers (llama-server -ngl): below the model's layers it moves
    attention too, outside HRM's llama.cpp policy space (as -ngl is read)."""
    layers = int(ctx.model.num_layers)
    if num_gpu is None or num_gpu < 0:
        return [f"ollama: no num_gpu (default -1, {_TYPES}:1117): ollama passes no -ngl ({_LS}:410), so "
                "llama-server's -ngl auto and --fit pick the GPU layers"]
    if num_gpu < layers:
        return_where = "every layer on the CPU" if num_gpu == 0 else f"{layers - num_gpu} of {layers} whole layers, " \
                                                                     "attention included, on the CPU"
        raise HRMError(f"ollama: num_gpu {num_gpu}: {return_where} (llama-server -ngl {num_gpu}, {_LS}:404-409); "
                       "ollama has no --n-cpu-moe or -ot to keep only experts on the CPU, and HRM's llama.cpp engines "
                       f"place experts only: give num_gpu {layers + 1} (every layer) or use llama.cpp's --n-cpu-moe")
    return []


def _server_env_values(settings: OllamaSettings) -> tuple[dict[str, list[str]], list[str]]:
    """The flags the server's variables add: KV cache type (llm/llama_server.go:394-396) and flash attention
    (:597-622: on/off when OLLAMA_FLASH_ATTENTION is set, else auto)."""
    values: dict[str, list[str]] = {}
    notes: list[str] = []
    kv = settings.env.get("OLLAMA_KV_CACHE_TYPE", "").lower()
    if kv:
        values["-ctk"], values["-ctv"] = [kv], [kv]
        notes.append(f"ollama: OLLAMA_KV_CACHE_TYPE={kv}: --cache-type-k/v {kv}; the estimate's KV dtype is the "
                     "model's (give hrm import --kv-dtype)")
    fa = settings.env.get("OLLAMA_FLASH_ATTENTION")
    if fa is None:
        values["-fa"] = ["auto"]
    elif re.fullmatch(r"(?i)1|t|true|0|f|false", fa):
        values["-fa"] = ["on" if fa.lower() in ("1", "t", "true") else "off"]
    else:
        raise HRMError(f"ollama: OLLAMA_FLASH_ATTENTION={shown_word(fa)}: a boolean (envconfig/config.go:216)")
    return values, notes


def llama_server_values(settings: OllamaSettings, ctx: Context) -> tuple[dict[str, list[str]], list[str]]:
    """The llama-server flags ollama launches with these settings (llm/llama_server.go:368-416),
    as the llama.cpp target's canonical flags, with notes."""
    slots = num_parallel(settings)
    tokens, notes = num_ctx(settings, ctx)
    # -c is every slot's context together, -np the slots (:375-376): each slot holds num_ctx
    values: dict[str, list[str]] = {"-c": [str(tokens * slots)], "-np": [str(slots)]}
    env_values, env_notes = _server_env_values(settings)
    values.update(env_values)
    batch = _int_option(settings, "num_batch")
    if batch is not None and batch > 0:  # -b and -ub both (:590-592)
        values["-b"], values["-ub"] = [str(batch)], [str(batch)]
    num_gpu = _int_option(settings, "num_gpu")
    notes += _check_num_gpu(num_gpu, ctx) + env_notes
    if num_gpu is not None and num_gpu > 0:
        values["-ngl"] = [str(num_gpu)]
    threads = _int_option(settings, "num_thread")
    if threads is not None and threads > 0:  # only a positive count is passed (:414-416)
        values["-t"] = [str(threads)]
    if settings.options.get("main_gpu") is not None:  # (:641-647)
        values["-sm"], values["-mg"] = ["none"], [settings.options["main_gpu"]]
    if settings.options.get("use_mmap", "").lower() in ("0", "f", "false"):  # (:627-638)
        values["-lm"] = ["none"]
    return values, notes


def catalog_name(named: str) -> str:
    """An ollama model name as the catalog spells models: the last path part (hf.co/USER/REPO:QUANT),
    a library NAME:TAG as NAME-TAG, or the catalog model of a tag :data:`LIBRARY_TAGS` lists."""
    base = named.rstrip("/").split("/")[-1].lower()
    spelled = base.replace(":", "-")
    if any(spelled.startswith(model) for model in LIBRARY_TAGS.values()):
        return spelled
    for tag, model in LIBRARY_TAGS.items():
        if base == tag or base.startswith(tag + "-"):
            return model + base[len(tag):]
    return spelled


def _model_notes(settings: OllamaSettings, ctx: Context) -> list[str]:
    """Refuse (one line) a model that is not the one planned; note one not named."""
    if settings.model is None:
        return [f"ollama: no FROM or \"model\": read as {ctx.model.name}"]
    try:
        return served_model_notes(catalog_name(settings.model), ctx, "ollama", "model")
    except HRMError:
        raise HRMError(f"ollama: model {shown_word(settings.model)} is not the model being planned "
                       f"({ctx.model.name}); give HRM's --model the same model") from None


def _option_notes(settings: OllamaSettings) -> list[str]:
    notes = []
    if "num_predict" in settings.options:
        notes.append(f"ollama: num_predict {settings.options['num_predict']}: each response's length cap "
                     f"(sent per request, {_LS}:1544); the estimate generates the workload's --gen-len")
    if "draft_num_predict" in settings.options:
        notes.append("ollama: draft_num_predict: no effect without a Modelfile DRAFT model (server/routes.go:154-156)")
    return notes


def translate(text: str, ctx: Context) -> tuple[dict[str, list[str]], list[str]]:
    """A pasted ollama text as the llama-server flags ollama launches (the llama.cpp target's
    canonical flags) and notes; one-line HRMError for what ollama refuses or HRM cannot read."""
    settings = read_settings(text)
    notes = _model_notes(settings, ctx)
    values, more = llama_server_values(settings, ctx)
    shown = " ".join(f"{flag} {' '.join(args)}".strip() for flag, args in values.items())
    return values, [*notes, *more, *_option_notes(settings),
                    f"ollama: runs llama-server {shown} ({OLLAMA_COMMIT} {_LS}:368-416)"]


def _row(option: str, flag: str, lines: str) -> FlagSpec:
    return FlagSpec(flag=option, policy_field=flag, value_form=r"\S+", source=lines, checked_against=OLLAMA_COMMIT)


OLLAMA = Frontend(
    name="ollama", version=OLLAMA_VERSION, target="llama.cpp",
    description="ollama: Modelfile PARAMETERs, /set parameter, request options and OLLAMA_* variables, read as "
                "the llama-server command ollama launches",
    options=(
        _row("num_gpu", "-ngl N (N > 0), -ngl 0 (0), none (-1, the default: auto)", f"{_LS}:402-410; {_TYPES}:1117"),
        _row("num_ctx", "-c num_ctx x OLLAMA_NUM_PARALLEL (each slot num_ctx)",
             f"{_LS}:375; {_TYPES}:1115; server/routes.go:131-132,2043-2057; llm/server.go:112-116"),
        _row("OLLAMA_NUM_PARALLEL", "-np (default 1)", f"{_LS}:376; envconfig/config.go:275; server/sched.go:497"),
        _row("OLLAMA_CONTEXT_LENGTH", "num_ctx's default (0: by VRAM)", "envconfig/config.go:230; server/routes.go:176-186"),
        _row("num_batch", "-b N -ub N (default: ollama's automatic batch)", f"{_LS}:581-594; server/sched.go:806-811"),
        _row("num_thread", "-t N (N > 0; default 0: llama-server's own count)", f"{_LS}:412-416; {_TYPES}:1118"),
        _row("num_predict", "(per request: each response's cap)", f"{_LS}:106-118,1544; {_TYPES}:1099"),
        _row("main_gpu", "--split-mode none --main-gpu N", f"{_LS}:641-647"),
        _row("use_mmap", "--load-mode none (false)", f"{_LS}:627-638"),
        _row("OLLAMA_KV_CACHE_TYPE", "--cache-type-k/-v", f"{_LS}:394-396; envconfig/config.go:222"),
        _row("OLLAMA_FLASH_ATTENTION", "--flash-attn on|off (unset: auto)", f"{_LS}:597-622; envconfig/config.go:216"),
    ),
    translate=translate,
)


# --- the reverse: a llama-server command as ollama settings (hrm fit's ollama answer) ---------

#: llama-server flags ollama never passes (llm/llama_server.go:368-416,581-647 at the pin build
#: every flag it launches with; api/types.go:568-596 lists every option): placement and cache
#: flags an ollama user cannot set
OLLAMA_CANNOT = {"--n-cpu-moe": "keeps only some layers' experts on the CPU", "-ot": "places tensors by name",
                 "-nkvo": "keeps the KV cache in host memory", "-kvu": "one KV cache the slots share",
                 "--fit": "llama-server's own memory fit"}


def ollama_settings(values: dict[str, list[str]]) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(Modelfile PARAMETERs, server variables, the flags ollama cannot express) that make ollama
    launch ``values`` (llama-server flags as :func:`llama_server_values` writes them), the
    reverse of that mapping: -ngl N -> num_gpu N; -c C -np P -> num_ctx C/P and
    OLLAMA_NUM_PARALLEL P; -ub U -> num_batch U (ollama passes -b U -ub U: the same passes of U
    tokens); -t T -> num_thread T; -fa on|off -> OLLAMA_FLASH_ATTENTION; -ctk/-ctv other than
    f16 -> OLLAMA_KV_CACHE_TYPE. A flag that is off (--n-cpu-moe 0) needs nothing."""
    params: dict[str, str] = {}
    env: dict[str, str] = {}
    slots = int(values.get("-np", ["1"])[0])
    if "-ngl" in values:
        params["num_gpu"] = values["-ngl"][0]
    if "-c" in values:
        params["num_ctx"] = str(int(values["-c"][0]) // slots)
    if slots != DEFAULT_NUM_PARALLEL:
        env["OLLAMA_NUM_PARALLEL"] = str(slots)
    if "-ub" in values:
        params["num_batch"] = values["-ub"][0]
    if "-t" in values:
        params["num_thread"] = values["-t"][0]
    if values.get("-fa", ["auto"])[0] in ("on", "off"):
        env["OLLAMA_FLASH_ATTENTION"] = "1" if values["-fa"][0] == "on" else "0"
    kv = values.get("-ctk", ["f16"])[0]
    if kv != "f16":
        env["OLLAMA_KV_CACHE_TYPE"] = kv
    cannot = [flag for flag in OLLAMA_CANNOT if flag in values and values[flag] != ["0"]]
    return params, env, cannot


def modelfile_text(model: str, params: dict[str, str], env: dict[str, str]) -> str:
    """The settings as a Modelfile (FROM, PARAMETER lines) below the server's variables, in the
    forms :func:`read_settings` reads back."""
    lines = [f"{name}={value} ollama serve" for name, value in env.items()]
    lines.append(f"FROM {model}")
    lines += [f"PARAMETER {name} {value}" for name, value in params.items()]
    return "\n".join(lines)
