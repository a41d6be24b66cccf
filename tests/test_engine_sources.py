"""Every value of a shipped engine YAML cites the source it was checked against.

Our rule (hrm/engines/engine.py, docs/engines/): each value of ``hrm/data/engines/*.yaml`` is
checked against the engine's own source at a pinned commit and cites it in a trailing
comment, as ``file:line`` (or ``:line`` of the file the header names, a ``#NNN`` issue or
pull request, a URL, or a ``§`` section of the paper or document named there). A value
with no such source says so: its comment starts with ``assumption:``.

The files are read as text, line by line (comments are lost to a YAML parser). Exempt:
``name:`` and ``description:`` (no engine fact), section headers (``memory:``, a key with
no value on its line), the items of ``sources:`` (they are the citations), and
``launches.source:`` (its quoted value is itself the citation).
"""

from __future__ import annotations

import re

import pytest

from hrm.engines.engine import ENGINES_DIR

ENGINE_FILES = sorted(ENGINES_DIR.glob("*.yaml"))

#: ``key: value`` at any depth (a value may be a scalar or a flow list / mapping)
KEY_VALUE = re.compile(r"^(?P<indent>\s*)(?P<key>(?:--)?[A-Za-z_][\w.-]*):(?:\s+(?P<rest>.*))?$")
#: a citation: path:line(s) or :line(s) of the named file, #issue, a URL, or a § section
CITATION = re.compile(r"(?:\w[\w./+-]*)?:\d+|#\d+|https?://\S+|§\s*\d")
EXEMPT_KEYS = {"name", "description", "source"}


def _split_comment(rest: str) -> tuple[str, str | None]:
    """The value part and the trailing comment (None if none) of what follows ``key:``.

    A ``#`` starts a comment only after whitespace and outside quotes (YAML's rule)."""
    quote = None
    for i, ch in enumerate(rest):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'" and (i == 0 or rest[i - 1] in " [{,:"):
            quote = ch
        elif ch == "#" and (i == 0 or rest[i - 1] in " \t"):
            return rest[:i].rstrip(), rest[i + 1:].strip()
    return rest.rstrip(), None


def valued_lines(path):
    """(line number, dotted key, value, comment) of every checked ``key: value`` line."""
    parents: list[tuple[int, str]] = []   # (indent, key) of the open section headers
    in_sources = False
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.rstrip()
        stripped = line.lstrip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(line) - len(stripped)
        if indent == 0:
            in_sources = stripped.startswith("sources:")
        if stripped.startswith("- "):
            if in_sources:
                continue
            raise AssertionError(f"{path.name}:{number}: unexpected list item outside sources: {line!r}")
        match = KEY_VALUE.match(line)
        assert match, f"{path.name}:{number}: not a 'key: value' line: {line!r}"
        key = match.group("key")
        while parents and parents[-1][0] >= indent:
            parents.pop()
        dotted = ".".join([p for _, p in parents] + [key])
        value, comment = _split_comment(match.group("rest") or "")
        if not value:                       # a section header (its own comment optional)
            parents.append((indent, key))
            continue
        if key in EXEMPT_KEYS:
            continue
        yield number, dotted, value, comment


def test_engine_files_exist():
    assert len(ENGINE_FILES) >= 10, ENGINE_FILES


@pytest.mark.parametrize("path", ENGINE_FILES, ids=lambda p: p.name)
def test_every_value_cites_its_source(path):
    missing = []
    for number, key, value, comment in valued_lines(path):
        if comment is None:
            missing.append(f"{path.name}:{number} {key}: {value}  (no comment)")
        elif not (comment.startswith("assumption:") or CITATION.search(comment)):
            missing.append(f"{path.name}:{number} {key}: {value}  (comment cites no file:line, "
                           f"#issue, URL or §, and is not labelled 'assumption:': {comment!r})")
    assert not missing, "engine values without a source:\n" + "\n".join(missing)


def test_checker_sees_nested_and_flow_values(tmp_path):
    """The checker itself: nested keys, flow mappings, quoted '#', exemptions."""
    sample = tmp_path / "x.yaml"
    sample.write_text(
        "# header\n"
        "name: x\n"
        "description: a # not checked\n"
        "schedule: flexgen   # flex_moe.py:1089\n"
        "decode: {weight_path: pinned, kv_cache: pinned}\n"
        "memory:\n"
        "  pinned_staging_layers: 0   # assumption: no staging\n"
        "  gpu_weight_buffer_layers: 2   # double buffer\n"
        "launches:\n"
        '  source: "op_counts.md # 3"\n'
        "sources:\n"
        "  - a.py:1\n")
    got = {key: comment for _, key, _, comment in valued_lines(sample)}
    assert got == {"schedule": "flex_moe.py:1089", "decode": None,
                   "memory.pinned_staging_layers": "assumption: no staging",
                   "memory.gpu_weight_buffer_layers": "double buffer"}
    assert CITATION.search("flex_moe.py:1089") and CITATION.search("(:734-736)")
    assert CITATION.search("pytorch/pytorch#107667") and not CITATION.search("double buffer")
    assert _split_comment('"a # b"  # c') == ('"a # b"', "c")
