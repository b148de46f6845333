"""The run's nested sections of its configuration, and the wording of an unknown choice.

RunConfig (config/__init__.py) holds these as `task_types` and `distributions`; each section
validates its own values (the other layers' nested sections, `pricing`, `network` and `tools`,
are declared in their own sections). `unknown_choice` words a value that is not one of the allowed
(with the closest name first), for RunConfig and the file reader (config/load.py) alike. A leaf
beside RunConfig: it imports the toolset catalog and the registry's wording, nothing above.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trajforge.catalog import TOOLSETS, toolset_names
from trajforge.registry import did_you_mean


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TaskTypeConfig(_Strict):
    retry_limit: int = Field(1, ge=0, le=1_000, description="in-run retries of a failed sample of this type")
    # Verification defaults for rows of this type (a row's own field wins); see trajforge.verify.
    check: str | None = Field(None, min_length=1)
    check_timeout: float | None = Field(None, gt=0)
    expected: str | None = None
    match: Literal["exact", "contains", "regex", "number"] | None = None
    rubric: str | None = Field(None, min_length=1)
    judge_threshold: float | None = Field(None, ge=0, le=1)


class DistributionConfig(_Strict):
    description: str = ""
    toolsets: dict[str, float]

    @field_validator("toolsets", mode="before")
    @classmethod
    def _no_bool_probabilities(cls, v: Any) -> Any:
        # YAML `terminal: yes` would silently become 1%: demand a number.
        if isinstance(v, dict):
            for name, p in v.items():
                if isinstance(p, bool):
                    raise ValueError(f"probability of {name!r} must be a number of percent, got {p}")
        return v

    @field_validator("toolsets")
    @classmethod
    def _known_toolsets(cls, v: dict[str, float]) -> dict[str, float]:
        for name, p in v.items():
            if ":" in name and name not in toolset_names():
                TOOLSETS.outside(name)  # a toolset from outside trajforge; a ValueError says why it is none
            elif name not in toolset_names():
                raise ValueError(unknown_choice("toolset", name, list(toolset_names())))
            if not 0 <= p <= 100:
                raise ValueError(f"probability of {name!r} must be within 0..100, got {p:g}")
        if not v:
            raise ValueError("a distribution needs at least one toolset")
        if not any(v.values()):
            raise ValueError("at least one toolset needs a probability above 0")
        return v


class UnknownDistribution(ValueError):
    """Raised by RunConfig's whole-model check; config/load.py pins it on the `distribution` key."""

    def __init__(self, value: str, allowed: list[str]) -> None:
        super().__init__(unknown_choice("distribution", value, allowed))
        self.value, self.allowed = value, allowed


def suggest(value: str, allowed: list[str]) -> str:
    """'; did you mean 'x'? (allowed: a, b)': the closest name first, for typos."""
    return f"{did_you_mean(value, allowed)} (allowed: {', '.join(allowed)})"


def unknown_choice(what: str, value: str, allowed: list[str]) -> str:
    return f"unknown {what} {value!r}{suggest(value, allowed)}"
