"""The OpenAI error body and the exception that carries it out of a handler."""

from __future__ import annotations

from typing import Any


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """{"error": {"message", "type", "param", "code"}}, as the OpenAI API answers a bad request."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class ApiError(Exception):
    """A request the server refuses; rendered as `error_body(...)` with HTTP `status`."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None, type_: str = ""
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type_ or ("invalid_request_error" if status < 500 else "server_error")
