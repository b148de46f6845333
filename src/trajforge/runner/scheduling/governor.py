"""Spend and load control set up from the run's configuration: prices, the model gate, the budget.

Kept apart from runner.invocation so that the start-up check (a budget needs prices) and the budget's
continuation from earlier invocations are each one call. The gate's construction lives with the
sample worker (trajforge.sample.gate_builder), which every executor shares.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from trajforge.config import RunConfig
from trajforge.errors import UsageError
from trajforge.model.client import DEFAULT_BASE_URL
from trajforge.model.pricing import COST_REPORTING_HOSTS, price_known
from trajforge.runner.scheduling.budget import Budget
from trajforge.runner.state.checkpoint_file import InvocationEntry


def check_prices(config: RunConfig, model: str) -> None:
    """Refuse a run with a cost limit whose model (`model`, the one it will use) cannot be costed
    (UsageError, exit 2)."""
    flags = [f for f in ("max_cost", "max_cost_per_sample") if getattr(config, f) is not None]
    if not flags:
        return
    settings = config.model_settings()
    url = settings.base_url or DEFAULT_BASE_URL
    if not price_known(model, url, settings.pricing):
        # Whether this endpoint puts a cost in its replies cannot be known before a call: say what
        # trajforge relies on, not that the endpoint lacks it (a proxy may well report one).
        raise UsageError(
            f"--{flags[0]} needs the price of model {model!r} before the run starts: trajforge relies on "
            f"a reply's own cost only from {' or '.join(COST_REPORTING_HOSTS)}, and the --config file's pricing "
            f"table has no entry for this model at {url}. Add one: pricing: {{{json.dumps(model)}: "
            "{prompt: USD_PER_MTOK, completion: USD_PER_MTOK}}")


def budget_for(config: RunConfig, invocations: Iterable[InvocationEntry], to_run: int,
               recovered: tuple[float, int] = (0.0, 0)) -> Budget:
    """This invocation's budget, continuing the spend that checkpoint.json recorded plus what the
    batch files showed it lacked (`recovered`: USD, samples; runner.state.recovery)."""
    return Budget.from_invocations(config.max_cost, invocations, to_run, recovered)
