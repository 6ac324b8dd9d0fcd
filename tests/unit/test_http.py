"""The adapters' shared HTTP core: pooled keep-alive connections, a limit the run sets, one retry
on a stale connection, the server-sent-events reader."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from harness.adapters.http import TIMEOUT_PREFIX, HttpStatusError, Timeouts, connect
from harness.plan.injection import Injection
from harness.plan.planner import Arrivals, BystanderPlan, CallStep, Plan, TrajectoryPlan
from harness.replay.runner import max_in_flight


async def _serve(app: web.Application) -> TestServer:
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


def _counting_app(hold_s: float = 0.0) -> tuple[web.Application, dict[str, Any]]:
    seen: dict[str, Any] = {"peers": set(), "now": 0, "max": 0}

    async def handler(request: web.Request) -> web.Response:
        seen["peers"].add(request.transport.get_extra_info("peername") if request.transport
                          else None)
        seen["now"] += 1
        seen["max"] = max(seen["max"], seen["now"])
        await asyncio.sleep(hold_s)
        seen["now"] -= 1
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_get("/x", handler)
    return app, seen


def test_sequential_requests_reuse_one_connection() -> None:
    async def go() -> dict[str, Any]:
        app, seen = _counting_app()
        server = await _serve(app)
        try:
            async with connect(str(server.make_url("")), 4) as http:
                for _ in range(20):
                    assert await http.get_json("/x") == {"ok": True}
        finally:
            await server.close()
        return seen

    assert len(asyncio.run(go())["peers"]) == 1


def test_the_pool_holds_exactly_the_limit_in_flight_and_counts_who_waited() -> None:
    """12 requests through 3 connections: 3 in flight at once, 9 waited for a connection (client
    time, counted apart)."""
    async def go() -> tuple[int, dict[str, float]]:
        app, seen = _counting_app(hold_s=0.3)
        server = await _serve(app)
        try:
            async with connect(str(server.make_url("")), 3) as http:
                await asyncio.gather(*(http.get_json("/x") for _ in range(12)))
                waits = http.pool_waits.to_dict()
        finally:
            await server.close()
        return int(seen["max"]), waits

    most, waits = asyncio.run(go())
    assert most == 3 and waits["queued_requests"] == 9
    assert 250 < waits["queued_ms_max"] < 2000


def test_no_silent_cap_of_100() -> None:
    """(aiohttp's default connector stops at 100 connections.) 150 concurrent requests of a run
    whose limit is 150 must be in flight at the server together beyond that."""
    async def go() -> tuple[int, int]:
        app, seen = _counting_app(hold_s=1.5)
        server = await _serve(app)
        try:
            async with connect(str(server.make_url("")), 150) as http:
                limit = http.pool.limit
                await asyncio.gather(*(http.get_json("/x") for _ in range(150)))
        finally:
            await server.close()
        return limit, int(seen["max"])

    limit, most = asyncio.run(go())
    assert limit == 150 and most > 100


def test_the_pool_is_as_large_as_the_plan_can_have_in_flight() -> None:
    calls = (CallStep(0, 8, 1, 2),)
    trajs = tuple(TrajectoryPlan(f"t{i}", 0.0, "interactive", "x", calls) for i in range(300))
    bystanders = tuple(BystanderPlan(f"b{i}", 0.1 * i, 8, 2, i) for i in range(5))
    closed = Plan(trajs, bystanders, Arrivals(mode="closed", concurrency=200), 0, Injection())
    assert max_in_flight(closed) == 200 + 5 + 1
    opened = Plan(trajs, (), Arrivals(mode="poisson", rate=5.0), 0, Injection())
    assert max_in_flight(opened) == 300 + 1


async def _stale_server(replies: list[int]) -> tuple[asyncio.Server, int]:
    """Answers the first request of each connection with keep-alive headers and drops the
    connection, unanswered, at its second: what a client meets on a pooled connection the
    server closed as the request went out."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for n in range(2):
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            if not line or n == 1:
                break
            replies.append(1)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 8\r\nConnection: keep-alive\r\n\r\n{\"n\": 1}")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_stale_pooled_connections_are_retried_on_a_new_one() -> None:
    """Three pooled connections are all stale: a request that meets one is retried on a new
    connection, never on another stale one from the pool."""
    async def go() -> list[int]:
        replies: list[int] = []
        server, port = await _stale_server(replies)
        try:
            async with connect(f"http://127.0.0.1:{port}", 3) as http:
                got = await asyncio.gather(*(http.post_json("/x", {}) for _ in range(3)))
                assert got == [(200, {"n": 1})] * 3  # three connections, now in the pool
                for _ in range(3):
                    assert await http.post_json("/x", {}) == (200, {"n": 1})
        finally:
            server.close()
        return replies

    assert len(asyncio.run(go())) == 6


def _sse_app(status: int = 200, lines: tuple[bytes, ...] = ()) -> web.Application:
    async def handler(request: web.Request) -> web.StreamResponse:
        if status != 200:
            return web.Response(status=status, text="no such model")
        resp = web.StreamResponse()
        await resp.prepare(request)
        for line in lines:
            await resp.write(line + b"\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/s", handler)
    return app


def _stream(app: web.Application, stop_after: int | None = None,
            timeouts: Timeouts | None = None) -> tuple[str | None, list[Any]]:
    async def go() -> tuple[str | None, list[Any]]:
        server = await _serve(app)
        got: list[Any] = []

        def on_chunk(chunk: dict[str, Any]) -> bool:
            got.append(chunk)
            return stop_after is None or len(got) < stop_after

        try:
            async with connect(str(server.make_url("")), 2, timeouts) as http:
                return await http.stream("/s", {"q": 1}, on_chunk), got
        finally:
            await server.close()

    return asyncio.run(go())


def test_stream_reads_data_lines_until_done() -> None:
    app = _sse_app(lines=(b": comment", b'data: {"a": 1}', b'data: {"a": 2}', b"data: [DONE]",
                          b'data: {"a": 3}'))
    assert _stream(app) == (None, [{"a": 1}, {"a": 2}])


def test_stream_hangs_up_when_the_parser_says_so() -> None:
    app = _sse_app(lines=(b'data: {"a": 1}', b'data: {"a": 2}', b'data: {"a": 3}'))
    assert _stream(app, stop_after=1) == (None, [{"a": 1}])


@pytest.mark.parametrize(("app", "error"), [
    (_sse_app(status=404), "HTTP 404: no such model"),
    (_sse_app(lines=(b'data: {"a": 1}', b'data: {"error": "out of memory"}')), "out of memory"),
    (_sse_app(lines=(b"data: {not json",)), "JSONDecodeError"),
])
def test_stream_errors_are_one_line(app: web.Application, error: str) -> None:
    err, _ = _stream(app)
    assert err is not None and error in err and "\n" not in err


def test_get_json_tries_each_path_and_names_the_last_status() -> None:
    async def go() -> Any:
        app = web.Application()
        async def new(_: web.Request) -> web.Response:
            return web.json_response({"v": 2})

        app.router.add_get("/new", new)
        server = await _serve(app)
        try:
            async with connect(str(server.make_url("")), 2) as http:
                assert await http.get_json("/old", "/new") == {"v": 2}
                with pytest.raises(HttpStatusError, match="/gone: HTTP 404"):
                    await http.get_json("/gone")
        finally:
            await server.close()

    asyncio.run(go())


def test_the_gate_hands_places_over_in_order_and_survives_cancellation() -> None:
    from harness.adapters.connection import Gate

    async def go() -> list[str]:
        gate, order = Gate(1), []
        assert await gate.acquire() is False

        async def waiter(name: str) -> None:
            assert await gate.acquire() is True
            order.append(name)
            gate.release()

        tasks = [asyncio.create_task(waiter(n)) for n in ("a", "b", "c")]
        await asyncio.sleep(0)
        tasks[1].cancel()  # b gives up its turn while waiting
        await asyncio.sleep(0)
        gate.release()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert gate.held == 0
        return order

    assert asyncio.run(go()) == ["a", "c"]


def _paced_app(first_after_s: float, gaps_s: tuple[float, ...]) -> web.Application:
    """Headers at once, the first data line after `first_after_s`, then one per gap."""
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await asyncio.sleep(first_after_s)
        await resp.write(b'data: {"i": 0}\n\n')
        for i, gap in enumerate(gaps_s, 1):
            await asyncio.sleep(gap)
            await resp.write(b'data: {"i": %d}\n\n' % i)
        return resp

    app = web.Application()
    app.router.add_post("/s", handler)
    return app


FAST = Timeouts(connect_s=2.0, first_byte_s=0.3, idle_s=0.3, request_s=0.5)


def test_a_call_with_no_answer_times_out_on_its_first_byte() -> None:
    err, got = _stream(_paced_app(30.0, ()), timeouts=FAST)
    assert err == f"{TIMEOUT_PREFIX}no answer within 0.3 s" and got == []


def test_a_stream_that_stalls_after_its_first_token_times_out() -> None:
    err, got = _stream(_paced_app(0.0, (0.05, 30.0)), timeouts=FAST)
    assert err == f"{TIMEOUT_PREFIX}the stream stalled: no data for 0.3 s"
    assert got == [{"i": 0}, {"i": 1}]


def test_a_long_stream_that_keeps_coming_has_no_total_limit() -> None:
    """Twelve gaps of 0.1 s: longer than every timeout together, never silent for 0.3 s."""
    err, got = _stream(_paced_app(0.2, (0.1,) * 12), timeouts=FAST)
    assert err is None and len(got) == 13


def test_a_request_with_no_answer_fails_within_its_timeout() -> None:
    async def go() -> None:
        app = web.Application()

        async def never(_: web.Request) -> web.Response:
            await asyncio.sleep(30)
            return web.json_response({})

        app.router.add_get("/props", never)
        server = await _serve(app)
        try:
            async with connect(str(server.make_url("")), 2, FAST) as http:
                with pytest.raises(TimeoutError):
                    await http.get_json("/props")
        finally:
            await server.close()

    asyncio.run(go())


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), 1e9])
def test_timeouts_must_be_positive_finite_seconds(bad: float) -> None:
    with pytest.raises(ValueError, match="idle_s"):
        Timeouts(idle_s=bad)
