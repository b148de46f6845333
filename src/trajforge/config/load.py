"""A run's configuration as the user writes it: YAML files, the command line, and their errors.

This module owns reading a YAML config file (load_yaml_mapping, which the compressor's and the
scheduler's files use too), the run file's format (flat flag-named keys, plus `parallelism` as a
nested section or the flat alias of `num_workers`), the merge defaults < YAML file (--config) <
command line, and turning pydantic's validation failures into one line per problem that names the
flag or file key and says what is allowed. What the settings are and which values are valid is
trajforge.config's (RunConfig, with trajforge.config.checks); this module only reads and explains,
so of trajforge it imports that model, its checks' OutOfRange and the error tree alone.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePath
from typing import Any

import yaml
from pydantic import ValidationError

from trajforge.config import RunConfig
from trajforge.config.sections import UnknownDistribution, suggest, unknown_choice
from trajforge.config.checks import OutOfRange
from trajforge.errors import ConfigError, UsageError
from trajforge.registry import did_you_mean

_NESTED_PARALLELISM = {"max_workers": "num_workers", "batch_size": "batch_size", "timeout": "timeout",
                       "samples_per_prompt": "samples_per_prompt"}
# Pydantic error types -> what is allowed, in words a user of the command line understands.
_PLAIN = {"int_parsing": "must be a whole number", "int_type": "must be a whole number",
          "int_from_float": "must be a whole number", "float_parsing": "must be a number",
          "float_type": "must be a number", "string_type": "must be a string", "bool_parsing": "must be true or false",
          "bool_type": "must be true or false", "dict_type": "must be a mapping", "model_type": "must be a mapping",
          "list_type": "must be a list", "path_type": "must be a path", "string_too_short": "must not be empty",
          # only the sandbox's size strings have a pattern (checks.SIZE_PATTERN, container_memory's)
          "string_pattern_mismatch": "must be a size: a number with an optional unit b, k, m, g or t (e.g. 512m, 4g)"}
_BOUNDS = {"greater_than_equal": "at least", "greater_than": "greater than", "less_than_equal": "at most",
           "less_than": "less than"}


class _DuplicateKey(Exception):
    def __init__(self, key: Any, first: int, second: int) -> None:
        super().__init__(f"key {str(key)!r} appears twice, on lines {first} and {second}; keep one")


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error: PyYAML
    keeps the last one silently, so a setting written twice took effect from the wrong line."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<` merges may override on purpose; a list as a key is refused by PyYAML
            key, line = self.construct_object(key_node), key_node.start_mark.line + 1
            if key in seen:
                raise _DuplicateKey(key, seen[key], line)
            seen[key] = line
        return super().construct_mapping(node, deep)


def load_yaml_mapping(path: Path) -> dict[Any, Any]:
    """A YAML file whose top level is a mapping (empty file: {}); errors name the file (and, for a
    key given twice, the key and both lines)."""
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 -- a SafeLoader
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config file: {e.strerror or e}") from None
    except _DuplicateKey as e:
        raise ConfigError(f"{path}: {e}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid YAML: {e}".splitlines()[0]) from None
    except RecursionError:  # PyYAML composes nested collections recursively: `[[[[...` thousands deep
        raise ConfigError(f"{path}: not valid YAML: collections nested too deeply to read") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, got {type(raw).__name__}")
    return raw


def _read_yaml(path: Path, raw: dict[Any, Any] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """Flat RunConfig keys, and for each the key as written in the file (for error messages).
    `raw`: the file's mapping when the caller has read it already."""
    raw = load_yaml_mapping(path) if raw is None else raw
    flat: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for key, value in raw.items():
        key = str(key).replace("-", "_")
        if key == "parallelism" and not isinstance(value, dict):
            flat["num_workers"], origin["num_workers"] = value, key  # flat form of the --parallelism flag
        elif key == "parallelism":
            for sub, v in value.items():
                if sub not in _NESTED_PARALLELISM:
                    allowed = [f"parallelism.{k}" for k in _NESTED_PARALLELISM]
                    raise ConfigError(f"{path}: {unknown_choice('key', f'parallelism.{sub}', allowed)}")
                flat[_NESTED_PARALLELISM[sub]], origin[_NESTED_PARALLELISM[sub]] = v, f"parallelism.{sub}"
        elif key in RunConfig.model_fields:
            flat[key], origin[key] = value, key
        else:
            allowed = [*RunConfig.model_fields, "parallelism"]
            raise ConfigError(f"{path}: {unknown_choice('key', key, allowed)}")
    return flat, origin


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML config file into flat RunConfig keys; errors name the file and key."""
    return _read_yaml(path)[0]


def build_config(cli_values: dict[str, Any], config_file: Path | None = None,
                 file_keys: dict[str, Any] | None = None) -> RunConfig:
    """Merge defaults < YAML < CLI and validate; errors name the flag (or file key) and value.

    `cli_values` may hold `parallelism`, the alias of `num_workers`; errors then name --parallelism.
    """
    if config_file is not None and str(config_file) == ".":  # `--config=` arrives as Path('.')
        raise UsageError("--config: invalid value '': must be the path of a YAML file")
    file_values, origin = _read_yaml(config_file, file_keys) if config_file else ({}, {})
    cli = dict(cli_values)
    flags = {k: f"--{k}" for k in cli}
    if "parallelism" in cli:
        workers = cli.pop("parallelism")
        if "num_workers" in cli and cli["num_workers"] != workers:
            raise UsageError(f"--parallelism={workers} and --num_workers={cli['num_workers']} disagree; give one")
        cli["num_workers"] = workers
        flags["num_workers"] = "--parallelism"
    try:
        return RunConfig.model_validate({**file_values, **cli})
    except ValidationError as e:
        raise UsageError(_describe(e, flags, config_file, origin)) from None


def updated_config(config: RunConfig, changes: dict[str, Any], names: dict[str, str]) -> RunConfig:
    """`config` with `changes`, validated as a new RunConfig is (each field's own checks, in the
    same words as build_config's): `model_copy(update=...)` would check nothing. An error names a
    changed key as `names` says (e.g. "field 'base_url'"), any other as its flag."""
    try:
        return RunConfig.model_validate({**config.model_dump(exclude_unset=True), **changes})
    except ValidationError as e:
        raise UsageError(_describe(e, {k: names.get(k, f"--{k}") for k in changes}, None, {})) from None


def _describe(e: ValidationError, flags: dict[str, str], config_file: Path | None, origin: dict[str, str]) -> str:
    """One line per problem: `--flag: invalid value V: what is allowed`, or `file: key 'k': ...`."""
    lines = []
    for err in e.errors():
        parts = [str(p) for p in err["loc"]]
        msg, value = err["msg"].removeprefix("Value error, "), err.get("input")
        exc = err.get("ctx", {}).get("error")
        if not parts and isinstance(exc, UnknownDistribution):
            parts, value, msg = ["distribution"], exc.value, "no such distribution" + suggest(exc.value, exc.allowed)
        elif isinstance(exc, OutOfRange):  # found by a section's own check: name the key inside it
            parts, value, msg = [*parts, *exc.path], exc.value, f"must be at most {exc.bound}"
        if not parts:
            lines.append(msg)
            continue
        top = parts[0]
        if "expected" in err.get("ctx", {}):
            choices = re.findall(r"'([^']*)'", err["ctx"]["expected"])
            hint = did_you_mean(value, choices) if isinstance(value, str) else ""
            msg = f"must be one of {err['ctx']['expected']}{hint}"
        elif err["type"] in _BOUNDS:
            bound = next(iter(err["ctx"].values()))
            msg = f"must be {_BOUNDS[err['type']]} {f'{bound:g}' if isinstance(bound, float) else bound}"
        else:
            msg = _PLAIN.get(err["type"], msg)
        if top in flags:
            where = flags[top]
        elif config_file is not None:
            where = f"{config_file}: key '{'.'.join([origin.get(top, top), *parts[1:]])}'"
        else:
            where = f"--{top}"
        if err["type"] == "extra_forbidden":
            lines.append(f"{where}: unknown key")
        elif err["type"] == "empty_path":
            lines.append(f"{where}: {msg}")  # the value shown would be '.', whatever was typed
        elif err["type"] == "missing":
            lines.append(f"{where}: missing")
        else:
            shown = "***" if top == "api_key" else _shown(value)
            lines.append(f"{where}: invalid value {shown}: {msg}")
    return "\n".join(lines)


def _shown(value: Any) -> str:
    """A refused value as the user wrote it: a path as text, a URL without its password."""
    if isinstance(value, PurePath):
        return repr(str(value))
    if isinstance(value, str):  # a bad --base_url may still hold credentials (https://user:pw@host)
        return repr(re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", value))
    return repr(value)
