"""Defects the hardening sweep's proxy family found in `harness record`, one test each."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.errors import InputError
from harness.proxy.serve import check_upstream
from tests.unit.test_record_fakes import recording
from tests.unit.test_record_requests import _send


# (A space anywhere in a URL is refused before, as by every --url: harness.specs.shared.)
@pytest.mark.parametrize("url", ["http://exa!mple.com", "http://a%20b:8080", "http://a,b",
                                 "http://host*name/"])
def test_an_upstream_host_that_is_no_host_name_is_refused(tmp_path: Path, url: str) -> None:
    # was: the proxy started, and every call got a 502 (the name could never resolve)
    res = CliRunner().invoke(main, ["record", "--upstream", url, "--out",
                                    str(tmp_path / "rec")])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "--upstream" in lines[0] and "not a host name" in lines[0]
    assert not (tmp_path / "rec").exists()


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080", "http://[::1]:8080/v1",
                                 "https://api.example.com/v1", "http://my_host-1.local",
                                 "http://user:p%20w@localhost:9", "http://bücher.example"])
def test_an_upstream_host_name_or_address_is_accepted(url: str) -> None:
    assert check_upstream(url) == url


def test_the_refusal_names_no_credentials() -> None:
    with pytest.raises(InputError) as err:
        check_upstream("http://user:pw-secret@exa mple.com")
    assert "pw-secret" not in str(err.value)


async def test_an_http_0_9_request_gets_a_400_and_is_not_forwarded(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # was: forwarded to the upstream, and its answer relayed as "HTTP/0.9 200 OK" with headers
    async with recording(tmp_path) as (fake, proxy, _):
        answer = await _send(proxy.url, b"GET /v1/models\r\n\r\n")
    assert answer.split(b"\r\n")[0].endswith(b" 400 Bad Request"), answer[:200]
    assert fake.requests == []
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("harness record:")]
    assert len(lines) == 1 and lines[0].endswith("HTTP/0.9 is not supported")
