"""User-facing errors: the CLI prints their message on one line and exits with ``exit_code``.

Also the one reader of user input files (:func:`read_input_text`): a path is stat-ed before
it is opened, so a FIFO, a device or a directory given as a file is refused instead of
blocking or failing with a traceback, and text that is not UTF-8 is refused by name. YAML
files are parsed by :func:`strict_yaml_load` (:class:`StrictLoader`): duplicate keys, alias
bombs and deep nesting are refused before anything is built, and booleans and numbers are
read as YAML 1.2 reads them (``yes``/``no``/``on``/``off`` and ``1_000`` stay text). JSON
files are read by :func:`read_json_object`: a JSON object, duplicate keys refused.
"""

from __future__ import annotations

import codecs
import json
import os
import re
import stat
from pathlib import Path

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, SequenceNode

#: input files (hardware YAML, plans, engine YAML) larger than this are not what they claim
MAX_INPUT_BYTES = 64 << 20
#: alias uses (``*name``) in one YAML file: the shipped files use none; a hand-written file a
#: few; the billion-laughs bomb needs a few dozen (override: StrictLoader.max_aliases)
MAX_YAML_ALIASES = 100
#: nodes the aliases of one YAML file may add once expanded: 9 levels of 9 aliases (81 uses)
#: expand to 9^9 nodes, so the use count alone does not stop a bomb (override:
#: StrictLoader.max_alias_nodes)
MAX_YAML_ALIAS_NODES = 10_000
#: nesting of YAML collections (after alias expansion): the deepest input schema (a profile's
#: efficiency curves) nests 4 levels; 32 is far beyond and far below Python's recursion limit
#: (override: StrictLoader.max_depth)
MAX_YAML_DEPTH = 32


class HRMError(Exception):
    """Bad input (file, field, flag). Exit code 2."""

    exit_code = 2


class InfeasibleError(HRMError):
    """The inputs admit no policy (a memory limit binds). Exit code 3."""

    exit_code = 3


def pydantic_message(source: str, err) -> str:
    """One line from a pydantic ValidationError: ``source: field.path: reason`` (first error, + count)."""
    errors = err.errors()
    first = errors[0]
    loc = ".".join(str(p) for p in first.get("loc", ()))
    msg = str(first.get("msg", "invalid"))
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    msg = " ".join(msg.split())  # one line
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{source}: {loc + ': ' if loc else ''}{msg}{more}"


def file_kind(mode: int) -> str:
    """'a directory', 'a FIFO (named pipe)', ... for a non-regular file's mode."""
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def shown_key(key) -> str:
    """A key as printed in one-line messages (quoted if it has commas or unprintable characters)."""
    text = str(key)
    if not text.isprintable() or "," in text or not text:
        text = json.dumps(text)
    return text if len(text) <= 200 else text[:197] + "..."


def shown_value(value) -> str:
    """A JSON value, shortened to 40 characters, for messages."""
    try:
        text = json.dumps(value, allow_nan=True)
    except (TypeError, ValueError, RecursionError):  # e.g. an int beyond the digit limit of str()
        text = f"a {value.bit_length()}-bit integer" if isinstance(value, int) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def value_kind(value) -> str:
    """A JSON value's kind for messages: 'the boolean true', 'the string "x"', 'a list', 'null', '42'."""
    if isinstance(value, bool):
        return f"the boolean {shown_value(value)}"
    if isinstance(value, str):
        return f"the string {shown_value(value)}"
    if isinstance(value, (list, dict)):
        return f"{'a list' if isinstance(value, list) else 'an object'}"
    if value is None:
        return "null"
    return shown_value(value)


def read_input_text(path: str | Path, expected: str = "a file", max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of the regular file ``path``; HRMError (one line naming the path) for a
    missing file, a directory, a FIFO or device (never opened: stat first, then opened
    non-blocking and re-checked), a file over ``max_bytes``, or text that is not UTF-8."""
    path = Path(path)
    try:
        info = os.stat(path)
    except (OSError, ValueError) as exc:
        raise HRMError(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        raise HRMError(f"{path}: {file_kind(info.st_mode)}, not a regular file; expected {expected}")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise HRMError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # swapped between the stat and the open
            raise HRMError(f"{path}: {file_kind(mode)}, not a regular file; expected {expected}")
        with os.fdopen(fd, "rb") as handle:
            fd = -1
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise HRMError(f"{path}: cannot read ({exc.strerror or exc})") from None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > max_bytes:
        raise HRMError(f"{path}: larger than {max_bytes >> 20} MiB; expected {expected}")
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise HRMError(f"{path}: UTF-16/UTF-32 text; expected UTF-8")
    nul = data.find(b"\0")
    if nul >= 0:
        raise HRMError(f"{path}: not UTF-8 text (NUL byte at offset {nul}; binary?)")
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HRMError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}; "
                       f"Latin-1 or binary?)") from None


# YAML 1.2 core schema: only these are booleans (YAML 1.1's yes/no/on/off/y/n stay text)
_BOOL_RE = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
# YAML 1.2 core integers: decimal, 0o octal, 0x hex (none of YAML 1.1's "_" separators, 0b,
# leading-zero octal or base 60)
_INT_RE = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
# floats keep YAML 1.1's dot (1e3 stays text, as hrm.bounds says) and take YAML 1.2's
# optional exponent sign (1.0e3 is a float); no "_" separators, no base 60
_FLOAT_RE = re.compile(r"^(?:[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
                       r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
_DECIMAL_RE = re.compile(r"^[-+]?[0-9]+$")
_MERGE_TAG = "tag:yaml.org,2002:merge"


class StrictLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, strict (see the module docstring): limits are class attributes,
    so a subclass may raise them."""

    max_aliases = MAX_YAML_ALIASES
    max_alias_nodes = MAX_YAML_ALIAS_NODES
    max_depth = MAX_YAML_DEPTH

    def __init__(self, stream):
        super().__init__(stream)
        self._aliases = 0
        self._literal_nodes = 0
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(AliasEvent):
            self._aliases += 1
            if self._aliases > self.max_aliases:
                raise ComposerError(None, None, f"more than {self.max_aliases} alias uses (an alias bomb?)",
                                    self.peek_event().start_mark)
            return super().compose_node(parent, index)
        self._literal_nodes += 1
        self._depth += 1
        try:
            if self._depth > self.max_depth:
                raise ComposerError(None, None, f"nested deeper than {self.max_depth} levels",
                                    self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None and self._aliases:
            self._check_expansion(node)
        return node

    def _check_expansion(self, root) -> None:
        """Refuse a document whose aliases add more than ``max_alias_nodes`` nodes once
        expanded, nest it deeper than ``max_depth``, or refer to their own node; measured on
        the node graph (an alias is one shared node), so nothing is expanded to find out."""
        measured: dict[int, tuple[int, int] | None] = {}  # id -> (nodes, levels); None: in progress
        budget = self._literal_nodes + self.max_alias_nodes

        def measure(node, depth: int) -> tuple[int, int]:
            """(nodes, levels) of ``node`` expanded, found at ``depth`` (the root is 1)."""
            if not isinstance(node, (SequenceNode, MappingNode)):
                return 1, 1
            if id(node) in measured:
                known = measured[id(node)]
                if known is None:
                    raise ComposerError(None, None, "an alias refers to a node that holds it", node.start_mark)
            else:
                measured[id(node)] = None  # meeting it again below itself is a cycle
                children = node.value if isinstance(node, SequenceNode) else [n for pair in node.value for n in pair]
                nodes, levels = 1, 1
                for child in children:
                    child_nodes, child_levels = measure(child, depth + 1)
                    nodes, levels = nodes + child_nodes, max(levels, child_levels + 1)
                    if nodes > budget:
                        raise ComposerError(None, None, f"its aliases expand it by more than {self.max_alias_nodes} "
                                            f"nodes (an alias bomb?)", node.start_mark)
                known = measured[id(node)] = (nodes, levels)
            if depth + known[1] - 1 > self.max_depth:
                raise ComposerError(None, None, f"nested deeper than {self.max_depth} levels once its aliases "
                                    f"are expanded", node.start_mark)
            return known

        measure(root, 1)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, MappingNode):
            lines: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue  # "<<" merges: explicit keys may override merged ones
                key = self.construct_object(key_node, deep=True)
                try:
                    first = lines.get(key)
                except TypeError:
                    continue  # an unhashable key: SafeLoader refuses it
                if first is not None:
                    raise ConstructorError(None, None, f"duplicate key {repr(key)[:60]} (first on line {first})",
                                           key_node.start_mark)
                lines[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)

    def construct_yaml_bool(self, node):
        value = self.construct_scalar(node)
        if not _BOOL_RE.match(value):
            raise ConstructorError(None, None, f"{value!r} is not a boolean (true or false)", node.start_mark)
        return value.lower() == "true"

    def construct_yaml_int(self, node):
        value = self.construct_scalar(node)
        if not _INT_RE.match(value):
            raise ConstructorError(None, None, f"{value!r} is not an integer", node.start_mark)
        base = {"0o": 8, "0x": 16}.get(value[:2], 10)
        return int(value if base == 10 else value[2:], base)

    def construct_yaml_float(self, node):
        value = self.construct_scalar(node)
        if not (_FLOAT_RE.match(value) or _DECIMAL_RE.match(value)):
            raise ConstructorError(None, None, f"{value!r} is not a number", node.start_mark)
        return float(value.lower().replace(".inf", "inf").replace(".nan", "nan"))


for _tag in ("bool", "int", "float"):
    StrictLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", getattr(StrictLoader, f"construct_yaml_{_tag}"))
# implicit resolvers: SafeLoader's less YAML 1.1's bool/int/float, then YAML 1.2's
_NUMERIC_TAGS = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}
StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _NUMERIC_TAGS]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
StrictLoader.add_implicit_resolver("tag:yaml.org,2002:bool", _BOOL_RE, list("tTfF"))
StrictLoader.add_implicit_resolver("tag:yaml.org,2002:int", _INT_RE, list("-+0123456789"))
StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_RE, list("-+0123456789."))


def strict_yaml_load(text: str):
    """``text`` parsed by :class:`StrictLoader`; yaml.YAMLError (with the line) on a
    duplicate key, an alias bomb, nesting too deep or a bad explicit ``!!bool/int/float``."""
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass


def read_yaml_mapping(path: str | Path, expected: str, fields: str) -> dict:
    """The mapping the YAML file ``path`` holds (:func:`read_input_text` first, then
    :func:`strict_yaml_load`); HRMError, one line naming the file (and the line of a syntax
    error, a duplicate key or an alias bomb), when it is not YAML or not a mapping of ``fields``."""
    text = read_input_text(path, expected)
    try:
        data = strict_yaml_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise HRMError(f"{path}:{where} malformed YAML ({problem})") from None
    except (ValueError, RecursionError) as exc:  # e.g. a date such as 2024-02-30, or nesting too deep
        raise HRMError(f"{path}: malformed YAML ({' '.join(str(exc).split())[:100] or type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise HRMError(f"{path}: expected a mapping of {fields}, got {type(data).__name__}")
    return data


def refuse_non_finite(name: str):
    """JSON's NaN / Infinity (Python's json reads them by default): no input of ours holds them."""
    raise ValueError(f"{name} is not a finite number")


def read_json_object(path: str | Path, expected: str, max_bytes: int = MAX_INPUT_BYTES,
                     top_level: str = "at the top level", finite: bool = False) -> dict:
    """The JSON object the file ``path`` holds (:func:`read_input_text` first, then JSON with
    duplicate keys refused); HRMError, one line naming the file (and the line and column of a
    syntax error, or the duplicate key), when it is not JSON or not an object. ``finite``: NaN
    and Infinity are refused here (else the caller's schema names the field that holds one).
    ``top_level`` follows "expected a JSON object" in the message for another value."""
    text = read_input_text(path, expected, max_bytes)

    def no_duplicates(pairs):
        seen = {}
        for key, value in pairs:
            if key in seen:
                raise HRMError(f"{path}: {shown_key(key)}: duplicate key (JSON keeps only one; which was meant?)")
            seen[key] = value
        return seen

    try:
        data = json.loads(text, object_pairs_hook=no_duplicates, parse_constant=refuse_non_finite if finite else None)
    except json.JSONDecodeError as exc:
        raise HRMError(f"{path}: malformed JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise HRMError(f"{path}: malformed JSON (nested too deeply)") from None
    except ValueError as exc:  # NaN/Infinity, or an integer literal beyond Python's digit limit
        raise HRMError(f"{path}: malformed JSON ({' '.join(str(exc).split())[:80]})") from None
    if not isinstance(data, dict):
        raise HRMError(f"{path}: expected a JSON object {top_level}, got {value_kind(data)}")
    return data


def validated(model_class, data: dict, source: str):
    """``model_class.model_validate(data)``; a pydantic error becomes one HRMError line
    naming ``source`` and the field (:func:`pydantic_message`)."""
    from pydantic import ValidationError

    try:
        return model_class.model_validate(data)
    except ValidationError as exc:
        raise HRMError(pydantic_message(source, exc)) from None
