"""The Qwen chat template rendered straight to token ids, with a role label per token.

One code path for training, rollouts and scoring: every sequence the project feeds a model is built here.

Layout (the Qwen3 template's byte layout; ``H`` = a template token, ``B`` = a body token of the message's role)::

    <|im_start|>system\\n{content}<|im_end|>\\n              (tools: the Qwen "# Tools" preamble in the system turn)
    <|im_start|>user\\n{content}<|im_end|>\\n
    <|im_start|>assistant\\n[<think>\\n{reasoning}\\n</think>\\n\\n]{content}[\\n<tool_call>\\n{json}\\n</tool_call>]<|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n{tool output}\\n</tool_response><|im_end|>\\n   (role "tool"; consecutive
                                                                                     tool messages share one turn)
     H---------- H-- B----------------------------------------------------------------B-------- H-

Per token: ``roles`` is "template" for ``<|im_start|>``, the role header and the newline after ``<|im_end|>``;
everything from the first body token through the closing ``<|im_end|>`` carries the message's role ("system",
"user", "assistant", "tool"). ``turn`` is the index of the message in the input list (-1 for the generation prompt
and for a tools preamble without a system message).

Assistant reasoning follows the Qwen3 template exactly: a ``<think>`` block is rendered only for assistant turns after
the last real user query, and for those only when the turn has reasoning or is the last message (then empty:
``<think>\\n\\n</think>\\n\\n``); reasoning is read from ``"reasoning"`` (or ``"reasoning_content"``) or split out of
a content containing ``</think>``. A *user* message with ``"reasoning"`` (a simulator thought) is rendered as
``<think>\\n{thought}\\n</think>\\n\\n{utterance}`` in the user turn — the same bytes the Qwen template produces for
a user content string holding that text.

**Simulator framing.** The user simulator sees the conversation with its true roles: an optional system message
carrying the user persona / task goal, then the user and assistant turns. It writes the next *user* turn after
``generation_prompt(tok, "user", enable_thinking)`` = ``<|im_start|>user\\n`` (+ ``<think>\\n`` when thinking is
on) and stops at ``<|im_end|>``. Training targets are the user turns' bodies + ``<|im_end|>`` — never the
``<|im_start|>user\\n`` header, which the rollout engine supplies. ``render_messages(..., add_generation_prompt=True,
generation_role="user")`` renders the history as it appears once a user turn follows it (assistant turns without the
empty think block), so that prompt is a token prefix of the rendered conversation that includes the new user turn.
In the simulator's own context its earlier turns keep their thoughts (ThoughtTrace SFT trains on them that way);
the agent is shown the utterances only.

Tokenization: text is encoded with ``tok.encode`` (control-token strings in message text stay plain text) in runs
between control tokens, and ids are joined. Runs are broken (encoded separately) after the role header, after
``<think>\\n`` when a thought follows (in user turns always, even before an empty thought), and after
``</think>\\n\\n`` -- exactly where a sampler's prompt ends, so training sequences tokenize like sampled ones. The
ids equal ``apply_chat_template`` + the HF tokenizer on the same string whenever message texts do not start with a
whitespace run containing a newline (it would merge with the newline before it in a whole-string encoding), user
thoughts are non-empty, and texts contain no control-token strings (which HF would parse).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Iterable, Sequence

import numpy as np

from mimesis_jax.data.tokenizer import CHAT_CONTROL_TOKENS, Tokenizer

ROLES = ("system", "user", "assistant", "tool")
TEMPLATE = "template"

_TOOLS_HEAD = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
               "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
_TOOLS_TAIL = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
               "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
               "<args-json-object>}\n</tool_call>")


class ChatFormatError(ValueError):
    """A message list that cannot be rendered (the message names the offending index and field)."""


@dataclasses.dataclass
class RenderedChat:
    ids: list[int]
    roles: list[str]  # per token: system | user | assistant | tool | template
    turn: list[int]  # per token: index of its message (-1: generation prompt / tools preamble without system)
    end: list[bool] = dataclasses.field(default_factory=list)  # per token: the <|im_end|> closing a turn

    def __post_init__(self):
        if not self.end:
            self.end = [False] * len(self.ids)
        if not (len(self.ids) == len(self.roles) == len(self.turn) == len(self.end)):
            raise ValueError(f"RenderedChat fields differ in length: ids {len(self.ids)}, roles {len(self.roles)}, "
                             f"turn {len(self.turn)}, end {len(self.end)}")

    def __len__(self) -> int:
        return len(self.ids)

    def __add__(self, other: "RenderedChat") -> "RenderedChat":
        return RenderedChat(self.ids + other.ids, self.roles + other.roles, self.turn + other.turn,
                            self.end + other.end)

    def mask(self, role: str | Iterable[str], *, include_end: bool = True, turns: Iterable[int] | None = None
             ) -> np.ndarray:
        """Bool [len] mask of the body tokens of `role` (one role or several), with or without the closing
        ``<|im_end|>``; optionally restricted to the messages with indices in `turns`."""
        want = {role} if isinstance(role, str) else set(role)
        bad = want - set(ROLES) - {TEMPLATE}
        if bad:
            raise ValueError(f"unknown role(s) {sorted(bad)}; roles are {ROLES + (TEMPLATE,)}")
        m = np.fromiter((r in want for r in self.roles), dtype=bool, count=len(self.roles))
        if not include_end:
            m &= ~np.asarray(self.end, dtype=bool)
        if turns is not None:
            m &= np.isin(np.asarray(self.turn), np.fromiter(turns, dtype=np.int64))
        return m

    def text(self, tok: Tokenizer) -> str:
        return tok.decode(self.ids)


# ----------------------------------------------------------------------------------------------- the builder
class _Builder:
    """Accumulates text runs and control tokens; a run is encoded as one string when it is closed."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.out = RenderedChat([], [], [])
        self._run: list[str] = []
        self._run_owner: tuple[str, int] | None = None

    def text(self, s: str, role: str, turn: int) -> None:
        if not s:
            return
        if self._run and self._run_owner != (role, turn):
            self.brk()
        self._run.append(s)
        self._run_owner = (role, turn)

    def brk(self) -> None:
        if self._run:
            ids = self.tok.encode("".join(self._run), parse_special=False)  # message text never fakes a turn
            role, turn = self._run_owner
            self._append(ids, role, turn)
        self._run, self._run_owner = [], None

    def control(self, token: str, role: str, turn: int, end: bool = False) -> None:
        self.brk()
        self._append([self.tok.token_id(token)], role, turn, end)

    def template_text(self, s: str, role: str, turn: int) -> None:
        """Template-authored text: control-token strings in it become control tokens (as HF would parse them)."""
        for piece, is_control in _split_controls(self.tok, s):
            if is_control:
                self.control(piece, role, turn)
            else:
                self.text(piece, role, turn)

    def _append(self, ids: list[int], role: str, turn: int, end: bool = False) -> None:
        self.out.ids += ids
        self.out.roles += [role] * len(ids)
        self.out.turn += [turn] * len(ids)
        self.out.end += [end] * len(ids)

    def done(self) -> RenderedChat:
        self.brk()
        return self.out


def _split_controls(tok: Tokenizer, s: str) -> list[tuple[str, bool]]:
    present = [c for c in CHAT_CONTROL_TOKENS if tok.find_token(c) is not None]
    out: list[tuple[str, bool]] = []
    i = 0
    while i < len(s):
        hits = [(s.find(c, i), c) for c in present]
        hits = [(p, c) for p, c in hits if p >= 0]
        if not hits:
            out.append((s[i:], False))
            break
        p, c = min(hits, key=lambda x: (x[0], -len(x[1])))
        if p > i:
            out.append((s[i:p], False))
        out.append((c, True))
        i = p + len(c)
    return out


# ------------------------------------------------------------------------------------------- message checks
def _content(m: dict, i: int) -> str:
    c = m.get("content")
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):  # OpenAI-style parts: only text parts can be rendered
        parts = []
        for j, p in enumerate(c):
            if isinstance(p, dict) and p.get("type", "text") == "text" and isinstance(p.get("text"), str):
                parts.append(p["text"])
            else:
                raise ChatFormatError(f"messages[{i}].content[{j}]: only text parts can be rendered, got {p!r:.80}")
        return "".join(parts)
    raise ChatFormatError(f"messages[{i}].content must be a string, got {type(c).__name__}")


def _reasoning(m: dict, i: int) -> str | None:
    r = m.get("reasoning", m.get("reasoning_content"))
    if r is not None and not isinstance(r, str):
        raise ChatFormatError(f"messages[{i}].reasoning must be a string, got {type(r).__name__}")
    return r


def _check(messages: Sequence[dict]) -> None:
    if not isinstance(messages, (list, tuple)):
        raise ChatFormatError(f"messages must be a list of dicts, got {type(messages).__name__}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ChatFormatError(f"messages[{i}] must be a dict, got {type(m).__name__}")
        if m.get("role") not in ROLES:
            raise ChatFormatError(f"messages[{i}].role must be one of {ROLES}, got {m.get('role')!r}")
        if m.get("tool_calls") and m["role"] != "assistant":
            raise ChatFormatError(f"messages[{i}]: only assistant messages may carry tool_calls")


def _is_query(m: dict, i: int) -> bool:
    """A real user query (not a tool result pasted into a user message), as the Qwen3 template defines it."""
    if m["role"] != "user" or not isinstance(m.get("content"), str):
        return False
    c = m["content"]
    return not (c.startswith("<tool_response>") and c.endswith("</tool_response>"))


# ----------------------------------------------------------------------------------------------- rendering
def _think_block(b: _Builder, reasoning: str, content: str, role: str, turn: int) -> None:
    """``<think>\\n{reasoning}\\n</think>\\n\\n{content}`` with run breaks where a sampler's prompt would end."""
    reasoning = reasoning.strip("\n")
    b.control("<think>", role, turn)
    if reasoning or role == "user":  # the simulator's thinking prompt ends at "<think>\n": always break there
        b.text("\n", role, turn)
        b.brk()
        b.text(reasoning + "\n", role, turn)
    else:  # an empty assistant block is Qwen's "<think>\n\n</think>" (the thinking-off prompt), one "\n\n"
        b.text("\n\n", role, turn)
    b.control("</think>", role, turn)
    b.text("\n\n", role, turn)
    b.brk()
    b.text(content.lstrip("\n"), role, turn)


def _header(b: _Builder, role: str, newline: bool = True) -> None:
    b.control("<|im_start|>", TEMPLATE, -2)
    b.text(role + ("\n" if newline else ""), TEMPLATE, -2)
    b.brk()


def _close(b: _Builder, role: str, turn: int) -> None:
    b.control("<|im_end|>", role, turn, end=True)
    b.text("\n", TEMPLATE, -2)


def _tool_calls(b: _Builder, calls, content: str, turn: int, i: int) -> None:
    for j, tc in enumerate(calls):
        if not isinstance(tc, dict):
            raise ChatFormatError(f"messages[{i}].tool_calls[{j}] must be a dict")
        fn = tc.get("function") or tc
        name, args = fn.get("name"), fn.get("arguments", {})
        if not isinstance(name, str) or not name:
            raise ChatFormatError(f"messages[{i}].tool_calls[{j}] has no function name")
        if j > 0 or content:
            b.text("\n", "assistant", turn)
        b.control("<tool_call>", "assistant", turn)
        args_s = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        b.text('\n{"name": "' + name + '", "arguments": ' + args_s + "}\n", "assistant", turn)
        b.control("</tool_call>", "assistant", turn)


def _assistant_parts(m: dict, i: int) -> tuple[str, str]:
    """(reasoning, content) per the Qwen3 template: explicit reasoning, else split out of a ``</think>`` content."""
    content = _content(m, i)
    reasoning = _reasoning(m, i)
    if reasoning is None:
        reasoning = ""
        if "</think>" in content:
            reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
            content = content.split("</think>")[-1].lstrip("\n")
    return reasoning, content


def _fix_turns(out: RenderedChat) -> RenderedChat:
    """Template tokens take the turn of the message they frame (the next body token's turn)."""
    nxt = -1
    for k in range(len(out.turn) - 1, -1, -1):
        if out.turn[k] == -2:
            out.turn[k] = nxt
        else:
            nxt = out.turn[k]
    # A trailing "\n" after the last <|im_end|> belongs to that turn.
    for k in range(len(out.turn)):
        if out.roles[k] == TEMPLATE and k > 0 and out.end[k - 1]:
            out.turn[k] = out.turn[k - 1]
    return out


def render_messages(tok: Tokenizer, messages: Sequence[dict], *, enable_thinking: bool = False,
                    add_generation_prompt: bool = False, generation_role: str = "assistant",
                    tools: list[dict] | None = None) -> RenderedChat:
    """Renders a conversation (see the module docstring for the layout and the simulator framing)."""
    _check(messages)
    if generation_role not in ("user", "assistant"):
        raise ChatFormatError(f"generation_role must be 'user' or 'assistant', got {generation_role!r}")
    b = _Builder(tok)
    n = len(messages)
    start = 0
    if tools:
        if not isinstance(tools, (list, tuple)) or not all(isinstance(t, dict) for t in tools):
            raise ChatFormatError("tools must be a list of dicts (JSON function schemas)")
        has_sys = n > 0 and messages[0]["role"] == "system"
        t = 0 if has_sys else -1
        _header(b, "system")
        if has_sys:
            b.text(_content(messages[0], 0) + "\n\n", "system", t)
            start = 1
        body = _TOOLS_HEAD + "".join("\n" + json.dumps(tl, ensure_ascii=False) for tl in tools) + _TOOLS_TAIL
        b.template_text(body, "system", t)
        _close(b, "system", t)
    # The last real user query: assistant turns after it may show their reasoning. A pending user turn (generation
    # prompt for the simulator) counts as a query after every message.
    last_query = n - 1
    for i in range(n - 1, -1, -1):
        if _is_query(messages[i], i):
            last_query = i
            break
    if add_generation_prompt and generation_role == "user":
        last_query = n
    for i in range(start, n):
        m = messages[i]
        role = m["role"]
        if role in ("system", "user"):
            _header(b, role)
            content = _content(m, i)
            reasoning = _reasoning(m, i) if role == "user" else None
            if reasoning is not None:
                _think_block(b, reasoning, content, role, i)
            else:
                b.text(content, role, i)
            _close(b, role, i)
        elif role == "assistant":
            reasoning, content = _assistant_parts(m, i)
            _header(b, "assistant")
            if i > last_query and (i == n - 1 or reasoning):
                _think_block(b, reasoning, content, "assistant", i)
            else:
                b.text(content, "assistant", i)
            if m.get("tool_calls"):
                _tool_calls(b, m["tool_calls"], content, i, i)
            _close(b, "assistant", i)
        else:  # tool: inside a user turn, consecutive tool messages share it
            if i == 0 or messages[i - 1]["role"] != "tool":
                _header(b, "user", newline=False)
            b.text("\n", "tool", i)
            b.control("<tool_response>", "tool", i)
            b.text("\n" + _content(m, i) + "\n", "tool", i)
            b.control("</tool_response>", "tool", i)
            if i == n - 1 or messages[i + 1]["role"] != "tool":
                _close(b, "tool", i)
    out = _fix_turns(b.done())
    if add_generation_prompt:
        gp = generation_prompt(tok, generation_role, enable_thinking)
        out = out + RenderedChat(gp, [TEMPLATE] * len(gp), [-1] * len(gp))
    return out


def generation_prompt(tok: Tokenizer, role: str = "assistant", enable_thinking: bool = False) -> list[int]:
    """Tokens that open a new `role` turn for sampling.

    assistant: ``<|im_start|>assistant\\n`` (+ ``<think>\\n\\n</think>\\n\\n`` when thinking is off, as Qwen3);
    user (the simulator): ``<|im_start|>user\\n`` (+ ``<think>\\n`` when thinking is on)."""
    if role not in ("user", "assistant"):
        raise ChatFormatError(f"generation prompt role must be 'user' or 'assistant', got {role!r}")
    b = _Builder(tok)
    _header(b, role)
    if role == "assistant" and not enable_thinking:
        b.control("<think>", TEMPLATE, -1)
        b.text("\n\n", TEMPLATE, -1)
        b.control("</think>", TEMPLATE, -1)
        b.text("\n\n", TEMPLATE, -1)
    elif role == "user" and enable_thinking:
        b.control("<think>", TEMPLATE, -1)
        b.text("\n", TEMPLATE, -1)
    return b.done().ids


def render_turn(tok: Tokenizer, message: dict, *, enable_thinking: bool = False) -> RenderedChat:
    """One message as the newest turn, header through ``<|im_end|>\\n``.

    Assistant and user turns come out as a sampler writes them after ``generation_prompt(role, enable_thinking)``
    (that prompt is a prefix): an assistant turn always has its think block (empty when it has no reasoning), a user
    turn has one when it carries ``"reasoning"`` or thinking is on. A tool message is a standalone tool turn."""
    _check([message])
    role = message["role"]
    if role == "assistant":
        reasoning, content = _assistant_parts(message, 0)
        if enable_thinking is False and reasoning:
            raise ChatFormatError("messages[0]: an assistant turn with reasoning cannot be rendered thinking-off")
        b = _Builder(tok)
        _header(b, "assistant")
        _think_block(b, reasoning, content, "assistant", 0)
        if message.get("tool_calls"):
            _tool_calls(b, message["tool_calls"], content, 0, 0)
        _close(b, "assistant", 0)
        return _fix_turns(b.done())
    if role == "user" and enable_thinking and _reasoning(message, 0) is None:
        message = dict(message, reasoning="")
    return render_messages(tok, [message])
