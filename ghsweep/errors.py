"""An exception told in one line: run records, tags and tables hold one line per failure."""

from __future__ import annotations


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def one_line(exc: BaseException) -> str:
    """`TypeName: first line of the message`."""
    return f"{type(exc).__name__}: {first_line(exc)}"
