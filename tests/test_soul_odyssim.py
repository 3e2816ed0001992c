"""Issue 22: every SOUL choice task scores a reply as OdysSim's ``agents/<task>/agent.py`` does.

Each reference below is this test's own re-statement of what the OdysSim agent does with a reply (read from its
code, written independently: a hand scanner for the tag instead of the agents' regexes where that is simpler).
The rows are the shipped samples, which use OdysSim's field names; the reference reads the RAW row (OdysSim's
fields), the env reads its parsed record. The reply set covers one tag, two tags (either order), no tag, lower
case, an upper-case tag, ``(B)``, ``B. text``, bare option text, ``Option B``, extra words, an empty reply.
`agreement()` is also what the issue's before/after table was computed with (lenient=True = the old reader).
"""

from __future__ import annotations

import ast
import json
import math
import random
import re
import string
from collections import Counter

import pytest

from mimesis_jax.envs.soul import base


# ------------------------------------------------------------------ shared reading rules (OdysSim's)
def tag_contents(reply: str, ignore_case: bool = True):
    """Yields, for each "<answer>" opening in order, the text up to the next "</answer>" (no closing: stop)."""
    hay = reply.lower() if ignore_case else reply
    pos = 0
    while True:
        start = hay.find("<answer>", pos)
        if start < 0:
            return
        end = hay.find("</answer>", start + 8)
        if end < 0:
            return
        yield reply[start + 8:end]
        pos = start + 1


def first_letter_tag(reply: str, allowed: str, ignore_case: bool = True):
    """re.search of '<answer>, spaces, one allowed letter, spaces, </answer>': the first opening whose content is
    exactly one allowed letter once whitespace is trimmed (a lower-case letter counts when the search ignores
    case)."""
    for inner in tag_contents(reply or "", ignore_case):
        x = inner.strip()
        if len(x) == 1 and (x.upper() if ignore_case else x) in allowed:
            return x.upper()
    return None


def first_tag_text(reply: str) -> str:
    """fantom/paratomi/socsci210: the first <answer>...</answer> content (any case, across lines), stripped;
    "" when there is none."""
    for inner in tag_contents(reply or ""):
        return inner.strip()
    return ""


def whole(needle: str, text: str) -> bool:
    """`needle` appears in `text` with no word character touching either end (both lower-cased)."""
    n, t = needle.lower(), text.lower()
    i = t.find(n)
    while n and i >= 0:
        before = t[i - 1] if i > 0 else " "
        after = t[i + len(n)] if i + len(n) < len(t) else " "
        if not (before.isalnum() or before == "_") and not (after.isalnum() or after == "_"):
            return True
        i = t.find(n, i + 1)
    return False


# ------------------------------------------------------------------ per-task references
def ref_hitom(row, reply):
    letter = first_letter_tag(reply, string.ascii_uppercase)
    # choices "A. x, B. y": split before each ", <Letter>. "
    items = re.split(r",\s*(?=[A-Z]\. )", row["choices"])
    choices = {it[0]: it[3:] for it in items if len(it) > 3 and it[1:3] == ". "}
    return float(letter in choices and choices[letter].strip() == row["correct_answer"].strip())


def ref_mistakes(row, reply):
    letter = first_letter_tag(reply, "ABCD")
    target = str(row.get("TargetOption") or row.get("target_option") or "").strip().upper()
    return float(letter is not None and letter == target)


def ref_twinvoice(row, reply):
    letter = first_letter_tag(reply, "ABCD")
    return float(letter is not None and letter == "ABCD"[row["answer_idx"]])


def ref_behaviorchain(row, reply):
    inner = json.loads(row["raw"]) if "raw" in row else row
    letter = first_letter_tag(reply, "ABCD")
    gold = str(inner.get("right_option_letter", "")).strip().upper()
    return float(bool(gold) and letter == gold)


def ref_social_r1(row, reply):
    letter = first_letter_tag(reply, string.ascii_uppercase)
    gold = str(row.get("answer_letter") or "").strip().upper()
    if not gold:
        text = str(row.get("answer_text") or "")
        s = text.lstrip()
        gold = s[0].upper() if len(s) >= 2 and s[0].isupper() and s[1] in ".)" else text.strip()[:1].upper()
    return float(letter is not None and letter == gold)


def ref_alignx(row, reply):
    letter = first_letter_tag(reply, "AB", ignore_case=False)  # OdysSim's pattern has no IGNORECASE
    gold = "B" if random.Random(int(row.get("index", 0))).random() < 0.5 else "A"
    return float(letter == gold)


def lifechoices_letter(reply: str, standalone_fallback: bool):
    """OdysSim's lifechoices reader; its final step (first A-D character anywhere) is replaced by the first A-D
    that is a word on its own when `standalone_fallback` (this project's documented difference)."""
    if not reply:
        return None
    t = reply.strip().upper()
    if t in ("A", "B", "C", "D"):
        return t
    got = first_letter_tag(t, "ABCD")
    if got:
        return got
    if len(t) >= 2 and t[0] in "ABCD" and t[1:].lstrip(" \t\n")[:1] in tuple(".):,"):
        return t[0]
    for word in ("CHOICE", "ANSWER"):  # WORD, then ':' or whitespace (at least one), then the letter
        for m in re.finditer(word, t):
            rest = t[m.end():]
            k = len(rest) - len(rest.lstrip(": \t\n\r\f\v"))
            if k and rest[k:k + 1] in tuple("ABCD"):
                return rest[k]
    for i in range(len(t) - 2):
        if t[i] == "(" and t[i + 1] in "ABCD" and t[i + 2] == ")":
            return t[i + 1]
    tail = t.rstrip()
    if tail and tail[-1] in "ABCD":
        return tail[-1]
    for i, ch in enumerate(t):
        if ch in "ABCD":
            if not standalone_fallback:
                return ch
            left = t[i - 1] if i else " "
            right = t[i + 1] if i + 1 < len(t) else " "
            if not (left.isalnum() or left == "_") and not (right.isalnum() or right == "_"):
                return ch
    return None


def ref_lifechoices(row, reply, standalone_fallback=True):
    got = lifechoices_letter(reply, standalone_fallback)
    gold = row["Multiple Choice Question"].get("Correct Answer", "").strip().upper()[:1]
    return float(got is not None and got == gold)


def _fantom_names(v):
    if isinstance(v, str):
        return [p.strip(" []'\"") for p in v.split(",") if p.strip(" []'\"")]
    return [str(x) for x in (v or [])]


def _fantom_tokens(s):
    s = re.sub(r"\b(a|an|the)\b", " ", s.lower())
    return "".join(c for c in s if c not in string.punctuation).split()


def ref_fantom(row, reply):
    ans = first_tag_text(reply)
    qt, gold = str(row["question_type"]), row["correct_answer"]
    if qt.startswith("tom:belief:") and qt.endswith(":multiple-choice"):
        r = ans.strip().lower()
        core = r[:-1] if r.endswith(".") else r
        if core.startswith("(") and core.endswith(")"):
            core = core[1:-1]
        elif core.startswith("("):
            core = core[1:]
        elif core.endswith(")"):
            core = core[:-1]
        return float(len(core) == 1 and core == "abcd"[int(gold)])
    if qt.endswith(":list"):
        right, wrong = _fantom_names(gold), _fantom_names(row.get("wrong_answer") or [])
        return float(bool(right) and all(whole(n, ans) for n in right) and not any(whole(n, ans) for n in wrong))
    if qt.endswith(":binary"):
        t = ans.lower().strip().strip("'").strip('"')
        yes = t.startswith(("yes", "true")) or any(p in t for p in (" yes,", " yes ", " yes.", " knows "))
        no = t.startswith(("no", "false")) or any(p in t for p in (" no,", " no ", " no.", " does not know ",
                                                                     " doesn't know "))
        want_yes = {"yes": True, "no": False, "no:long": False}[str(gold)]
        return float(yes and not no) if want_yes else float(no and not yes)
    g, p = _fantom_tokens(str(gold)), _fantom_tokens(ans)
    same = sum((Counter(g) & Counter(p)).values())
    if not g or not p or not same:
        return 0.0
    prec, rec = same / len(p), same / len(g)
    return 2 * prec * rec / (prec + rec)


def ref_paratomi(row, reply):
    ans = first_tag_text(reply)
    gold = str(row["correct_answer"])
    if not ans or not gold or not whole(gold, ans):
        return 0.0
    cands = row.get("cands") or []
    if isinstance(cands, str):
        cands = ast.literal_eval(cands)
    return float(not any(whole(c, ans) for c in cands if c.strip().lower() != gold.strip().lower()))


def ref_socsci210(row, reply):
    kind = str(row.get("response_type") or "ordinal").strip().lower()
    lo = row.get("r_min") if row.get("r_min") is not None else 0
    hi = row.get("r_max") if row.get("r_max") is not None else (1 if kind == "binary" else 7)
    inner = None
    for c in tag_contents(reply or ""):
        inner = c.strip()
        break
    if inner is None:
        return 0.0
    body = inner[1:] if inner.startswith("-") else inner
    if kind == "binary" and inner.lower() in ("yes", "no"):
        pred = 1.0 if inner.lower() == "yes" else 0.0
    elif body and all(ch in "0123456789" for ch in body):
        pred = float(int(inner))
    else:
        return 0.0
    gold = float(row["response"])
    if kind in ("binary", "categorical"):
        return float(int(pred) == int(gold))
    return max(0.0, 1.0 - abs(min(max(pred, lo), hi) - gold) / (hi - lo))


def ref_humanllm(row, reply):
    n = len(row["candidates"])
    for inner in tag_contents(reply or "", ignore_case=False):
        parts = inner.split(",")
        if len(parts) == 5 and all(len(p) == 1 and "A" <= p <= "T" for p in parts):
            if len(set(parts)) != 5 or any(ord(p) - 65 >= n for p in parts):
                return 0.0
            idx = [ord(p) - 65 for p in parts]
            return 1.0 / (idx.index(row["answer_index"]) + 1) if row["answer_index"] in idx else 0.0
    return 0.0


REFS = {"hitom": ref_hitom, "mistakes": ref_mistakes, "twinvoice": ref_twinvoice,
        "behaviorchain": ref_behaviorchain, "social_r1": ref_social_r1, "alignx": ref_alignx,
        "lifechoices": ref_lifechoices, "fantom": ref_fantom, "paratomi": ref_paratomi,
        "socsci210": ref_socsci210, "humanllm": ref_humanllm}


# ------------------------------------------------------------------ reply sets
def letter_replies(gold: str, wrong: str, text: str) -> list[str]:
    return [
        f"She keeps her word. <answer>{gold}</answer>",                      # one tag
        f"<answer>{wrong}</answer> no, on reflection <answer>{gold}</answer>",  # two tags, wrong first
        f"<answer>{gold}</answer> or maybe <answer>{wrong}</answer>",         # two tags, right first
        f"<answer>unsure</answer> then <answer>{gold}</answer>",              # first tag not a letter
        f"The answer is {gold}.",                                             # no tag
        gold,                                                                 # bare letter
        f"<answer>{gold.lower()}</answer>",                                   # lower case
        f"<ANSWER>{gold}</ANSWER>",                                           # upper-case tag
        f"<answer>({gold})</answer>",                                         # (B)
        f"({gold})",
        f"<answer>{gold}. {text}</answer>",                                   # B. text
        f"{gold}. {text}",
        f"<answer>{text}</answer>",                                           # bare option text
        text,
        f"<answer>Option {gold}</answer>",                                    # Option B
        f"Option {gold}",
        f"I think <answer> {gold} </answer> because it fits her best.",        # extra words
        f"<answer>{gold} because it fits</answer>",
        f"<answer>{wrong}</answer>",
        "I THINK SHE WOULD REFUSE",
        "",
    ]


def _raw_rows(name):
    return base.read_rows(base.sample_path(name))


def _letter_case(name, row, env):
    gold = env.gold()
    letters = env.letters()
    wrong = next(x for x in letters if x != gold)
    text = (env.options() or {}).get(gold) or "the option I mean"
    return letter_replies(gold, wrong, text)


def cases(name):
    """(row index, raw row, reply) for the task's samples."""
    out = []
    for i, row in enumerate(_raw_rows(name)):
        rec = base.task_info(name).env_class.parse_record(base._unwrap(row, "t"), "t")
        env = base.make_env(name, rec)
        if name == "fantom":
            replies = fantom_replies(row)
        elif name == "paratomi":
            g = rec["correct_answer"]
            other = next((c for c in rec["cands"] if c != g), "the garden")
            replies = [f"<answer>{g}</answer>", f"<answer>{other}</answer> no: <answer>{g}</answer>",
                       f"<answer>{g}</answer> or <answer>{other}</answer>", f"Answer: {g}", g,
                       f"<answer>{g.upper()}</answer>", f"<ANSWER>{g}</ANSWER>", f"<answer>({g})</answer>",
                       f"<answer>A. {g}</answer>", f"<answer>the {g}</answer>",
                       f"<answer>it is in the {g}, I think</answer>", f"<answer>{g} or {other}</answer>",
                       f"<answer>big_{g}</answer>", "<answer></answer>", ""]
        elif name == "socsci210":
            g = int(rec["response"])
            replies = [f"<answer>{g}</answer>", f"<answer>{g + 1}</answer> no <answer>{g}</answer>",
                       f"<answer>{g}</answer> or <answer>{g + 1}</answer>", str(g), f"Answer: {g}",
                       "<answer>yes</answer>", "<answer>YES</answer>", "<answer>No</answer>",
                       f"<answer>({g})</answer>", f"<answer>{g}. strongly agree</answer>",
                       "<answer>strongly agree</answer>", f"I'd say <answer>\n {g} \n</answer> given her views",
                       f"<answer>{g} points</answer>", "<answer>-3</answer>", "<answer>99</answer>",
                       f"<answer>{g}.0</answer>", f"<ANSWER>{g}</ANSWER>", ""]
        elif name == "humanllm":
            L = "ABCDEFGHIJKLMNOPQRST"
            n = len(rec["candidates"])
            gl = L[rec["answer_index"]]
            rest = [x for x in L[:n] if x != gl]
            top = ",".join([gl] + rest[:4])
            mid = ",".join(rest[:2] + [gl] + rest[2:4])
            replies = [f"<answer>{top}</answer>", f"<answer>{mid}</answer> <answer>{top}</answer>",
                       f"<answer>{', '.join(top.split(','))}</answer> <answer>{mid}</answer>", top,
                       f"<answer>{top.lower()}</answer>", f"<ANSWER>{top}</ANSWER>", f"<answer>({top})</answer>",
                       f"<answer>{mid}</answer>", f"Ranked: <answer>{mid}</answer> done",
                       f"<answer>{','.join(rest[:5])}</answer>", f"<answer>{gl},{gl},{','.join(rest[:3])}</answer>",
                       f"<answer>{','.join([gl] + rest[:3])}</answer>", f"<answer>{gl},{rest[0]},{rest[1]},{rest[2]},T"
                       f"</answer>", f"<answer>{rec['candidates'][rec['answer_index']]}</answer>", ""]
        else:
            replies = _letter_case(name, row, env)
        out += [(i, row, r) for r in replies]
    return out


def fantom_replies(row):
    qt, gold = row["question_type"], row["correct_answer"]
    if qt.endswith(":multiple-choice"):
        g, w = "abcd"[int(gold)], "abcd"[(int(gold) + 1) % 4]
        return [f"<answer>{g}</answer>", f"<answer>{w}</answer> <answer>{g}</answer>",
                f"<answer>{g}</answer> <answer>{w}</answer>", f"The answer is {g}", f"<answer>{g.upper()}</answer>",
                f"<answer>({g})</answer>", f"<answer>{g})</answer>", f"<answer>{g}.</answer>",
                f"<answer>{g}. she thinks so</answer>", f"<answer>Option {g.upper()}</answer>",
                f"So <answer> {g} </answer> is my pick", "<answer>she thinks it is still there</answer>", ""]
    if qt.endswith(":list"):
        right = _fantom_names(gold)
        wrong = _fantom_names(row.get("wrong_answer") or [])
        both = ", ".join(right + wrong[:1])
        return [f"<answer>{', '.join(right)}</answer>", f"<answer>{both}</answer> <answer>{', '.join(right)}</answer>",
                f"<answer>{', '.join(right)}</answer> <answer>{both}</answer>", ", ".join(right),
                f"<answer>{', '.join(right).lower()}</answer>", f"<answer>({', '.join(right)})</answer>",
                f"<answer>A. {' and '.join(right)}</answer>", f"<answer>only {right[0]}</answer>",
                f"<answer>{both}</answer>", f"<answer>{right[0]}son</answer>", ""]
    if qt.endswith(":binary"):
        yes = {"yes": True}.get(str(gold), False)
        g, w = ("Yes", "No") if yes else ("No", "Yes")
        return [f"<answer>{g}</answer>", f"<answer>{w}</answer> <answer>{g}</answer>",
                f"<answer>{g}</answer> <answer>{w}</answer>", g, f"<answer>{g.lower()}</answer>",
                f"<answer>({g})</answer>", f"<answer>{g}. he was not there</answer>",
                "<answer>yes, or no, hard to say</answer>", f"<answer>I think {g.lower()}.</answer>",
                "<answer>She knows about it</answer>", "<answer>He does not know about it</answer>", ""]
    g = str(gold)
    return [f"<answer>{g}</answer>", f"<answer>Porto</answer> <answer>{g}</answer>",
            f"<answer>{g}</answer> <answer>Porto</answer>", g, f"<answer>{g.lower()}</answer>",
            f"<answer>({g})</answer>", f"<answer>A. {g}</answer>", f"<answer>She moved to {g} at the time</answer>",
            "<answer>a.m. flight to Lisbon</answer>", ""]


TASKS = sorted(REFS)


def agreement(name, lenient=False):
    """(agreeing replies, all replies) of the env against the reference."""
    n = agree = 0
    for i, row, reply in cases(name):
        rec = base.task_info(name).env_class.parse_record(base._unwrap(row, "t"), "t")
        env = base.make_env(name, rec, lenient=lenient)
        env.reset()
        got = env.step("thinking", reply).reward
        n += 1
        agree += math.isclose(got, REFS[name](row, reply), abs_tol=1e-12)
    return agree, n


@pytest.mark.parametrize("name", TASKS)
def test_reward_equals_odyssim(name):
    bad = []
    for i, row, reply in cases(name):
        rec = base.task_info(name).env_class.parse_record(base._unwrap(row, "t"), "t")
        env = base.make_env(name, rec)
        env.reset()
        got = env.step("thinking", reply).reward
        want = REFS[name](row, reply)
        if not math.isclose(got, want, abs_tol=1e-12):
            bad.append((i, reply, got, want))
    assert not bad, f"{name}: {len(bad)} replies differ from OdysSim: {bad[:5]}"


def test_every_choice_task_has_a_reference():
    choice = {n for n in base.task_names() if base.task_info(n).family == "choice"}
    assert choice == set(REFS)


def test_reply_sets_separate_the_readers():
    """The reply set is not vacuous: the old lenient reader disagrees with OdysSim on some replies of every letter
    task, and the lifechoices fallback difference is exercised (OdysSim's first-A-D-anywhere reads 'I THINK SHE
    WOULD REFUSE' as D; ours reads no answer)."""
    for name in ("hitom", "mistakes", "twinvoice", "behaviorchain", "social_r1", "alignx", "lifechoices"):
        agree, n = agreement(name, lenient=True)
        assert agree < n, name
    assert lifechoices_letter("I THINK SHE WOULD REFUSE", standalone_fallback=False) == "D"
    assert lifechoices_letter("I THINK SHE WOULD REFUSE", standalone_fallback=True) is None
    assert lifechoices_letter("<answer>", standalone_fallback=False) == "A"


def test_lifechoices_reader_letter_by_letter():
    """The env's lifechoices reader gives the reference's letter (not only the same reward) on every reply."""
    row = _raw_rows("lifechoices")[0]
    env = base.make_env("lifechoices", base.task_info("lifechoices").env_class.parse_record(row, "t"))
    extra = ["B) refuse", "b, then", "My choice: C", "ANSWER:\nD", "(C) surely", "so, D", "I pick A today"]
    for reply in [r for _, _, r in cases("lifechoices")] + extra:
        assert env.strict_extract(reply) == lifechoices_letter(reply, standalone_fallback=True), reply


def test_social_r1_empty_answer_letter_falls_back_to_answer_text():
    row = {"prompt_text": "Q?\nA. calm\nB. upset\nC. proud", "answer_letter": "", "answer_text": "B. upset"}
    rec = base.task_info("social_r1").env_class.parse_record(row, "t")
    for reply in ("<answer>B</answer>", "<answer>A</answer>", "B"):
        env = base.make_env("social_r1", rec)
        env.reset()
        assert env.step("t", reply).reward == ref_social_r1(row, reply)
    assert ref_social_r1(row, "<answer>B</answer>") == 1.0
