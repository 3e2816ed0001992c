"""Request parsing of the OpenAI-compatible API (serve/openai_api.py): a chat or completions request body checked
field by field into the plain dict the routes serve; a bad field raises `BadRequest` naming it (the app answers
HTTP 400 in OpenAI's error shape)."""

from __future__ import annotations


ROLES = ("system", "user", "assistant", "tool")


class BadRequest(ValueError):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


# ------------------------------------------------------------------------------------ requests
def _valid_text(s: str, where: str, param: str) -> str:
    """`s` if it is encodable text; a lone surrogate (JSON "\\ud800") is no character: BadRequest naming it."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadRequest(f"{where}: invalid text (a lone surrogate {s[e.start]!r} at character {e.start}); send "
                         "valid UTF-8", param) from None
    return s


def _content_text(content, i: int) -> str:
    if isinstance(content, str):
        return _valid_text(content, f"messages[{i}].content", f"messages[{i}]")
    if isinstance(content, list):
        parts = []
        for j, p in enumerate(content):
            if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
                raise BadRequest(f"messages[{i}].content[{j}]: only text parts are supported", f"messages[{i}]")
            parts.append(_valid_text(p["text"], f"messages[{i}].content[{j}]", f"messages[{i}]"))
        return "".join(parts)
    raise BadRequest(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}]")


def _sampling_fields(body: dict, max_tokens_limit: int, max_n: int) -> dict:
    """The fields chat and completions requests share, validated; BadRequest names the offending one."""

    def number(name, lo, hi, default, integer=False):
        v = body.get(name, default)
        if v is None:
            return default
        ok = isinstance(v, int) if integer else isinstance(v, (int, float))
        if isinstance(v, bool) or not ok or not lo <= v <= hi:
            kind = "an integer" if integer else "a number"
            raise BadRequest(f"'{name}' must be {kind} in [{lo}, {hi}], got {v!r}", name)
        return v

    def flag(name):
        v = body.get(name, False)
        if v is not None and not isinstance(v, bool):
            raise BadRequest(f"'{name}' must be a boolean, got {v!r}", name)
        return bool(v)

    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        raise BadRequest("'stop' must be a non-empty string or a list of them", "stop")
    for s in stop:
        _valid_text(s, "'stop'", "stop")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest(f"'seed' must be an integer, got {seed!r}", "seed")
    stream = flag("stream")
    opts = body.get("stream_options")
    if opts is not None and not (isinstance(opts, dict) and isinstance(opts.get("include_usage", False), bool)):
        raise BadRequest("'stream_options' must be an object like {\"include_usage\": true}", "stream_options")
    if opts is not None and not stream:
        raise BadRequest("'stream_options' is only allowed with stream=true", "stream_options")
    mt = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return {
        "max_tokens": number(mt, 1, max_tokens_limit, None, integer=True),
        "max_tokens_field": mt,
        "temperature": number("temperature", 0.0, 2.0, None),
        "top_p": number("top_p", 1e-9, 1.0, None),
        "top_k": number("top_k", 0, 1 << 30, None, integer=True),
        "n": number("n", 1, max_n, 1, integer=True),
        "stop": stop,
        "seed": seed,
        "stream": stream,
        "include_usage": bool((opts or {}).get("include_usage", False)),
        "return_token_ids": flag("return_token_ids"),
    }


def parse_request(body, max_tokens_limit: int, max_n: int = 16) -> dict:
    """Validates a chat-completions body; returns the sampling request or raises BadRequest naming the field."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("'messages' must be a non-empty list", "messages")
    messages = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise BadRequest(f"messages[{i}] must be an object with a role in {list(ROLES)}", f"messages[{i}]")
        messages.append({"role": m["role"], "content": _content_text(m.get("content"), i)})
    req = _sampling_fields(body, max_tokens_limit, max_n)
    kw = body.get("chat_template_kwargs") or {}
    if not isinstance(kw, dict) or not isinstance(kw.get("enable_thinking", False), bool):
        raise BadRequest("'chat_template_kwargs.enable_thinking' must be a boolean", "chat_template_kwargs")
    logprobs = body.get("logprobs", False)
    if logprobs is not None and not isinstance(logprobs, bool):
        raise BadRequest(f"'logprobs' must be a boolean, got {logprobs!r}", "logprobs")
    top = body.get("top_logprobs")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20):
        raise BadRequest(f"'top_logprobs' must be an integer in [0, 20], got {top!r}", "top_logprobs")
    if top:
        raise BadRequest("'top_logprobs' > 0 is not supported: the sampler returns the chosen token's log-prob "
                         "only; send top_logprobs=0", "top_logprobs")
    return {**req, "messages": messages, "enable_thinking": kw.get("enable_thinking"), "logprobs": bool(logprobs)}


def parse_completion_request(body, max_tokens_limit: int, vocab_size: int, max_n: int = 16) -> dict:
    """Validates a `/v1/completions` body. `prompts` comes back as a list of str | list[int] (one per prompt)."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    p = body.get("prompt")

    def ids_ok(x):
        return isinstance(x, list) and x and all(isinstance(t, int) and not isinstance(t, bool)
                                                 and 0 <= t < vocab_size for t in x)
    if isinstance(p, str) or ids_ok(p):
        prompts = [p]
    elif isinstance(p, list) and p and all(isinstance(x, str) for x in p) or \
            isinstance(p, list) and p and all(ids_ok(x) for x in p):
        prompts = list(p)
    else:
        raise BadRequest(f"'prompt' must be a string, a non-empty list of strings, a list of token ids in "
                         f"[0, {vocab_size}) or a list of such lists", "prompt")
    if any(isinstance(x, str) and not x for x in prompts):
        raise BadRequest("'prompt' must not be empty", "prompt")
    for x in prompts:
        if isinstance(x, str):
            _valid_text(x, "'prompt'", "prompt")
    req = _sampling_fields(body, max_tokens_limit, max_n)
    lp = body.get("logprobs")
    if lp is not None and (isinstance(lp, bool) or not isinstance(lp, int) or not 0 <= lp <= 5):
        raise BadRequest(f"'logprobs' must be an integer in [0, 5], got {lp!r}", "logprobs")
    if lp:
        raise BadRequest("'logprobs' > 0 is not supported: the sampler returns the chosen token's log-prob only; "
                         "send logprobs=0", "logprobs")
    if body.get("echo"):
        raise BadRequest("'echo' is not supported", "echo")
    if body.get("suffix") is not None:
        raise BadRequest("'suffix' is not supported", "suffix")
    if body.get("best_of") not in (None, req["n"]):
        raise BadRequest("'best_of' must equal n (no server-side ranking)", "best_of")
    return {**req, "prompts": prompts, "logprobs": lp is not None}
