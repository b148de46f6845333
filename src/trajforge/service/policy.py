"""The policy a trainer may name to the rollout service: the endpoint (`base_url`, `model` and
`api_key_env`, the name of a variable of the service's environment that holds the key: a key
never travels in a request) and, per group, sampling settings and limits. POST /v1/policy
changes the service's endpoint; a POST /v1/groups `policy` gives its groups their own lane. Every
field is checked by RunConfig's own validation (config.load.updated_config), so a bad value gets
the words `run` gives its flag, naming the request's field instead.

A new `base_url` is sent the run's key (or the variable `api_key_env` names): a client who may set
them can have a key of the service's delivered to an address of its choice. So only a service that
authenticates its clients (`serve --token`, or the in-process Python API) takes them
(`refuse_redirect`); a loopback service without a token trusts every local user of the machine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from trajforge.config import RunConfig
from trajforge.config.load import updated_config
from trajforge.errors import UsageError

ENDPOINT_FIELDS = ("base_url", "model", "api_key_env")
# what a group's own `policy` may set besides its endpoint: the run's flags of the same names
SAMPLING_FIELDS = ("temperature", "top_p", "max_tokens")
LIMIT_FIELDS = ("max_turns", "timeout", "sample_wall_timeout", "max_tokens_per_sample", "max_cost_per_sample")
POLICY_FIELDS = (*ENDPOINT_FIELDS, "sampling", "limits")


def with_endpoint(config: RunConfig, fields: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> RunConfig:
    """`config` calling the endpoint `fields` name (those not None); UsageError naming the field."""
    changes, names = _endpoint(fields, "", environ)
    return updated_config(config, changes, names)


def with_policy(config: RunConfig, policy: Any, environ: Mapping[str, str] = os.environ) -> RunConfig:
    """`config` under a group's `policy` ({base_url, model, api_key_env, sampling: {SAMPLING_FIELDS},
    limits: {LIMIT_FIELDS}}); UsageError naming the field (policy.sampling.temperature, ...)."""
    if not isinstance(policy, dict):
        raise UsageError("field 'policy' must be an object")
    _known(policy, POLICY_FIELDS, "policy")
    changes, names = _endpoint(policy, "policy.", environ)
    for part, allowed in (("sampling", SAMPLING_FIELDS), ("limits", LIMIT_FIELDS)):
        given = policy.get(part)
        if given is None:
            continue
        if not isinstance(given, dict):
            raise UsageError(f"field 'policy.{part}' must be an object")
        _known(given, allowed, f"policy.{part}")
        changes.update(given)
        names.update({k: f"field 'policy.{part}.{k}'" for k in given})
    return updated_config(config, changes, names)


REDIRECTING = ("base_url", "api_key_env")


def refuse_redirect(fields: Mapping[str, Any], where: str) -> None:
    """UsageError if `fields` name an endpoint or a key variable: for a service whose clients are
    not authenticated."""
    named = [k for k in REDIRECTING if fields.get(k) is not None]
    if named:
        raise UsageError(f"field '{where}{named[0]}': a service without --token takes no endpoint or key variable "
                         "from a request (any local user could have its key sent to an address of theirs); "
                         "start it with --token, or set --base_url where it starts")


def _known(fields: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(fields) - set(allowed))
    if unknown:
        raise UsageError(f"field '{where}.{unknown[0]}' is unknown (known: {', '.join(allowed)})")


def _endpoint(fields: Mapping[str, Any], prefix: str, environ: Mapping[str, str]) -> tuple[dict[str, Any],
                                                                                            dict[str, str]]:
    changes: dict[str, Any] = {k: fields[k] for k in ("base_url", "model") if fields.get(k) is not None}
    names = {k: f"field '{prefix}{k}'" for k in changes}
    variable = fields.get("api_key_env")
    if variable is not None:
        if not isinstance(variable, str) or not variable:
            raise UsageError(f"field '{prefix}api_key_env' must name an environment variable, not {variable!r}")
        key = environ.get(variable)
        if not key:
            raise UsageError(f"field '{prefix}api_key_env': the service's environment has no variable {variable!r} "
                             "(set it where the service starts)")
        changes["api_key"], names["api_key"] = key, f"field '{prefix}api_key_env'"
    return changes, names
