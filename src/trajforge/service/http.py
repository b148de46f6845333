"""The rollout service's HTTP API (aiohttp), a thin layer on service.core.RolloutService.

POST /v1/groups {"rows": [...] or "tasks": [...], "n": N, "policy": {...}} -> {"ids": [...]};
GET /v1/groups/stream?cursor=C[&follow=0] -> NDJSON, one finished group a line; POST
/v1/groups/ack {"ids": [...]}; POST /v1/policy {"version": V, "in_flight": "continue",
"base_url": U, "model": M, "api_key_env": VAR}; DELETE /v1/groups/{id}; GET /v1/status.

With a token every request needs `Authorization: Bearer TOKEN` (401 otherwise, compared in
constant time); bodies larger than the cap get 413 before they are read whole.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from trajforge.service.core import BadGroups, RolloutService
from trajforge.service.policy import ENDPOINT_FIELDS

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _problem(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def _body(request: web.Request, *fields: str) -> list[Any]:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as e:
        raise BadGroups(f"the body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise BadGroups("the body must be a JSON object")
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise BadGroups(f"unknown field {unknown[0]!r} (known: {', '.join(fields)})")
    return [body.get(f) for f in fields]


def make_app(service: RolloutService, *, token: str | None, max_body: int) -> web.Application:
    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if token is not None:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                return _problem(401, "a valid 'Authorization: Bearer TOKEN' header is required")
        if request.content_length is not None and request.content_length > max_body:
            return _problem(413, f"the body is larger than {max_body} bytes")
        try:
            return await handler(request)
        except BadGroups as e:
            return _problem(422, str(e))
        except web.HTTPRequestEntityTooLarge:
            return _problem(413, f"the body is larger than {max_body} bytes")

    async def groups(request: web.Request) -> web.Response:
        rows, n, policy, tasks = await _body(request, "rows", "n", "policy", "tasks")
        return web.json_response({"ids": service.submit(rows, 1 if n is None else n, policy, tasks)})

    async def stream(request: web.Request) -> web.StreamResponse:
        try:
            cursor = int(request.query.get("cursor", "0"))
        except ValueError:
            raise BadGroups("query 'cursor' must be a whole number") from None
        follow = request.query.get("follow", "1") not in ("0", "false")
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        try:
            async for finished in service.stream(cursor, follow=follow):
                await response.write(finished.line)
            await response.write_eof()
        except ConnectionResetError:  # the consumer went: what it did not ack comes again on its next stream
            pass
        return response

    async def ack(request: web.Request) -> web.Response:
        (ids,) = await _body(request, "ids")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise BadGroups("field 'ids' must be a list of group ids")
        return web.json_response({"acked": service.ack(ids)})

    async def policy(request: web.Request) -> web.Response:
        version, in_flight, *endpoint = await _body(request, "version", "in_flight", *ENDPOINT_FIELDS)
        service.set_policy(version, in_flight or "continue", dict(zip(ENDPOINT_FIELDS, endpoint)))
        return web.json_response({"policy_version": service.policy_version, **service.endpoint})

    async def cancel(request: web.Request) -> web.Response:
        gid = request.match_info["gid"]
        if not service.cancel(gid):
            return _problem(404, f"no queued group {gid!r}")
        return web.json_response({"cancelled": gid})

    async def status(request: web.Request) -> web.Response:
        return web.json_response(service.status())

    app = web.Application(middlewares=[guard], client_max_size=max_body)
    app.router.add_post("/v1/groups", groups)
    app.router.add_get("/v1/groups/stream", stream)
    app.router.add_post("/v1/groups/ack", ack)
    app.router.add_post("/v1/policy", policy)
    app.router.add_delete("/v1/groups/{gid}", cancel)
    app.router.add_get("/v1/status", status)
    return app
