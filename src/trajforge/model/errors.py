"""Exceptions raised by model clients. Each says whether it is worth retrying the sample.

`ModelCallError` is a per-sample failure (recorded, retried on resume); `FatalModelError`
(in trajforge.errors) stops the whole run, e.g. a rejected API key.
"""

from __future__ import annotations

from trajforge.errors import FatalModelError, SampleFailure

__all__ = ["ModelCallError", "RateLimitedError", "APIFailure", "ModelTimeoutError", "ModelOutputError", "FatalModelError"]


class ModelCallError(SampleFailure):
    """A model call failed after the client's own retries; the sample fails with `failure_class`."""

    failure_class = "api_error"


class RateLimitedError(ModelCallError):
    failure_class = "rate_limit"


class APIFailure(ModelCallError):
    """5xx, timeout, dropped connection (after retries) or a 400/404 the API will not accept."""

    failure_class = "api_error"


class ModelTimeoutError(APIFailure):
    """Every attempt ran past --request_timeout: the sample fails as `timeout`, like a sample that
    ran past --timeout, so "the model is too slow" is told apart from "the API is broken"."""

    failure_class = "timeout"


class ModelOutputError(ModelCallError):
    """The model returned something unusable (no choices, malformed message)."""

    failure_class = "model_error"
