"""Run-time checks of the arguments of every public call, shared by the whole
package: a wrong type fails at once, before anything is sent, with a
`TypeError` naming the call and the parameter, as the TypeScript client's do
(``mkdir_fs: path must be a str, not int``; `research/contract.md`, "The
Python package").

`call` is the name a user typed: the method's name for a client method
(``mkdir_fs``), ``Class.method`` for other classes (``ProcessHandle.resize``,
``SandboxAgentClient.start``), the class for a constructor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def describe(value: Any) -> str:
    """How an error message names what it got: the type's name."""
    return type(value).__name__


def type_error(call: str, name: str, expected: str, value: Any, *, got: str | None = None) -> TypeError:
    """``TypeError("<call>: <name> must be <expected>, not <got>")``; `got`
    defaults to `value`'s type name."""
    return TypeError(f"{call}: {name} must be {expected}, not {got if got is not None else describe(value)}")


def check(
    call: str, name: str, value: Any, kinds: type | tuple[type, ...], expected: str, *, optional: bool = False
) -> None:
    """Raises `type_error` unless `value` is an instance of `kinds` (or, with
    `optional`, ``None``). A bool is not an int here unless `kinds` names bool."""
    if optional and value is None:
        return
    allowed = kinds if isinstance(kinds, tuple) else (kinds,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in allowed):
        raise type_error(call, name, expected + (" or None" if optional else ""), value)


def check_str(call: str, name: str, value: Any, *, optional: bool = False) -> None:
    """`check` for a str."""
    check(call, name, value, str, "a str", optional=optional)


def check_int(call: str, name: str, value: Any, *, optional: bool = False) -> None:
    """`check` for an int (not a bool)."""
    check(call, name, value, int, "an int", optional=optional)


def check_bool(call: str, name: str, value: Any) -> None:
    """`check` for a bool."""
    check(call, name, value, bool, "a bool")


def check_str_list(call: str, name: str, value: Any, *, optional: bool = False) -> None:
    """A list of str (or, with `optional`, ``None``); a wrong item is named by its type."""
    if optional and value is None:
        return
    expected = "a list of str" + (" or None" if optional else "")
    if not isinstance(value, list):
        raise type_error(call, name, expected, value)
    for item in value:
        if not isinstance(item, str):
            raise type_error(call, name, expected, value, got=f"a list holding {describe(item)}")


def check_str_mapping(call: str, name: str, value: Any, *, optional: bool = False) -> None:
    """A mapping of str to str (or, with `optional`, ``None``)."""
    if optional and value is None:
        return
    expected = "a mapping of str to str" + (" or None" if optional else "")
    if not isinstance(value, Mapping):
        raise type_error(call, name, expected, value)
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise type_error(call, name, expected, value, got=f"a mapping holding {describe(key)}: {describe(item)}")


def check_callable(call: str, name: str, value: Any, *, optional: bool = False) -> None:
    """A callable (or, with `optional`, ``None``)."""
    if optional and value is None:
        return
    if not callable(value):
        raise type_error(call, name, "callable" + (" or None" if optional else ""), value)
