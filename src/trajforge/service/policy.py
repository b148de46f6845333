"""The policy endpoint a trainer may name to the rollout service: `base_url`, `model` and
`api_key_env` (the name of a variable of the service's environment that holds the key: a key
never travels in a request). POST /v1/policy changes the service's; the same fields are checked
by RunConfig's own validation (config.load.updated_config), so a bad value gets the words `run`
gives its flag, naming the request's field instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from trajforge.config import RunConfig
from trajforge.config.load import updated_config
from trajforge.errors import UsageError

ENDPOINT_FIELDS = ("base_url", "model", "api_key_env")


def with_endpoint(config: RunConfig, fields: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> RunConfig:
    """`config` calling the endpoint `fields` name (those not None); UsageError naming the field."""
    changes: dict[str, Any] = {k: fields[k] for k in ("base_url", "model") if fields.get(k) is not None}
    names = {k: f"field {k!r}" for k in changes}
    variable = fields.get("api_key_env")
    if variable is not None:
        if not isinstance(variable, str) or not variable:
            raise UsageError(f"field 'api_key_env' must name an environment variable, not {variable!r}")
        key = environ.get(variable)
        if not key:
            raise UsageError(f"field 'api_key_env': the service's environment has no variable {variable!r} "
                             "(set it where the service starts)")
        changes["api_key"], names["api_key"] = key, "field 'api_key_env'"
    return updated_config(config, changes, names)
