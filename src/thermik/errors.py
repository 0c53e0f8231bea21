"""The one type of error a user can fix, and how the CLI shows it (docs/reliability.md, "Errors are one line").

A `ThermikError` carries one line naming the cause and the setting or command to change. `thermik` prints it as
`thermik <command>: <message>` with no traceback and exits with the error's `exit_code`; `--debug` or
`THERMIK_DEBUG=1` shows the traceback too. Any other exception is a bug: it keeps its traceback, and the CLI says so.

Imports nothing from thermik: every layer may raise it.
"""

from __future__ import annotations


class ThermikError(Exception):
    """A failure the user can fix (bad input, a setting too small, a missing server): one line, no traceback."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(f"{message}; {hint}" if hint else message)

    def __reduce__(self) -> tuple[object, ...]:
        """Pickle by state, not by constructor arguments (subclasses take other ones): a Ray worker's error arrives
        whole in its driver."""
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls: type[ThermikError], args: tuple[object, ...], state: dict[str, object]) -> ThermikError:
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class NothingDoneError(ThermikError):
    """A command ran to its end but did not do the work it was asked to do (no problem scored, no batch trained)."""

    exit_code = 3
