"""The viewer's web app: a read-only JSON API over the index, and the static page.

An aiohttp application with a small JSON API over the index (view/index.py) and the static page under
view/static (no CDN, no framework: it works offline). The page polls the API, so a live run's
overview and list grow on their own. Every response carries a strict Content-Security-Policy
(scripts only from this server, no inline code) and the page inserts data as text only. Bound to
loopback by default; requests whose Host header is not this server's are refused, so a web page
elsewhere cannot read the run through DNS rebinding.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from trajforge.agent.segments import TOKENS
from trajforge.runner.reader import RunReader, history
from trajforge.sample.outcome import FAILURE_CLASSES
from trajforge.view.conversation import display_turns
from trajforge.view.index import RunIndex
from trajforge.view.overview import Query, apply, distributions, facets, run_totals
from trajforge.view.verifier_logs import verifier_logs

STATIC = Path(__file__).parent / "static"
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
           "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}
MAX_PAGE = 500
REFRESH_EVERY = 1.0  # seconds: at most one look at the files per second, however many requests
SLICE = 0.05  # seconds of indexing at a time: what a request waits at most for each step of it


async def catch_up(index: RunIndex, idle: asyncio.Event | None = None) -> None:
    """Read what the index has not read yet (a big run), a slice at a time, between requests
    (`idle`: set while no request is being answered)."""
    while index.busy():
        if idle is not None:
            await idle.wait()
        index.refresh(SLICE)
        await asyncio.sleep(0)


def invocation_settings(invocations: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's models and each change of settings between invocations (runner.reporting.settings), as
    statistics.json lists them: shown by the overview when a resume changed any."""
    from types import SimpleNamespace

    models, changed = history([SimpleNamespace(model=i.get("model"), settings=i.get("settings"))
                               for i in invocations])
    return {"models": models, "settings_changes": [c.to_json() for c in changed]}


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS), status=status,
                        content_type="application/json")


class Viewer:
    def __init__(self, index: RunIndex) -> None:
        self.index = index
        self._last_refresh = 0.0
        self._cost = self._work = 0.0  # seconds the last refresh and the rebuilds after it took
        self._seen_stats: tuple[int, int] | None = None
        self._cache: dict[Any, tuple[int, Any]] = {}
        self.statics = {p.name: p for p in STATIC.iterdir() if p.suffix in _TYPES}
        self.allowed_hosts: set[str] | None = set()  # nothing is served until the port is known
        self.answering = 0  # requests being answered: the index is read on (catch_up) when none is
        self.idle = asyncio.Event()
        self.idle.set()

    def refresh(self) -> None:
        """Look at the files at most every REFRESH_EVERY seconds, and less often when taking in
        changes is costly (a big live run), so watching a run takes at most ~10% of a core."""
        if self.index.busy():
            return  # catch_up is reading the files: answer from what is read so far
        now = time.monotonic()
        stats = self._stats_signature()  # a run that just ended: show its final state at once
        if now - self._last_refresh < max(REFRESH_EVERY, 10 * self._cost) and stats == self._seen_stats:
            return
        self._seen_stats = stats
        self.index.refresh(SLICE)
        self._last_refresh = time.monotonic()
        self._cost, self._work = self._last_refresh - now + self._work, 0.0

    def _cached(self, key: Any, build: Any) -> Any:
        gen, value = self._cache.get(key, (-1, None))
        if gen != self.index.generation:
            t0 = time.monotonic()
            value = build()
            self._work += time.monotonic() - t0
            if len(self._cache) > 64:
                self._cache.clear()
            self._cache[key] = (self.index.generation, value)
        return value

    def _stats_signature(self) -> tuple[int, int] | None:
        """statistics.json is written after the last batch line and checkpoint save: its own
        change must redraw the overview too."""
        try:
            st = self.index.layout.statistics.stat()  # type: ignore[union-attr]
        except (OSError, AttributeError):
            return None
        return st.st_mtime_ns, st.st_size

    def overview(self) -> dict[str, Any]:
        ix = self.index

        live = ix.live()

        def build() -> dict[str, Any]:
            reader = RunReader(ix.run_dir) if ix.run_dir is not None else None
            stats, config = (reader.statistics(), reader.config()) if reader is not None else ({}, {})
            total = (stats.get("run") or {}).get("samples", {}).get("total")
            if ix.dataset is not None and (total is None or live):
                total = len(ix.dataset)  # statistics.json, if any, is an earlier invocation's
            totals = run_totals(ix.totals, ix.outcomes, ix.checkpoint)
            figures = totals.as_dict(total=total, seconds=ix.seconds(), pace=ix.pace())
            return {"figures": figures, "statistics": stats or None, **distributions(ix.entries()),
                    "failure_classes": list(FAILURE_CLASSES),
                    "run_name": config.get("run_name") or stats.get("run_name"),
                    "model": config.get("model") or stats.get("model"), "duplicates": ix.duplicates,
                    "outcomes_not_in_dataset": ix.outcomes_not_in_dataset,
                    **invocation_settings(ix.checkpoint.get("invocations") or []),
                    "problems": ix.problems + ([ix.dataset_note] if ix.dataset_note else [])}

        return {**self._cached(("overview", self._stats_signature(), live), build), **self.status()}

    def status(self) -> dict[str, Any]:
        ix = self.index
        return {"generation": ix.generation, "live": ix.live(), "source": str(ix.source),
                "kind": "run" if ix.run_dir is not None else "jsonl", "samples": len(ix.records) + len(ix.outcomes),
                "indexing_bytes_left": ix.behind, "reading_dataset": ix.dataset_pending}

    def filtered(self, query: Query) -> list[Any]:
        return self._cached(("q", query), lambda: apply(query, self.index.entries()))

    # -- handlers ------------------------------------------------------------------------------
    async def page(self, request: web.Request) -> web.Response:
        name = request.match_info.get("name", "index.html")
        path = self.statics.get(name)
        if path is None:
            raise web.HTTPNotFound()
        return web.Response(body=path.read_bytes(), content_type=_TYPES[path.suffix], charset="utf-8")

    async def api_status(self, request: web.Request) -> web.Response:
        self.refresh()
        return _json(self.status())

    async def api_overview(self, request: web.Request) -> web.Response:
        self.refresh()
        return _json(self.overview())

    async def api_samples(self, request: web.Request) -> web.Response:
        self.refresh()
        try:
            page = max(0, int(request.query.get("page", "0")))
            size = min(MAX_PAGE, max(1, int(request.query.get("size", "50"))))
        except ValueError:
            return _json({"error": "page and size must be whole numbers"}, 400)
        rows = self.filtered(Query.from_params(request.query))
        return _json({"total": len(rows), "page": page, "size": size,
                      "items": [e.row() for e in rows[page * size:(page + 1) * size]],
                      "facets": self._cached("facets", lambda: facets(self.index.entries())),
                      **self.status()})

    async def api_sample(self, request: web.Request) -> web.Response:
        self.refresh()
        key = request.query.get("key", "")
        entry = self.index.find(key)
        if entry is None:
            return _json({"error": f"no sample {key!r}"}, 404)
        problem = None
        try:
            rec = self.index.read_record(entry)
        except (OSError, orjson.JSONDecodeError) as e:
            rec, problem = None, str(e)
        sid = rec.get("sample_id") if rec is not None else None
        if isinstance(sid, str) and sid and key != sid and not key.startswith(sid + "@"):
            problem = "another record is at its place now"
        if problem is not None:
            self._last_refresh = 0.0  # the files changed under the index (--overwrite): look again next time
            return _json({"error": f"cannot read the record of {key!r} ({problem}); the run changed: reload"}, 409)
        rows = self.filtered(Query.from_params(request.query))
        pos = rows.position(entry)
        body: dict[str, Any] = {"entry": {**entry.row(), "prompt": entry.prompt}, "position": pos,
                                "count": len(rows),
                                "prev": rows[pos - 1].key if pos else None,
                                "next": rows[pos + 1].key if pos is not None and pos + 1 < len(rows) else None}
        if rec is not None:
            body["turns"] = display_turns(rec.get("conversations"))
            body["record"] = _record_fields(rec)
            body["verifier_logs"] = verifier_logs(self.index.run_dir, rec)
        return _json(body)


def _record_fields(rec: dict[str, Any]) -> dict[str, Any]:
    """The record without its conversation; per-tool figures only for tools it used; of its
    token ids, how many segments and breaks (the page shows those, not thousands of ids)."""
    out = {k: v for k, v in rec.items() if k != "conversations"}
    tokens = out.get(TOKENS)
    if isinstance(tokens, dict):
        out[TOKENS] = {"segments": len(tokens.get("segments") or ()), "prefix_breaks": tokens.get("prefix_breaks")}
    if isinstance(out.get("tool_stats"), dict):
        out["tool_stats"] = {n: s for n, s in out["tool_stats"].items() if isinstance(s, dict) and s.get("count")}
    if isinstance(out.get("tool_error_counts"), dict):
        out["tool_error_counts"] = {n: c for n, c in out["tool_error_counts"].items() if c}
    return out


def allowed_hosts(host: str, port: int) -> set[str] | None:
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        return None  # reachable under any of the machine's names: no Host check
    return {f"{h}:{port}" for h in ("127.0.0.1", "localhost", "[::1]", host)}


def make_app(viewer: Viewer) -> web.Application:
    @web.middleware
    async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            resp: web.StreamResponse = web.Response(status=405, text="read-only viewer")
        elif viewer.allowed_hosts is not None and request.host not in viewer.allowed_hosts:
            resp = web.Response(status=403, text="unexpected Host header")
        else:
            viewer.answering += 1
            viewer.idle.clear()
            try:
                resp = await handler(request)
            except web.HTTPException as e:
                resp = web.Response(status=e.status, text=e.reason)
            finally:
                viewer.answering -= 1
                if not viewer.answering:
                    viewer.idle.set()
        resp.headers.update(HEADERS)
        return resp

    app = web.Application(middlewares=[guard])
    app.router.add_get("/", viewer.page)
    app.router.add_get("/static/{name}", viewer.page)
    app.router.add_get("/api/status", viewer.api_status)
    app.router.add_get("/api/overview", viewer.api_overview)
    app.router.add_get("/api/samples", viewer.api_samples)
    app.router.add_get("/api/sample", viewer.api_sample)
    return app
