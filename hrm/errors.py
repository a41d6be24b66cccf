"""User-facing errors: the CLI prints their message on one line and exits with ``exit_code``.

Also the one reader of user input files (:func:`read_input_text`): a path is stat-ed before
it is opened, so a FIFO, a device or a directory given as a file is refused instead of
blocking or failing with a traceback, and text that is not UTF-8 is refused by name.
"""

from __future__ import annotations

import codecs
import os
import stat
from pathlib import Path

#: input files (hardware YAML, plans, engine YAML) larger than this are not what they claim
MAX_INPUT_BYTES = 64 << 20


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


def read_yaml_mapping(path: str | Path, expected: str, fields: str) -> dict:
    """The mapping the YAML file ``path`` holds (:func:`read_input_text` first); HRMError,
    one line naming the file (and the line of a syntax error), when it is not YAML or not
    a mapping of ``fields``."""
    import yaml

    text = read_input_text(path, expected)
    try:
        data = yaml.safe_load(text)
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


def validated(model_class, data: dict, source: str):
    """``model_class.model_validate(data)``; a pydantic error becomes one HRMError line
    naming ``source`` and the field (:func:`pydantic_message`)."""
    from pydantic import ValidationError

    try:
        return model_class.model_validate(data)
    except ValidationError as exc:
        raise HRMError(pydantic_message(source, exc)) from None
