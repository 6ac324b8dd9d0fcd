"""The synthetic workload generator and its profiles."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.errors import InputError
from harness.traces.context import context_lengths
from harness.traces.generator import generate, provenance_for
from harness.traces.profiles import builtin_profiles, load_profile
from harness.traces.schema import write_trajectories
from harness.traces.stats import retained_tokens_at_pauses
from harness.traces.validate import check_frame, load_trajectories, validate_file


@pytest.fixture(scope="module")
def flaky() -> pd.DataFrame:
    return generate(load_profile("flaky-tools"), 5000, 0)


def tools(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["kind"] == "tool"]


def test_same_seed_same_frame_other_seed_differs() -> None:
    prof = load_profile("mixed-tools")
    a, b, c = generate(prof, 50, 7), generate(prof, 50, 7), generate(prof, 50, 8)
    pd.testing.assert_frame_equal(a, b)
    assert not a.equals(c)


def test_cli_gen_is_reproducible(tmp_path: Path) -> None:
    runner = CliRunner()
    for name in ("a", "b"):
        r = runner.invoke(main, ["traces", "gen", "--profile", "bench-small", "--trajectories",
                                 "20", "--seed", "3", "--out", str(tmp_path / f"{name}.parquet")])
        assert r.exit_code == 0, r.output
    pd.testing.assert_frame_equal(load_trajectories(tmp_path / "a.parquet"),
                                  load_trajectories(tmp_path / "b.parquet"))
    r = runner.invoke(main, ["traces", "validate", str(tmp_path / "a.parquet")])
    assert r.exit_code == 0


@pytest.mark.parametrize("name", builtin_profiles())
def test_every_builtin_profile_validates(tmp_path: Path, name: str) -> None:
    prof = load_profile(name)
    df = generate(prof, 30, 1)
    assert check_frame(df, name) == []
    path = write_trajectories(df, tmp_path / f"{name}.parquet", provenance_for(prof, 30, 1))
    assert validate_file(path) == []


def test_builtin_profiles_listed() -> None:
    assert {"seed-lab", "flaky-tools", "coding-agent", "mixed-tools", "bench-small"} <= set(
        builtin_profiles())


def test_seed_lab_is_two_single_pauses_at_4096() -> None:
    df = generate(load_profile("seed-lab"), 10, 0)
    assert list(df["trajectory_id"].unique()) == ["seed-lab-50ms", "seed-lab-5000ms"]
    t = tools(df)
    assert len(t) == 2
    assert list(t["latency_s"]) == [0.05, 5.0]
    assert list(retained_tokens_at_pauses(df)) == [4096, 4096]
    assert (t["outcome"] == "ok").all()


def test_flaky_tools_fractions(flaky: pd.DataFrame) -> None:
    assert flaky["trajectory_id"].nunique() == 5000
    t = tools(flaky)
    never = t["latency_s"].isna()
    assert (t.loc[never, "outcome"] == "abandoned").all()
    assert 0.015 <= never.mean() <= 0.03
    assert 0.04 <= (t["outcome"] == "error").mean() <= 0.06
    lat = t["latency_s"].dropna()
    assert 0.045 <= lat.median() <= 0.06
    assert 15 <= np.percentile(lat, 99) <= 25


def test_nothing_follows_a_tool_that_never_returns(flaky: pd.DataFrame) -> None:
    last = flaky.groupby("trajectory_id", sort=False).tail(1)
    abandoned = tools(flaky)["latency_s"].isna()
    ended = flaky.loc[abandoned[abandoned].index, "trajectory_id"]
    assert set(ended) <= set(last.loc[last["kind"] == "tool", "trajectory_id"])


def test_coding_agent_latency_and_context_cap() -> None:
    prof = load_profile("coding-agent")
    df = generate(prof, 300, 0)
    assert 0.2 <= tools(df)["latency_s"].median() <= 0.33
    tokens = df["input_tokens"].fillna(0) + df["output_tokens"].fillna(0)
    ctx = tokens.groupby(df["trajectory_id"]).cumsum()
    assert prof.max_context_tokens is not None
    assert ctx.max() <= prof.max_context_tokens
    starts = df.groupby("trajectory_id")["start_s"].first()
    assert starts.is_monotonic_increasing and starts.iloc[-1] > 0


def test_zero_trajectories_refused() -> None:
    with pytest.raises(InputError, match="--trajectories must be > 0"):
        generate(load_profile("flaky-tools"), 0, 0)


def _profile(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "p.toml"
    p.write_text(text)
    return p


GOOD_CLASS = '[[tool_class]]\nname = "x"\nlatency_s = 0.1\n'


@pytest.mark.parametrize("text, match", [
    ('name = "p"\nbogus = 1\n' + GOOD_CLASS, "unknown key\\(s\\) bogus"),
    ('name = "p"\n' + GOOD_CLASS + "colour = 'red'\n", "tool_class\\[0\\]: unknown key\\(s\\) "
                                                       "colour"),
    ('name = "p"\n[[tool_class]]\nname = "x"\nlatency_s = { median = -1 }\n',
     "latency_s: 'median' must be > 0 and <= 1,000,000, got -1"),
    ('name = "p"\nprompt_tokens = { median = 5, sigma = -0.5 }\n' + GOOD_CLASS,
     "prompt_tokens: 'sigma' must be >= 0"),
    ('name = "p"\n' + GOOD_CLASS + "never_returns = 1.5\n", "'never_returns' must be a fraction"),
    ('name = "p"\nturns = { min = 4, max = 2 }\n' + GOOD_CLASS, "'turns.max' must be >= "),
    ('name = "p"\n', "needs at least one \\[\\[tool_class\\]\\]"),
    ('name = "p"\n[[tool_class]]\nname = "x"\n', "missing 'latency_s'"),
    ("name = \n", "not valid TOML"),
    ('name = "p"\n[[tool_class]]\nname = "x"\nlatency_s = { median = 1, max = "x" }\n',
     "latency_s: 'max' must be a finite number, got 'x'"),
    ('name = "p"\n[[trajectory]]\nid = "t"\nsteps = [{ kind = "llm", input_tokens = "many", '
     'output_tokens = 3 }]\n', "steps\\[0\\]: 'input_tokens' must be a finite number"),
    ('name = "p"\n[[trajectory]]\nid = "t"\nsteps = [{ kind = "banana" }]\n',
     "steps\\[0\\]: 'kind' must be 'llm' or 'tool', got 'banana'"),
])
def test_profile_errors_name_the_key(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(InputError, match=match) as exc:
        load_profile(str(_profile(tmp_path, text)))
    assert "p.toml" in str(exc.value)


def test_infinite_max_is_no_cap(tmp_path: Path) -> None:
    p = _profile(tmp_path, 'name = "p"\n[[tool_class]]\nname = "x"\n'
                           "latency_s = { median = 1, max = inf }\n")
    assert load_profile(str(p)).tool_classes[0].latency_s.max == float("inf")


def test_unknown_profile_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown profile 'nope'; built-in profiles: "):
        load_profile("nope")
    with pytest.raises(InputError, match="does not exist"):
        load_profile(str(tmp_path / "missing.toml"))


def test_cli_profile_error_is_one_line(tmp_path: Path) -> None:
    p = _profile(tmp_path, 'name = "p"\nbogus = 1\n' + GOOD_CLASS)
    r = CliRunner().invoke(main, ["traces", "gen", "--profile", str(p), "--out",
                                  str(tmp_path / "o.parquet")])
    assert r.exit_code == 2 and "unknown key(s) bogus" in r.output
    assert "Traceback" not in r.output


@pytest.fixture(scope="module")
def sessions() -> pd.DataFrame:
    return generate(load_profile("coding-subagents"), 40, 5)


def test_subagents_follow_their_parent(sessions: pd.DataFrame) -> None:
    firsts = sessions.groupby("trajectory_id", sort=False).head(1)
    roots = firsts[firsts["parent_id"].isna()]
    kids = firsts[firsts["parent_id"].notna()]
    assert len(roots) == 40 and len(kids) > 0
    order = list(firsts["trajectory_id"])
    for _, k in kids.iterrows():
        parent = roots[roots["trajectory_id"] == k["parent_id"]].iloc[0]
        assert k["trajectory_id"].startswith(f"{k['parent_id']}/sa")
        assert k["start_s"] == parent["start_s"] and k["tenant"] == parent["tenant"]
        assert k["prefix_group"] == f"{parent['prefix_group']}-sub"
        # Right after the parent: only the parent's other sub-agents come between.
        between = order[order.index(parent["trajectory_id"]) + 1: order.index(k["trajectory_id"])]
        assert all(t.startswith(f"{parent['trajectory_id']}/sa") for t in between)
    # Each spawn step starts 2-3 at once, numbered sa0, sa1, ... per parent in step order.
    fan = kids.groupby(["parent_id", "spawn_step"]).size()
    assert fan.between(2, 3).all()
    for p, grp in kids.groupby("parent_id", sort=False):
        assert list(grp["trajectory_id"]) == [f"{p}/sa{j}" for j in range(len(grp))]
        assert grp["spawn_step"].is_monotonic_increasing


def test_subagent_steps_and_children_tools(sessions: pd.DataFrame) -> None:
    t = tools(sessions)
    spawn = t[t["tool_class"] == "subagent"]
    assert len(spawn) and spawn["parent_id"].isna().all()  # sub-agents start none
    assert (spawn["tool_name"] == "Task").all() and (spawn["outcome"] == "ok").all()
    assert (spawn["latency_s"] <= 2.0).all() and (spawn["deadline_s"] == 900).all()
    assert not spawn["mutating"].any()
    child_tools = t[t["parent_id"].notna()]
    assert set(child_tools["tool_class"]) <= {"local_read", "sandbox"}
    assert "human" in set(t["tool_class"])


def test_prefix_in_first_calls_and_contexts_fit_a_bench_slot(sessions: pd.DataFrame) -> None:
    firsts = sessions.groupby("trajectory_id", sort=False).head(1)
    roots = firsts["parent_id"].isna()
    assert (firsts.loc[roots, "prefix_tokens"] == 1500).all()
    assert (firsts.loc[~roots, "prefix_tokens"] == 500).all()
    assert (firsts["input_tokens"] > firsts["prefix_tokens"]).all()
    assert context_lengths(sessions).after.max() <= 3800 < 4096
    assert check_frame(sessions, "sessions") == []


def test_sessions_are_reproducible() -> None:
    prof = load_profile("coding-subagents")
    pd.testing.assert_frame_equal(generate(prof, 8, 3), generate(prof, 8, 3))
    assert not generate(prof, 8, 3).equals(generate(prof, 8, 4))


BASE = ('name = "p"\nturns = { min = 3, max = 6 }\nprefix_groups = 2\n'
        '[[tool_class]]\nname = "x"\nlatency_s = 0.1\n'
        '[[tool_class]]\nname = "h"\nlatency_s = 9\n')


def test_new_keys_draw_after_the_old_ones(tmp_path: Path) -> None:
    """Adding prefix_tokens and a [subagent] table that never fires leaves every other draw:
    the same steps, with the prefix added to each first call."""
    plain = generate(load_profile(str(_profile(tmp_path, BASE))), 30, 9)
    p2 = tmp_path / "q.toml"
    p2.write_text(BASE.replace('prefix_groups = 2\n', 'prefix_groups = 2\n'
                               'prefix_tokens = { median = 300, sigma = 0.2 }\n')
                  + "[subagent]\nprobability = 0.0\n")
    more = generate(load_profile(str(p2)), 30, 9)
    assert len(more) == len(plain) and more["parent_id"].isna().all()
    first = (more["step"] == 0).to_numpy()
    pre = more["prefix_tokens"]
    assert pre[first].notna().all() and pre.groupby(more["prefix_group"]).nunique().eq(1).all()
    expected = plain["input_tokens"].copy()
    expected[first] += pre[first]
    pd.testing.assert_series_equal(more["input_tokens"], expected)
    same = [c for c in plain.columns if c not in ("input_tokens", "prefix_tokens")]
    pd.testing.assert_frame_equal(more[same], plain[same])
    assert plain[["parent_id", "spawn_step", "prefix_tokens", "keep_tokens"]].isna().all().all()


def test_subagent_table_defaults_and_fanout(tmp_path: Path) -> None:
    p = _profile(tmp_path, BASE + '[subagent]\nprobability = 1.0\nfanout = { min = 4, max = 4 }\n'
                                  'tool_classes = ["x"]\nprefix_tokens = 64\n')
    prof = load_profile(str(p))
    assert prof.subagent is not None and prof.subagent.tool_names == ("task",)
    df = generate(prof, 5, 0)
    assert check_frame(df, "p") == []
    kids = df[df["parent_id"].notna()].groupby("trajectory_id", sort=False).head(1)
    spawns = tools(df)[tools(df)["tool_class"] == "subagent"]
    assert len(kids) == 4 * len(spawns) == 4 * int((df["parent_id"].isna() & (df["kind"] ==
                                                                            "tool")).sum())
    assert set(tools(df[df["parent_id"].notna()])["tool_class"]) == {"x"}
    assert set(kids["prefix_group"]) <= {"pg0-sub", "pg1-sub"}
    assert (kids["prefix_tokens"] == 64).all()


@pytest.mark.parametrize("extra, match", [
    ("prefix_tokens = 100\n", "'prefix_tokens' needs 'prefix_groups' >= 1"),
    ('[subagent]\nprobability = 0.5\nprefix_tokens = 9\n',
     "'subagent.prefix_tokens' needs 'prefix_groups' >= 1"),
    ("[subagent]\nfanout = { min = 2, max = 3 }\n", "subagent: missing 'probability'"),
    ("[subagent]\nprobability = 0.5\nfanout = { min = 3, max = 2 }\n",
     "subagent.fanout: 'max' must be >= 'min'"),
    ("[subagent]\nprobability = 0.5\nfanout = { min = 0, max = 2 }\n",
     "subagent.fanout: 'min' must be > 0"),
    ("[subagent]\nprobability = 0.5\nfanout = { min = 1.5, max = 2 }\n",
     "'min' must be an integer"),
    ('[subagent]\nprobability = 0.5\ntool_classes = ["nope"]\n',
     "'tool_classes' names no \\[\\[tool_class\\]\\] of the profile: nope"),
    ("[subagent]\nprobability = 1.5\n", "'probability' must be a fraction"),
    ("[subagent]\nprobability = 0.5\ncolour = 1\n", "subagent: unknown key\\(s\\) colour"),
    ("subagent = 3\n", "'subagent' must be a table"),
    ('[subagent]\nprobability = 0.5\ntool_names = []\n', "'tool_names' must be a non-empty"),
    ('[[trajectory]]\nid = "t"\nsteps = [{ kind = "llm", input_tokens = 3, output_tokens = 3 }]'
     '\n[subagent]\nprobability = 0.5\n', "apply to generated trajectories"),
])
def test_session_profile_errors(tmp_path: Path, extra: str, match: str) -> None:
    with pytest.raises(InputError, match=match):
        load_profile(str(_profile(tmp_path, 'name = "p"\n' + extra + GOOD_CLASS)))
