"""One error hierarchy for the whole service.

Every failure a user can cause is an `AppError`: the CLI prints its message and exits with a
non-zero code, the HTTP layer renders it as RFC 9457 problem JSON with its `status`. Anything
else escaping is a bug.
"""

from __future__ import annotations

from typing import Any


class AppError(Exception):
    """A failure caused by input or configuration, explained in `detail`."""

    status: int = 400
    title: str = "Bad request"
    type_slug: str = "bad-request"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra

    def problem(self, instance: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": f"https://twinwatch.dev/problems/{self.type_slug}",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if instance is not None:
            body["instance"] = instance
        body.update(self.extra)
        return body


class DataError(AppError):
    """Input data (CSV, schedule, readings) that cannot be used as given."""

    status = 422
    title = "Invalid data"
    type_slug = "invalid-data"


class ArtifactError(AppError):
    """A model artifact that is missing, truncated, tampered with or incompatible."""

    status = 422
    title = "Invalid model artifact"
    type_slug = "invalid-artifact"


class NotFoundError(AppError):
    status = 404
    title = "Not found"
    type_slug = "not-found"


class ConflictError(AppError):
    status = 409
    title = "Conflict"
    type_slug = "conflict"


class PayloadTooLargeError(AppError):
    status = 413
    title = "Payload too large"
    type_slug = "payload-too-large"


class UnavailableError(AppError):
    """Not now (the bus is away, or no worker answered in time); the answer says whether the
    request may be sent again (Retry-After)."""

    status = 503
    title = "Service Unavailable"
    type_slug = "unavailable"


class ForwardedError(AppError):
    """A problem a bus worker answered (`app/bus/`): told again as it was told there, with the
    instance (the request's path) only the API process knows."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        super().__init__(str(problem.get("detail", "")))
        self.status = status
        self.told = problem

    def problem(self, instance: str | None = None) -> dict[str, Any]:
        rest = dict(self.told)
        body: dict[str, Any] = {
            key: rest.pop(key) for key in ("type", "title", "status", "detail") if key in rest
        }
        if instance is not None:
            rest.pop("instance", None)
            body["instance"] = instance
        return body | rest


class UnauthorizedError(AppError):
    status = 401
    title = "Unauthorized"
    type_slug = "unauthorized"
