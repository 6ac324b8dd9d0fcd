"""An API key and extra headers reach the server on every request and are never recorded;
credentials in a URL are redacted in run.json."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from click.testing import CliRunner

from harness.adapters.http import connect
from harness.cli import main
from harness.replay.runner import redact_url
from harness.selftest import measure
from harness.specs.shared import headers_of

SECRET = "sk-test-0123456789"


def test_headers_go_with_every_request() -> None:
    seen: list[str | None] = []

    async def go() -> None:
        async def handler(request: web.Request) -> web.Response:
            seen.append(request.headers.get("Authorization"))
            return web.json_response({"ok": True})

        app = web.Application()
        app.router.add_get("/x", handler)
        app.router.add_post("/y", handler)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        try:
            async with connect(str(server.make_url("")), 2,
                               headers=headers_of(SECRET, ())) as http:
                await http.get_json("/x")
                await http.post_json("/y", {})
        finally:
            await server.close()

    asyncio.run(go())
    assert seen == [f"Bearer {SECRET}"] * 2


@pytest.mark.parametrize("bad", ["no-colon", ": value", "Two words: v"])
def test_a_malformed_header_is_refused(bad: str) -> None:
    from harness.errors import InputError

    with pytest.raises(InputError, match="--header"):
        headers_of(None, (bad,))


def test_url_passwords_are_redacted() -> None:
    assert redact_url("http://me:pw@127.0.0.1:8080/v1") == "http://me:***@127.0.0.1:8080/v1"
    assert redact_url("http://127.0.0.1:8080") == "http://127.0.0.1:8080"


def test_secrets_never_reach_the_results(tmp_path: Path) -> None:
    stub = measure.start_stub(0.0)
    try:
        trace = measure.synthetic_trace(tmp_path / "t.parquet", 1, 2, 0.0, 2)
        creds = stub.url.replace("http://", "http://me:hunter2@")
        runs = {name: CliRunner().invoke(main, ["run", "--url", url, "--trace", str(trace),
                                                "--policy", "keep", "--out",
                                                str(tmp_path / name), *extra])
                for name, url, extra in (
                    ("key", stub.url, ["--api-key", SECRET, "--header", "X-Team: infra"]),
                    ("creds", creds, []), ("both", creds, ["--api-key", SECRET]))}
    finally:
        stub.stop()
    assert runs["key"].exit_code == 0 and runs["creds"].exit_code == 0, runs
    assert runs["both"].exit_code == 2 and "use one of them" in runs["both"].output
    key = json.loads((tmp_path / "key" / "run.json").read_text())
    assert key["http"]["headers"] == ["Authorization", "X-Team"]
    creds_run = json.loads((tmp_path / "creds" / "run.json").read_text())
    assert creds_run["server_url"].startswith("http://me:***@")
    # the job's spec is recorded without the secrets and the URL's password
    assert creds_run["spec"]["values"]["url"].startswith("http://me:***@")
    assert not {"api-key", "header"} & set(key["spec"]["values"])
    for f in tmp_path.rglob("*"):
        if f.is_file():  # run.json, summary, records, server samples, logs
            data = f.read_bytes()
            assert SECRET.encode() not in data and b"hunter2" not in data, f
    for res in runs.values():
        assert SECRET not in res.output and "hunter2" not in res.output
