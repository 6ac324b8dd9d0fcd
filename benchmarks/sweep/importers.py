"""`harness traces import` of every format fed careless and hostile inputs, and `traces validate`
and `traces describe` given broken trajectory files.

Bad input ends in exit 2 and one `error:` line naming the file (and where it can, the line or
field), with no output written; what the docs accept with a warning (times running backwards,
sub-agent parents forming a cycle) imports, exit 0, warned and counted in the provenance.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sweep import _importer_inputs as inp
from sweep._importer_runs import OUT, both, measured, no_output, rows, totals
from sweep.core import Case, Result, expect

FAMILY = "importers"
FORMATS = sorted(inp.SAMPLES)
# Formats that read a folder of files.
FOLDER_FORMATS = ("atif", "claude-code", "codex", "infercept", "kv-cache-tester",
                  "mini-swe-agent", "otel-genai")
# Formats that take the checks every format shares (the command's, before any reader).
SOME = ("atif", "mooncake", "openai-chat", "recording")
# ... and the formats that parse with a reader of their own (orjson, JSON Lines, OTLP, JSON).
READERS = ("atif", "codex", "kv-cache-tester", "mooncake", "otel-genai", "recording")
JSONL_FORMATS = ("claude-code", "codex", "mooncake", "otel-genai", "recording")


def _case(fmt: str, name: str, setup: Callable[[Path], None] | None, *, args: tuple[str, ...]
          = (), paths: tuple[str, ...] | None = None, code: int = 2, say: tuple[str, ...] = (),
          check: Callable[[Result], str | None] | None = None, timeout_s: float = 60.0) -> Case:
    """One import of `fmt`: `paths` (default: the format's input) to OUT, with `args`."""
    argv = ("traces", "import", fmt, *(paths or (inp.target(fmt),)), "--out", OUT, *args)
    if check is None and code == 2:
        check = no_output
    return Case(FAMILY, f"{fmt}/{name}", argv, expect(code), say, check, setup=setup,
                timeout_s=timeout_s)


def _writes(fmt: str, data: bytes | None, name: str | None = None) -> Callable[[Path], None]:
    """A setup writing the format's input with `data` as its file (None: none)."""
    def setup(work: Path) -> None:
        inp.write_input(work, fmt, data, name)
    return setup


def _edited(fmt: str, edit: inp.Edit) -> Callable[[Path], None]:
    return _writes(fmt, inp.valid_bytes(fmt, edit))


# ---------------------------------------------------------------- unreadable or not JSON

def _generic(fmt: str) -> list[Case]:
    good = inp.valid_bytes(fmt)
    where = inp.spoiled(fmt)
    # A number where an object (or a list) is read; JSON Lines: lines that are not objects.
    wrong_bytes = b"[1, 2]\n\"text\"\n" if inp.SAMPLES[fmt].jsonl else b"42"
    bad_utf8 = good.replace(b'"', b'"\xff\xfe', 1) if fmt != "recording" else \
        good.replace(b'"call"', b'"c\xffall"', 1)
    spoils: dict[str, bytes] = {
        "empty": b"",
        "wrong-type": wrong_bytes,
        "deep-100000": inp.deep(100_000),
    }
    if fmt in READERS:
        spoils.update({"not-json": b"this is not JSON at all\n",
                       "truncated": good[: len(good) // 2],
                       "binary": bytes(range(256)) * 4 + b"\x00\x9c\xff",
                       "nul-byte": good[: len(good) // 3] + b"\x00" + good[len(good) // 3:],
                       "invalid-utf8": bad_utf8})
    if fmt == "recording":
        # A cut-short last line is a killed proxy's: left out and said (docs). The events of a
        # recording that hold no answered call leave nothing to replay, said of the folder.
        spoils["deep-100000"] += b"\n"
        del spoils["truncated"]
    cases = [_case(fmt, name, _writes(fmt, data),
                   say=(inp.target(fmt),) if (fmt, name) == ("recording", "empty") else (where,))
             for name, data in spoils.items()]
    if fmt == "recording":
        cases.append(_case(fmt, "truncated", _writes(fmt, good[: len(good) // 2]), code=0,
                           check=rows(None, "cut short")))
        cases.append(_case(fmt, "missing-path", _writes(fmt, None),
                           say=(inp.target(fmt), "no events.jsonl")))
    elif fmt in SOME:  # found missing before any format's reader runs
        cases.append(_case(fmt, "missing-path", _writes(fmt, None),
                           say=(where, "does not exist")))
    # JSON text never starts with a byte order mark (RFC 8259): refused, naming the file.
    cases.append(_case(fmt, "utf8-bom", _writes(fmt, b"\xef\xbb\xbf" + good), say=(where,)))
    return cases


# ---------------------------------------------------------------- values out of range

def _otel_value(v: Any) -> dict[str, Any]:
    if isinstance(v, str):
        return {"stringValue": v}
    return {"intValue": str(v)} if isinstance(v, int) else {"doubleValue": v}


def _set_tokens(fmt: str, v: Any) -> inp.Edit:
    """An edit setting the first call's prompt token count to `v`."""
    def edit(d: Any) -> Any:
        if fmt == "atif":
            d["steps"][1]["metrics"]["prompt_tokens"] = v
        elif fmt == "claude-code":
            d[1]["message"]["usage"]["input_tokens"] = v
        elif fmt == "codex":
            d[4]["payload"]["info"]["last_token_usage"]["input_tokens"] = v
        elif fmt == "infercept":
            d["req-a"][0]["prompt_tokens"] = v
        elif fmt == "kv-cache-tester":
            d["requests"][0]["in"] = v
        elif fmt == "mini-swe-agent":
            d["messages"][2]["extra"]["response"]["usage"]["prompt_tokens"] = v
        elif fmt == "mooncake":
            d[0]["input_length"] = v
        elif fmt == "otel-genai":
            d["resourceSpans"][0]["scopeSpans"][0]["spans"][1]["attributes"][1]["value"] = \
                _otel_value(v)
        elif fmt == "recording":
            d[1]["usage"]["prompt"] = v
        else:
            d[0]["messages"][1]["content"] = v
        return d
    return edit


TOKEN_VALUES: dict[str, Any] = {"negative": -5, "nan": math.nan, "huge-1e308": 1e308,
                                "fractional": 1.5}
# A count written as a numeric string: the span formats take it (OpenInference writes '85').
STRING_COUNTS = ("atif", "otel-genai")


def _tokens(fmt: str) -> list[Case]:
    if fmt == "openai-chat":  # text, counted by the rule: the content's type is what can be wrong
        return [_case(fmt, f"content-{k}", _edited(fmt, _set_tokens(fmt, v)),
                      say=(inp.spoiled(fmt),)) for k, v in (("number", 12), ("nan", math.nan))]
    values = TOKEN_VALUES if fmt in READERS else dict(list(TOKEN_VALUES.items())[:2])
    cases = [_case(fmt, f"tokens-{k}", _edited(fmt, _set_tokens(fmt, v)),
                   say=(inp.spoiled(fmt),)) for k, v in values.items()]
    ok = fmt in STRING_COUNTS
    if not ok and fmt not in SOME:
        return cases
    cases.append(_case(fmt, "tokens-string", _edited(fmt, _set_tokens(fmt, "12")),
                       code=0 if ok else 2, say=() if ok else (inp.spoiled(fmt),),
                       check=rows(inp.SAMPLES[fmt].rows) if ok else None))
    return cases


def _set(path: tuple[Any, ...], v: Any) -> inp.Edit:
    def edit(d: Any) -> Any:
        node = d
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = v
        return d
    return edit


_SPANS = ("resourceSpans", 0, "scopeSpans", 0, "spans")
# A duration field of each format that records one, and a timestamp field.
DURATIONS: dict[str, tuple[Any, ...]] = {
    "infercept": ("req-a", 0, "api_time"),
    "kv-cache-tester": ("requests", 1, "api_time"),
    "claude-code": (2, "toolUseResult", "durationMs"),
    "recording": (3, "results", 0, 2),
}
TIMESTAMPS: dict[str, tuple[Any, ...]] = {
    "codex": (3, "timestamp"),
    "claude-code": (2, "timestamp"),
    "atif": ("steps", 1, "timestamp"),
    "mini-swe-agent": ("messages", 3, "extra", "timestamp"),
    "otel-genai": (*_SPANS, 2, "startTimeUnixNano"),
    "mooncake": (1, "timestamp"),
    "kv-cache-tester": ("requests", 1, "t"),
    "recording": (1, "arrival"),
}


def _times(fmt: str) -> list[Case]:
    cases = []
    if fmt in DURATIONS:
        for k, v in (("negative", -3.0), ("nan", math.nan))[: 2 if fmt in READERS else 1]:
            cases.append(_case(fmt, f"duration-{k}", _edited(fmt, _set(DURATIONS[fmt], v)),
                               say=(inp.spoiled(fmt),)))
    if fmt in TIMESTAMPS:
        cases.append(_case(fmt, "timestamp-not-a-time",
                           _edited(fmt, _set(TIMESTAMPS[fmt], "not a time")),
                           say=(inp.spoiled(fmt),)))
    return cases


# Times that run backwards: a tool's result logged before its call. The docs: imported, the
# pause taken as 0 s, the file warned of and its count in the provenance (clock_skew).
BACKWARDS: dict[str, tuple[tuple[Any, ...], Any]] = {
    "codex": ((5, "timestamp"), inp.at(2)),
    "claude-code": ((2, "timestamp"), inp.at(2, "2025-10-01")),
    "atif": (("steps", 2, "timestamp"), "2025-01-01T00:00:01.500Z"),
    "otel-genai": ((*_SPANS, 2, "endTimeUnixNano"), "1750000001000000000"),
}


def _backwards(fmt: str) -> list[Case]:
    if fmt not in BACKWARDS:
        return []
    where, v = BACKWARDS[fmt]
    edit = _set(where, v)
    if fmt == "claude-code":  # without the tool's own duration, its result's time is used
        def edit(d: Any, first: inp.Edit = edit) -> Any:
            del d[2]["toolUseResult"]
            return first(d)
    return [_case(fmt, "times-run-backwards", _edited(fmt, edit), code=0,
                  check=both(rows(inp.SAMPLES[fmt].rows, "clock skew"),
                              totals("clock_skew", 1)))]


# ---------------------------------------------------------------- links, FIFOs, folders

def _other(name: str) -> str:
    """A second name the format's folder walk also picks up."""
    head, _, tail = name.partition(".")
    return f"{head}2.{tail}"


def _folder(fmt: str) -> str:
    return "in/rec" if fmt == "recording" else "in"


def _loop(fmt: str, pair: bool) -> Callable[[Path], None]:
    def setup(work: Path) -> None:
        link = inp.write_input(work, fmt, None)
        if pair:
            link.symlink_to(_other(link.name))
            (link.parent / _other(link.name)).symlink_to(link.name)
        else:
            link.symlink_to(link.name)
            (link.parent / "up").symlink_to(".")  # a folder loop the walk must not follow
    return setup


def _dangling(fmt: str) -> Callable[[Path], None]:
    def setup(work: Path) -> None:
        inp.write_input(work, fmt, None).symlink_to("missing.json")
    return setup


def _fifo(fmt: str) -> Callable[[Path], None]:
    return lambda work: inp.fifo(inp.write_input(work, fmt, None))


def _links(fmt: str) -> list[Case]:
    where = inp.spoiled(fmt)
    folder = _folder(fmt)
    loose = fmt in FOLDER_FORMATS or fmt == "recording"  # else the link is named itself
    loop = (where, "symbolic link loop")
    cases = [
        _case(fmt, "symlink-loop-self", _loop(fmt, False), paths=(folder if loose else where,),
              say=loop),
    ]
    if loose:
        cases.append(_case(fmt, "symlink-loop-pair", _loop(fmt, True), paths=(folder,),
                           say=(where, "symbolic link loop") if fmt == "recording" else
                           (folder, "symbolic link loop")))
    if fmt in SOME:
        cases += [
            _case(fmt, "fifo-named", _fifo(fmt), paths=(where,),
                  say=(where, "not a regular file"), timeout_s=20),
            _case(fmt, "dangling-link-named", _dangling(fmt), paths=(where,),
                  say=(where, "symbolic link to nothing")),
        ]
    if fmt in ("atif", "codex", "infercept", "recording"):
        cases += [
            _case(fmt, "fifo-in-folder", _fifo(fmt), paths=(folder,),
                  say=(where, "not a regular file"), timeout_s=20),
            _case(fmt, "dangling-link-in-folder", _dangling(fmt), paths=(folder,),
                  say=(where, "symbolic link to nothing")),
        ]
    return cases


# ---------------------------------------------------------------- gzip and long lines


def _gz(fmt: str) -> list[Case]:
    if fmt == "recording":  # a recording's events are never gzipped
        return []
    name = inp.SAMPLES[fmt].name + ".gz"
    where = f"in/{name}"
    cap = 512 << 20  # harness.limits.MAX_INFLATED_BYTES

    def bomb(work: Path) -> None:
        inp.gzip_bomb(inp.write_input(work, fmt, None, name), cap + (4 << 20))

    good = inp.valid_bytes(fmt)
    cases = [
        measured(_case(fmt, "gzip-bomb", bomb, paths=(where,),
                        say=(where, "inflates to more than 512 MiB"), timeout_s=120)),
    ]
    if fmt in SOME:
        cases += [
            _case(fmt, "gzip-truncated", _writes(fmt, inp.truncated_gzip(good), name),
                  paths=(where,), say=(where,)),
            _case(fmt, "gzip-name-not-gzip", _writes(fmt, inp.raw_deflate(good), name),
                  paths=(where,), say=(where,)),
            _case(fmt, "gzip-ok", _writes(fmt, inp.gzipped(good), name),
                  paths=(where,), code=0, check=rows(inp.SAMPLES[fmt].rows)),
        ]
    return cases


def _long_line(fmt: str) -> list[Case]:
    if fmt not in JSONL_FORMATS:
        return []
    cap = 64 << 20  # harness.limits.MAX_LINE_BYTES
    where = inp.spoiled(fmt)
    if fmt == "otel-genai":
        where = "in/t.jsonl"

    def setup(work: Path) -> None:
        inp.long_line(inp.write_input(work, fmt, None, Path(where).name), cap + 1)

    return [measured(_case(fmt, "line-over-cap", setup,
                            paths=(where if fmt != "recording" else inp.target(fmt),),
                            say=(where, "longer than 64 MiB"), timeout_s=60))]


# ---------------------------------------------------------------- options and flags

SCALES = ("0", "-1", "nan", "inf")


def _flags(fmt: str, i: int) -> list[Case]:
    ok = _writes(fmt, inp.valid_bytes(fmt))
    cases = [
        _case(fmt, "valid", ok, code=0, check=rows(inp.SAMPLES[fmt].rows)),
    ]
    if i < len(SCALES):  # the flags are the command's, the same for every format
        cases += [
            _case(fmt, f"token-scale-{SCALES[i]}", ok, args=("--token-scale", SCALES[i]),
                  say=("--token-scale",)),
            _case(fmt, "option-bad-priority", ok, args=("-o", "priority=urgent"),
                  say=("priority", "urgent")),
            _case(fmt, "unknown-option", ok, args=("-o", "bogus=1"),
                  say=("unknown option", "bogus")),
        ]
    if i < 2:
        cases.append(_case(fmt, "option-without-value", ok, args=("-o", "priority"),
                           say=("priority", "KEY=VALUE")))
    return cases


# Options of one format with a value out of their range.
BAD_OPTIONS: dict[str, list[tuple[str, str]]] = {
    "atif": [("tool_latency", "-1"), ("tool_latency", "nan"), ("tool_latencies", "bash=x")],
    "claude-code": [("warmups", "maybe")],
    "infercept": [("arrival_rate", "-2"), ("seed", "x")],
    "kv-cache-tester": [("arrival_rate", "inf"), ("max_context", "-1"), ("max_requests", "1.5")],
    "mini-swe-agent": [("start", "later")],
    "mooncake": [("min_blocks", "-1")],
    "openai-chat": [("profile", "no-such-profile"), ("seed", "nan")],
}


def _bad_options(fmt: str) -> list[Case]:
    ok = _writes(fmt, inp.valid_bytes(fmt))
    return [_case(fmt, f"option-{k}-{v}", ok, args=("-o", f"{k}={v}"), say=(k,))
            for k, v in BAD_OPTIONS.get(fmt, [])[:1]]


def _out_cases() -> list[Case]:
    cases = []
    for fmt in ("recording",):
        ok = _writes(fmt, inp.valid_bytes(fmt))
        base = ("traces", "import", fmt, inp.target(fmt))
        cases += [
            Case(FAMILY, f"{fmt}/out-is-a-directory", (*base, "--out", "in"),
                 must_say=("--out in", "directory"), setup=ok),
            Case(FAMILY, f"{fmt}/out-folder-missing", (*base, "--out", "nowhere/out.parquet"),
                 must_say=("nowhere",), setup=ok),
            Case(FAMILY, f"{fmt}/out-under-a-file", (*base, "--out", f"{inp.spoiled(fmt)}/x"),
                 must_say=("--out",), setup=ok),
            # Root writes through any mode bits: /proc refuses a new file to everyone.
            Case(FAMILY, f"{fmt}/out-not-writable", (*base, "--out", "/proc/out.parquet"),
                 must_say=("/proc/out.parquet",), setup=ok),
        ]
    two = _writes("mooncake", inp.valid_bytes("mooncake"))
    cases.append(_case("mooncake", "two-paths", two, paths=("in/t.jsonl", "in/t.jsonl"),
                       say=("takes one path",)))
    cases.append(_case("infercept", "no-path", None, paths=("",), say=("",)))
    return cases


# ---------------------------------------------------------------- recordings

def _cycle(parents: dict[int, list[Any]]) -> inp.Edit:
    """Rewrites the `parent` of the recording's calls: c1 is calls 1, 2, 3 and 6 (3 spawns c2),
    c2 is 4 and 5."""
    def edit(events: Any) -> Any:
        for e in events:
            if e.get("ev") == "call" and e.get("id") in parents:
                e["how"], e["parent"] = "subagent", parents[e["id"]]
        return events
    return edit


def _recording() -> list[Case]:
    fmt = "recording"
    cases = []
    for shape, parents, n in (("self", {4: ["c2", 5]}, 1), ("pair", {1: ["c2", 5], 4: ["c1", 3]},
                                                                  2)):
        cases.append(_case(fmt, f"subagent-parent-cycle-{shape}", _edited(fmt, _cycle(parents)),
                           code=0, check=both(rows(None, "a cycle"),
                                               totals("subagents_orphaned", n),
                                               totals("llm_steps", 6),
                                               totals("trajectories", 2))))
    cases.append(_case(fmt, "parent-names-no-call", _edited(fmt, _cycle({4: ["c9", 99]})),
                       code=0, check=totals("llm_steps", 6)))
    cases.append(_case(fmt, "recording-json-missing",
                       lambda w: (inp.write_input(w, fmt, inp.valid_bytes(fmt)).parent
                                  / "recording.json").unlink(), say=("in/rec",)))
    cases.append(_case(fmt, "recording-json-not-json",
                       lambda w: (inp.write_input(w, fmt, inp.valid_bytes(fmt)).parent
                                  / "recording.json").write_text("{nope"),
                       say=("recording.json",)))
    cases.append(_case(fmt, "folder-missing", None, say=("in/rec", "does not exist")))
    return cases


# ---------------------------------------------------------------- broken trajectory files

def _parquet(spoil: Callable[[bytes], bytes] | None) -> Callable[[Path], None]:
    def setup(work: Path) -> None:
        data = inp.SHIPPED.read_bytes()
        (work / "t.parquet").write_bytes(spoil(data) if spoil else data)
    return setup


def _frame_edit(edit: Callable[[Any], Any]) -> Callable[[Path], None]:
    """A trajectory file whose frame `edit` changed (still Parquet)."""
    def setup(work: Path) -> None:
        import pandas as pd

        df = pd.read_parquet(inp.SHIPPED)
        edit(df).to_parquet(work / "t.parquet")
    return setup


def _neg_tokens(df: Any) -> Any:
    df.loc[df.index[0], "input_tokens"] = -5
    return df


def _self_parent(df: Any) -> Any:
    df["parent_id"] = df["trajectory_id"]
    df["spawn_step"] = 1
    return df


def _trajectory_files() -> list[Case]:
    spoils: dict[str, Callable[[Path], None] | None] = {
        "missing": None,
        "empty": _parquet(lambda b: b""),
        "random-bytes": _parquet(lambda b: bytes(range(256)) * 8),
        "truncated": _parquet(lambda b: b[: len(b) // 2]),

        "not-trajectories": _frame_edit(lambda df: df[["trajectory_id"]].rename(
            columns={"trajectory_id": "x"})),
        "negative-tokens": _frame_edit(_neg_tokens),

        "parent-cycle": _frame_edit(_self_parent),

        "fifo": lambda w: inp.fifo(w / "t.parquet"),
        "symlink-loop": lambda w: (w / "t.parquet").symlink_to("t.parquet"),
        "dangling-link": lambda w: (w / "t.parquet").symlink_to("gone.parquet"),
    }
    described = ("random-bytes", "not-trajectories", "fifo")
    cases = []
    for cmd in ("validate", "describe"):
        for name, setup in spoils.items():
            if cmd == "describe" and name not in described:
                continue
            cases.append(Case(FAMILY, f"{cmd}/{name}", ("traces", cmd, "t.parquet"),
                              must_say=("t.parquet",), setup=setup, timeout_s=20,
                              one_error_line=cmd == "describe"))
    return cases


def cases() -> list[Case]:
    """Every importer case."""
    out: list[Case] = []
    for i, fmt in enumerate(FORMATS):
        out += _generic(fmt) + _tokens(fmt) + _times(fmt) + _backwards(fmt) + _links(fmt)
        out += _gz(fmt) + _long_line(fmt) + _flags(fmt, i) + _bad_options(fmt)
    return out + _out_cases() + _recording() + _trajectory_files()
