"""User-facing errors: the CLI prints their message on one line and exits with ``exit_code``."""


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
    loc = ".".join(str(p) for p in first.get("loc", ())) or "(root)"
    msg = first.get("msg", "invalid")
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{source}: {loc}: {msg}{more}"
