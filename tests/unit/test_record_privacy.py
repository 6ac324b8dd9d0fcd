"""A recording keeps no text and no credential: an agent session with an API key, cookies,
a secret-looking header, prompt text, tool arguments, tool outputs and answers goes through the
proxy, and no file of the recording (nor the trajectory imported from it) holds any of them.
With --keep-text the texts are kept, on purpose, and the credentials still are not."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.proxy.store import TEXT
from harness.traces.importers import import_to_file
from tests.unit.test_record_fakes import CHAT, MESSAGES, Agent, Reply, recording

KEY = "sk-live-Zq8v3KxWm1PqRt7Yb2Nc"
SECRETS = {
    "Authorization": f"Bearer {KEY}",
    "x-api-key": "ak-Hq4Lp9Vt2Xw6Rz1Sd8Fg",
    "api-key": "azk-Mn5Bv8Cx3Zl6Kj9Hg2Df",
    "Cookie": "sid=ck-Yt7Re4Wq1Ui8Op3As6Dl",
    "X-Internal-Token": "tk-Pl0Ok9Ij8Uh7Yg6Tf5Rd",
}
SESSION = "session-Wv3Ux8Ty5Rs2Qp"
PROMPT = "Refactor the quokka_ledger module keeping the zanzibar invariants"
SYSTEM = "You are agent Bellerophon-7 working on the marmalade repository"
TOOL_ARGS = {"cmd": "grep -rn pangolin_sentinel src/"}
TOOL_OUT = "src/ocelot_vault.py:12: pangolin_sentinel = True"
ANSWER = "I found the ocelot vault and the sentinel flag"
TEXTS = [PROMPT, SYSTEM, "pangolin_sentinel", "ocelot_vault", "ocelot vault", ANSWER,
         "quokka", "zanzibar", "Bellerophon", "marmalade"]


async def _session(tmp_path: Path, keep_text: bool, path: str) -> tuple[Path, bytes]:
    async with recording(tmp_path, keep_text=keep_text) as (fake, proxy, http):
        salt = proxy.recorder._hasher._key
        fake.replies.extend([
            Reply(text=ANSWER, tools=[("call_q1", "bash", TOOL_ARGS)], prompt=80, output=9),
            Reply(text=ANSWER, prompt=120, output=9),
        ])
        a = Agent(http, proxy.url, path, stream=True, session=SESSION, system=SYSTEM,
                  headers=dict(SECRETS))
        a.user(PROMPT)
        await a.call()
        await asyncio.sleep(0.01)
        a.results({"call_q1": TOOL_OUT})
        await a.call()
        assert fake.requests[0][1]["Authorization"] == SECRETS["Authorization"]  # forwarded
    return tmp_path / "rec", salt


def _everything(folder: Path, also: Path) -> bytes:
    return b"\n".join(p.read_bytes() for p in [*sorted(folder.iterdir()), also])


@pytest.mark.parametrize("path", [CHAT, MESSAGES])
async def test_no_file_holds_a_credential_or_any_text(tmp_path: Path, path: str) -> None:
    rec, salt = await _session(tmp_path, keep_text=False, path=path)
    out = tmp_path / "t.parquet"
    prov = import_to_file("recording", [rec], {}, out).provenance
    assert prov.extra["totals"]["tool_results"] == 1
    # the trajectory file's values are compressed on disk: read them back as text
    table = pq.read_table(out)
    values = "\n".join(str(v) for c in table.columns if pa.types.is_string(c.type)
                       or pa.types.is_dictionary(c.type) for v in c.to_pylist())
    data = _everything(rec, out) + values.encode() + prov.to_json().encode()
    for secret in [*SECRETS.values(), KEY, SESSION, *TEXTS, "call_q1"]:
        for needle in {secret, secret.split("-")[-1], secret.split("=")[-1]}:
            assert needle.encode() not in data, needle
    for form in (salt, salt.hex().encode(), base64.b64encode(salt)):
        assert form not in data
    assert not (rec / TEXT).exists()


async def test_keep_text_keeps_texts_but_never_credentials(tmp_path: Path) -> None:
    rec, _ = await _session(tmp_path, keep_text=True, path=CHAT)
    text = (rec / TEXT).read_bytes()
    assert PROMPT.encode() in text and TOOL_OUT.encode() in text and b"pangolin" in text
    data = _everything(rec, rec / TEXT)
    for secret in [*SECRETS.values(), KEY, SESSION]:
        assert secret.encode() not in data, secret


async def test_credentials_in_the_upstream_url_are_not_recorded(tmp_path: Path) -> None:
    async with (recording(tmp_path, userinfo="alice:pw-Gh7Jk2Lm@") as (fake, proxy, http),
                http.get(proxy.url + "/v1/models") as resp):
        assert resp.status == 200
    assert fake.requests == []  # a GET: passed through, not an LLM call
    data = _everything(tmp_path / "rec", tmp_path / "rec" / "recording.json")
    assert b"pw-Gh7Jk2Lm" not in data and b"alice" not in data
