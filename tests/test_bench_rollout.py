"""benchmarks/bench_rollout.py at a tiny size on the issue #43 item 5 structure (the data=4 x tensor=2 mesh on the
8 fake devices, one GRPO group of 8 dialogues sharing its task): its three generators -- the engine, the static
sampler, the plain jitted loop -- draw exactly the same tokens for the same seeds, and every prefill figure it
prints equals a count made here from the dialogue lengths alone (the workload's planned prompt and reply lengths),
with each path's own padding rule written out: the static sampler's power-of-two buckets, the plain loop's pad to
the call's longest prompt, the engine's prefix reuse within a dialogue. No figure is timed."""

import json
import re

import pytest

from helpers import load_benchmark

DIALOGUES, TURNS, GROUP, DATA_SHARDS = 8, 2, 8, 4
HEADER_LEN, END_LEN = 3, 1


def _bench():
    return load_benchmark('bench_rollout')


def prompt_lengths(plan, turns):
    """[(agent prompt lengths, simulator prompt lengths)] per turn, from the planned lengths: the agent's context
    grows by header + reply + end + tool result + header + user turn + end, the simulator's by its header +
    the agent's reply + end + header (its prompt) and its own turn + end."""
    n = len(plan.agent_sys)
    actx = [len(s) for s in plan.agent_sys]
    uctx = [len(s) for s in plan.user_sys]
    out = []
    for t in range(turns):
        a = [actx[i] + HEADER_LEN for i in range(n)]
        u = [uctx[i] + 2 * HEADER_LEN + int(plan.agent_len[i, t]) + END_LEN for i in range(n)]
        out.append((a, u))
        for i in range(n):
            actx[i] = a[i] + int(plan.agent_len[i, t]) + END_LEN + len(plan.tools[i][t]) + HEADER_LEN + \
                int(plan.user_len[i, t]) + END_LEN
            uctx[i] = u[i] + int(plan.user_len[i, t]) + END_LEN
    return out


def pow2(n):
    return 1 << (n - 1).bit_length()


def expected_counts(plan, turns):
    """{path: (prefill tokens, saved tokens)} counted from the lengths."""
    lengths = prompt_lengths(plan, turns)
    replies = [(plan.agent_len[:, t], plan.user_len[:, t]) for t in range(turns)]
    rows_plain = -(-DIALOGUES // DATA_SHARDS) * DATA_SHARDS
    rows_static = -(-max(1, pow2(DIALOGUES)) // DATA_SHARDS) * DATA_SHARDS
    static_prompt = lambda m: max(16, pow2(m)) if m <= 1024 else -(-m // 1024) * 1024  # noqa: E731
    calls = [ls for pair in lengths for ls in pair]
    total = sum(sum(ls) for ls in calls)
    # the engine keeps a dialogue's prompt and all but the last sampled token of its reply (never fed back)
    saved = sum(lengths[t - 1][m][i] + int(replies[t - 1][m][i]) - 1
                for t in range(1, turns) for m in range(2) for i in range(DIALOGUES))
    return {"engine": (total - saved, saved),
            "static": (sum(rows_static * static_prompt(max(ls)) for ls in calls), 0),
            "plain": (sum(rows_plain * max(ls) for ls in calls), 0)}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    import contextlib
    import io

    bench = _bench()
    out = tmp_path_factory.mktemp("bench") / "rollout.json"
    printed = io.StringIO()
    # 64-token KV pages: a dialogue's <= 880 tokens fill <= 14 pages, so each engine compiles its programs for 2
    # page-table widths (8, 14) instead of 16-token pages' 5 (8, 16, 32, 48, 55) -- the engine's warm-up is most of
    # this run's cost; both widths are used (every dialogue fits 8 pages in turn 1, three of the agent's pass 512
    # tokens in turn 2), and no count here depends on the page size
    with contextlib.redirect_stdout(printed):
        assert bench.main(["--mesh", "data=4,tensor=2", "--group", str(GROUP), "--dialogues", str(DIALOGUES),
                           "--turns", str(TURNS), "--slots", "8", "--prefill-rows", "2", "--page-size", "64",
                           "--json", str(out)]) == 0
    plan = bench.make_plan(DIALOGUES, TURNS, 512, group=GROUP)
    return plan, json.loads(out.read_text()), printed.getvalue()


def test_three_generators_draw_the_same_tokens(run):
    plan, result, _ = run
    rows = {r["path"]: r for r in result["rows"]}
    assert sorted(rows) == ["engine", "plain", "static"] and result["devices"] == 8
    # requests in order: per turn the agent's 8 replies, then the simulator's 8, each of its planned length
    want_lengths = [int(x) for t in range(TURNS) for x in (*plan.agent_len[:, t], *plan.user_len[:, t])]
    assert [len(t) for t in rows["engine"]["tokens"]] == want_lengths
    assert rows["static"]["tokens"] == rows["engine"]["tokens"]
    assert rows["plain"]["tokens"] == rows["engine"]["tokens"]
    assert all(r["same_as_engine"] == 1.0 and r["generated"] == sum(want_lengths) for r in rows.values())


def test_printed_prefill_figures_equal_the_counts_from_the_lengths(run):
    plan, result, printed = run
    want = expected_counts(plan, TURNS)
    table = {m.group(1): (int(m.group(2)), int(m.group(3)), int(m.group(4)))
             for m in re.finditer(rf"^(\w+) +{TURNS} turns +[\d.]+ +[\d.]+ +(\d+) +(\d+) +\d+ +[\d.]+ +[\d.]+% +(\d+)",
                                  printed, re.M)}
    assert {p: v[:2] for p, v in table.items()} == want
    assert table["engine"][2] == 0  # no eviction: the saved count is all reuse
    rows = {r["path"]: r for r in result["rows"]}
    assert {p: (r["prefill_tokens"], r["saved_tokens"]) for p, r in rows.items()} == want
    # the plain loop compiles, per model, one prefill per call shape (longest prompt, longest reply) and one
    # decode step per cache length (their sum)
    lengths = prompt_lengths(plan, TURNS)
    replies = [(plan.agent_len[:, t], plan.user_len[:, t]) for t in range(TURNS)]
    programs = 0
    for m in range(2):
        shapes = {(max(lengths[t][m]), int(max(replies[t][m]))) for t in range(TURNS)}
        programs += len(shapes) + len({p + r for p, r in shapes})
    assert rows["plain"]["programs"] == programs
