"""The dataset card (README.md) of an `hf` export: where the data came from and what is in it.

Pure rendering from the run's config.json and statistics.json (when the input is a run) and the
figures of the exported records themselves (a runner.reporting.stats.Totals over what was written, so the
two sections use the same definitions). Secrets never reach the card: config keys naming a key,
token, secret or password are left out whatever their value, and URLs lose credentials and
query strings.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import yaml

# A key holding a secret: api_key, access_token, password... (not max_tokens, not brave_api_key_env,
# which names an environment variable).
_SECRET_KEY = re.compile(r"(^|_)(api_?key|key|token|secret|passw(or)?d|credentials?|auth(orization)?|cookie)$",
                         re.IGNORECASE)
_SECRET_VALUE = re.compile(r"^(sk-|Bearer\s|ghp_|hf_|xox[bp]-)", re.IGNORECASE)


def _clean_url(value: str) -> str:
    try:
        parts = urlsplit(value)
    except ValueError:
        return value
    if not parts.scheme or not parts.netloc:
        return value
    host = parts.hostname or ""
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def scrub(value: Any) -> Any:
    """The config without secrets: secret-named keys dropped, credentials cut out of URLs."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if _SECRET_KEY.search(str(k)):
                continue
            out[k] = scrub(v)
        return out
    if isinstance(value, list):
        return [scrub(v) for v in value]
    if isinstance(value, str):
        if _SECRET_VALUE.match(value):
            return "<removed>"
        if "://" in value:
            return _clean_url(value)
    return value


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _size_category(n: int) -> str:
    for limit, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"),
                        (1_000_000, "100K<n<1M"), (10_000_000, "1M<n<10M")):
        if n < limit:
            return name
    return "n>10M"


def _table(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def _figures(title: str, run: dict[str, Any], verified: tuple[int, int] | None) -> list[str]:
    s = run["samples"]
    out = [f"### {title}", ""]
    rows = [("samples total", s.get("total") if s.get("total") is not None else "-"),
            ("finished", s["finished"]), ("completed", s["completed"]), ("partial", s["partial"]),
            ("failed", s["failed"]), ("discarded", s["discarded"])]
    rows += [(f"failed: {k}", v) for k, v in s.get("failed_by_class", {}).items() if v]
    rows += [(f"discarded: {k}", v) for k, v in s.get("discarded_by_reason", {}).items() if v]
    r = run["reasoning"]
    rows += [("assistant turns", r["assistant_turns"]),
             ("reasoning coverage", "-" if r["coverage"] is None else f"{100 * r['coverage']:.1f}% "
              f"({r['with_reasoning']} of {r['assistant_turns']} turns)"),
             ("api calls", run["api_calls"]),
             ("tokens prompt / completion / reasoning", f"{run['tokens']['prompt']} / "
              f"{run['tokens']['completion']} / {run['tokens']['reasoning']}"),
             ("cost (USD)", run["cost"])]
    verification = _verification_rows(run.get("verification"))
    if verified is not None and verified[0] and not verification:  # else the verification rows say it
        rows.append(("pass rate", f"{_pct(verified[1], verified[0])} ({verified[1]} of {verified[0]} verified)"))
    rows += verification
    out += _table(("figure", "value"), rows)
    tools = [(name, t["count"], t["success"], t["failure"], _pct(t["success"], t["count"]))
             for name, t in run["tools"].items() if t["count"]]
    if tools:
        out += ["", *_table(("tool", "calls", "ok", "failed", "success rate"), tools)]
    return out + [""]


def _verification_rows(v: Any) -> list[tuple[str, Any]]:
    """statistics.json's verification figures (runs whose rows carry checks), when there are any."""
    if not isinstance(v, dict) or not (v.get("verified") or v.get("errors")):
        return []
    rate = v.get("pass_rate")
    rows: list[tuple[str, Any]] = [
        ("pass rate", f"{'-' if rate is None else f'{100 * rate:.1f}%'} ({v.get('passed')} passed, "
                      f"{v.get('failed')} failed)")]
    for name, t in (v.get("by_task_type") or {}).items():
        if isinstance(t, dict) and t.get("pass_rate") is not None:
            rows.append((f"pass rate: {name}", f"{100 * t['pass_rate']:.1f}%"))
    pk = v.get("pass_at_k") if isinstance(v.get("pass_at_k"), dict) else {}
    if v.get("pass_at_1") is not None:
        rows.append((f"pass@1 / pass@{pk.get('k', '-')} ({v.get('rows_with_verdict', v.get('rows'))} rows with "
                     "a verdict)",
                     f"{v['pass_at_1']} / {pk.get('value', '-')}"))
    if v.get("errors"):
        rows.append(("verification errors", v["errors"]))
    return rows


def render(*, name: str, command: str, counts: dict[str, int], exported: dict[str, Any],
           verified: tuple[int, int], drops: list[str], schema_doc: str,
           config: dict[str, Any] | None, statistics: dict[str, Any] | None) -> str:
    total = sum(counts.values())
    config = scrub(config) if config else None
    model = (config or {}).get("model") or (statistics or {}).get("model")
    distribution = (config or {}).get("distribution") or (statistics or {}).get("distribution")
    front = {"pretty_name": name, "tags": ["trajforge", "tool-use", "agent-trajectories", "synthetic"],
             "task_categories": ["text-generation"], "size_categories": [_size_category(total)]}
    out = ["---", yaml.safe_dump(front, sort_keys=False).strip(), "---", "", f"# {name}", "",
           f"Tool-using agent trajectories generated by trajforge with model `{model or 'unknown'}`"
           f" and toolset distribution `{distribution or 'unknown'}`, exported for training.", "",
           "## Contents", ""]
    out += _table(("split", "trajectories"), [(s or "train", n) for s, n in counts.items()])
    out += ["", f"{total} trajectories in all, one row each, OpenAI-style `messages` with structured "
            "`tool_calls`; the columns are listed under Schema below.", ""]
    if drops:
        out += ["Left out of the rows: " + "; ".join(drops) + ".", ""]
    out += ["## Figures", ""]
    out += _figures("This export", exported, verified if verified[0] else None)
    if statistics and isinstance(statistics.get("run"), dict):
        out += _figures("The whole run (statistics.json)", statistics["run"], None)
        merge = statistics.get("merge")
        if isinstance(merge, dict):
            out += ["Merge: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in merge.items()
                                          if not isinstance(v, (list, dict))), ""]
    else:
        out += ["The input was a trajectories file without its run directory: run figures are unknown.", ""]
    out += ["## Export command", "", "```", command, "```", ""]
    if config:
        out += ["## Run configuration", "", "Secrets (API keys, tokens) are left out.", "", "```yaml",
                yaml.safe_dump(config, sort_keys=False).strip(), "```", ""]
    out += ["## Schema", "", schema_doc.strip(), ""]
    return "\n".join(out)
