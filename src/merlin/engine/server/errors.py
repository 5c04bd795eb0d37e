"""API errors as OpenAI-style JSON error objects.

Every error the server answers is `{"error": {"message", "type", "param", "code"}}` with a 4xx
or 5xx status: `param` names the request field at fault (e.g. `messages[2].content[0]`), so a
client can show the user what to fix. Nothing here imports Starlette: the schema and the
engine adapter raise ApiError, the app turns it into a response.
"""

from __future__ import annotations


class ApiError(Exception):
    def __init__(
        self,
        message: str,
        param: str | None = None,
        *,
        status: int = 400,
        code: str | None = None,
        type: str | None = None,
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code
        self.type = type or _default_type(status)
        self.headers = headers or {}

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def _default_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 404:
        return "not_found_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"
