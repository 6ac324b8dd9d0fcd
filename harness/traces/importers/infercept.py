"""InferCept workload JSON: `{request_id: [segment, ...]}`, one trajectory per request.

A segment is one LLM call and the augmentation (tool) call after it: `prompt_tokens`,
`completion_tokens`, `api_time` (seconds) and `api_token_length` (tokens the call returned). The
last segment's call normally has no `api_time`. Chatbot requests carry text (`prompt`,
`completion`, `api_token`) instead of counts; their "augmentation" is the user's next message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.errors import InputError
from harness.traces.importers._common import (
    LLM,
    Tool,
    Trajectory,
    arrival_offsets,
    build_frame,
    opt_float,
    opt_int,
    quote,
    summarize,
    take_options,
)
from harness.traces.importers.base import Format, Imported, one_path
from harness.traces.schema import Provenance
from harness.userfiles import TOKEN_RULE, count_tokens, is_count, is_seconds, read_json

FORMAT = "infercept"
OPTIONS = {
    "tool_class": "augmentation",  # class of count-only requests: the file does not name it
    "arrival_rate": "",  # requests per second (Poisson); empty: every request starts at 0
    "seed": "0",
}
# Text requests are InferCept's chatbot augmentation: api_token is the user's next message and
# api_time their reply time.
TEXT_CLASS, TEXT_TOOL_NAME = "human", "chatbot_user"
COUNT_TOOL_NAME = "augmentation"


class _Stats:
    def __init__(self) -> None:
        self.requests = 0
        self.text_requests = 0
        self.checked = 0
        self.violations: list[str] = []
        self.clamped_input: list[str] = []
        self.clamped_output: list[str] = []
        self.trailing: list[str] = []


def _field(seg: dict[str, Any], key: str, where: str, check: Any, what: str) -> Any:
    if key not in seg:
        raise InputError(f"{where}: missing {key!r}")
    if not check(seg[key]):
        raise InputError(f"{where}: {key!r} must be {what}, got {quote(seg[key])}")
    return seg[key]


def _convert(rid: str, segs: list[dict[str, Any]], src: Path, tool_class: str,
             st: _Stats) -> list[LLM | Tool]:
    text = "prompt" in segs[0]
    keys = ("prompt", "completion", "api_token") if text else (
        "prompt_tokens", "completion_tokens", "api_token_length")
    check, what = ((lambda v: isinstance(v, str)), "a string") if text else (is_count,
                                                                            "an integer >= 0")
    prompts: list[int] = []
    outputs: list[int] = []
    results: list[int] = []
    times: list[float] = []
    for i, seg in enumerate(segs):
        where = f"{src}: request {quote(rid)} segment {i}"
        p = _field(seg, keys[0], where, check, what)
        c = _field(seg, keys[1], where, check, what)
        last = i == len(segs) - 1
        if last and "api_time" in seg:
            st.trailing.append(f"{rid!r}")
        if not last:
            times.append(float(_field(seg, "api_time", where, is_seconds, "seconds >= 0")))
            a = _field(seg, keys[2], where, check, what)
            np_ = _field(segs[i + 1], keys[0], f"{src}: request {quote(rid)} segment {i + 1}",
                         check, what)
            st.checked += 1
            if text and np_ == p + c + a:
                results.append(count_tokens(a))
            elif text:
                st.violations.append(f"{rid!r} segment {i + 1}: next prompt is not "
                                     "prompt + completion + api_token")
                results.append(count_tokens(np_) - count_tokens(p) - count_tokens(c))
            else:
                if np_ != p + c + a:
                    st.violations.append(f"{rid!r} segment {i + 1}: {np_} != {p} + {c} + {a}")
                results.append(np_ - p - c)
        prompts.append(count_tokens(p) if text else p)
        outputs.append(count_tokens(c) if text else c)
    steps: list[LLM | Tool] = []
    for i, out in enumerate(outputs):
        inp = prompts[0] if i == 0 else results[i - 1]
        if inp < 0:
            st.clamped_input.append(f"{rid!r} segment {i}: {inp}")
            inp = 0
        if out < 1:
            st.clamped_output.append(f"{rid!r} segment {i}: {out}")
            out = 1
        if i > 0:
            steps.append(Tool(TEXT_TOOL_NAME if text else COUNT_TOOL_NAME,
                              TEXT_CLASS if text else tool_class, times[i - 1]))
        steps.append(LLM(inp, out))
    return steps


def _requests(src: Path) -> dict[str, Any]:
    data = read_json(src)
    if not isinstance(data, dict):
        raise InputError(f"{src}: expected a JSON object {{request_id: [segment, ...]}}, "
                         f"got {type(data).__name__}")
    return data


def import_path(path: Path, options: dict[str, str]) -> Imported:
    """Import an InferCept workload file (or a directory of them: ids get the file stem)."""
    opts = take_options(options, FORMAT, OPTIONS)
    rate = opt_float(opts, "arrival_rate", FORMAT)
    seed = opt_int(opts, "seed", FORMAT)
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    if not files:
        raise InputError(f"{path}: no *.json files")
    st = _Stats()
    trajs = [t for src in files for t in _file_trajectories(path, src, opts, st)]
    if not trajs:
        raise InputError(f"{path}: no requests")
    for t, s in zip(trajs, arrival_offsets(len(trajs), rate, seed), strict=True):
        t.start_s = float(s)
    return Imported(build_frame(trajs), _provenance(files, opts, rate, seed, st), _warnings(st))


def _file_trajectories(path: Path, src: Path, opts: dict[str, str],
                       st: _Stats) -> list[Trajectory]:
    """The trajectories of one file's requests (`path`: what was imported, file or folder)."""
    trajs: list[Trajectory] = []
    for rid, segs in _requests(src).items():
        st.requests += 1
        if not isinstance(segs, list) or not segs or not all(isinstance(s, dict) for s in segs):
            raise InputError(f"{src}: request {quote(rid)}: expected a non-empty list of "
                             "segment objects")
        kinds = {"prompt" in s for s in segs}
        if len(kinds) > 1:
            raise InputError(f"{src}: request {quote(rid)}: mixes text and token-count segments")
        st.text_requests += "prompt" in segs[0]
        tid = f"{src.stem}/{rid}" if path.is_dir() else str(rid)
        trajs.append(Trajectory(tid, _convert(str(rid), segs, src, opts["tool_class"], st),
                                priority=opts["priority"], tenant=opts["tenant"]))
    return trajs


def _warnings(st: _Stats) -> list[str]:
    warnings = []
    if st.violations:
        warnings.append(summarize(f"of {st.checked} segment transitions break the invariant "
                                  "next prompt = prompt + completion + api_token_length; input "
                                  "is the recorded next prompt - prompt - completion",
                                  st.violations))
    if st.clamped_input:
        warnings.append(summarize("negative inputs clamped to 0", st.clamped_input))
    if st.clamped_output:
        warnings.append(summarize("completions of 0 tokens raised to 1", st.clamped_output))
    return warnings


def _provenance(files: list[Path], opts: dict[str, str], rate: float | None, seed: int,
                st: _Stats) -> Provenance:
    notes = [
        f"{len(st.trailing)} requests end with an augmentation call (api_time on the last "
        "segment) that no LLM call consumes: dropped; each trajectory ends at its last LLM call",
        "the file does not name the augmentation of a token-count request; its class is the "
        f"option tool_class ({opts['tool_class']!r})",
    ]
    return Provenance(
        source_format=FORMAT,
        source_files=[str(f) for f in files],
        inferred={
            "input_tokens": "step 0: the first segment's prompt; later LLM steps: the recorded "
                            "next prompt - prompt - completion (clamped at 0), which equals "
                            "api_token_length wherever the invariant holds; text requests: "
                            f"token counts by {TOKEN_RULE}, later inputs = tokens of api_token "
                            "where the next prompt is prompt + completion + api_token",
            "output_tokens": "completion_tokens (text: token count of completion), at least 1",
            "tool_class": f"text (chatbot) requests: {TEXT_CLASS!r}, the user's reply; "
                          f"token-count requests: {opts['tool_class']!r} (not recorded)",
            "tool_name": f"{TEXT_TOOL_NAME!r} or {COUNT_TOOL_NAME!r}",
            "latency_s": "api_time of the segment before the tool step (recorded)",
            "outcome": "'ok': the file records no failed augmentations",
            "mutating": "false: not recorded",
            "deadline_s": "null: not recorded",
            "start_s": (f"Poisson arrivals at {rate}/s, seed {seed}" if rate else
                        "0 for every request: the file has no arrival times"),
            "priority": f"option priority ({opts['priority']!r})",
            "tenant": f"option tenant ({opts['tenant']!r})",
        },
        notes=notes,
        extra={"requests": st.requests, "text_requests": st.text_requests,
               "transitions_checked": st.checked, "invariant_violations": len(st.violations),
               "trailing_calls_dropped": len(st.trailing),
               "inputs_clamped": len(st.clamped_input),
               "outputs_clamped": len(st.clamped_output), "token_rule": TOKEN_RULE},
    )


IMPORTER = Format("infercept", one_path(import_path), many=False)
