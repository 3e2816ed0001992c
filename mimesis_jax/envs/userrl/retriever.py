"""Search backends for SearchGym (docs/reference/environments.md: "this project defines a retriever interface, ships an offline
local corpus retriever for tests, and lets a user plug a web search API").

    retriever = BM25Retriever("mimesis_jax/envs/userrl/data/search_corpus.jsonl")
    for p in retriever.search("who designed the Tessaly Point lighthouse", k=5):
        print(p.id, p.score, p.title, p.text)

* `Retriever` -- the protocol: `search(query, k=5) -> list[Passage]`, best first. Any object with that method
  works; a backend that fails at search time raises `RetrieverError` (SearchGym then answers "search failed", as
  UserRL's gym does, and the episode goes on). Configuration and data errors are `EnvError`s.
* `BM25Retriever` -- offline lexical search over a JSONL corpus, one passage per line:
  `{"id": "...", "title": "...", "text": "..."}`. Built on `bm25s` (its tokenizer, English stop words; stemming
  only when the PyStemmer package is installed, or as asked). The index is built once per process for each
  (file, modification time, settings) and shared by every retriever / env that uses the file.
* `HTTPRetriever` -- a user's own search service over HTTP (standard library only), with timeouts and retries.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import random
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Protocol, runtime_checkable

from mimesis_jax.data import jsonio
from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.errors import ConfigError


class RetrieverError(RuntimeError):
    """A search backend failed at search time (service down, retries exhausted, malformed reply)."""


@dataclasses.dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str
    score: float = 0.0


@runtime_checkable
class Retriever(Protocol):
    def search(self, query: str, k: int = 5) -> list[Passage]:
        """The top `k` passages for `query`, best first (fewer when fewer match)."""
        ...


def _check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise EnvError(f"k must be a positive integer, got {k!r}")
    return k


# ------------------------------------------------------------------------------------ corpus
def read_corpus(path: str | os.PathLike) -> list[Passage]:
    """The passages of a JSONL corpus; a malformed line is an EnvError naming the file, the line (1-based) and
    the field. Blank lines are skipped; ids must be unique; the corpus must not be empty."""
    p = pathlib.Path(path)
    if not p.is_file():
        raise EnvError(f"search corpus {p} does not exist")
    out: list[Passage] = []
    seen: dict[str, int] = {}
    for lineno, row in jsonio.read_jsonl_numbered(p, error=EnvError):
        where = f"{p}, line {lineno}"
        if not isinstance(row, dict):
            raise EnvError(f"{where}: expected an object with 'id', 'title', 'text', got {type(row).__name__}")
        values = {}
        for key, types in (("id", (str, int)), ("title", str), ("text", str)):
            v = row.get(key)
            if v is None:
                raise EnvError(f"{where}: missing field {key!r}")
            if isinstance(v, bool) or not isinstance(v, types):
                raise EnvError(f"{where}: field {key!r} must be a string, got {type(v).__name__}")
            values[key] = str(v)
        if not values["id"].strip():
            raise EnvError(f"{where}: field 'id' is empty")
        if not (values["title"].strip() or values["text"].strip()):
            raise EnvError(f"{where}: fields 'title' and 'text' are both empty")
        if values["id"] in seen:
            raise EnvError(f"{where}: duplicate id {values['id']!r} (first on line {seen[values['id']]})")
        seen[values["id"]] = lineno
        out.append(Passage(values["id"], values["title"], values["text"]))
    if not out:
        raise EnvError(f"search corpus {p} holds no passages")
    return out


# ------------------------------------------------------------------------------------ BM25
def _stemmer_available() -> bool:
    try:
        # lazy (b): PyStemmer is optional (not in pyproject)
        import Stemmer  # noqa: F401  (PyStemmer)
    except ImportError:
        return False
    return True


@dataclasses.dataclass
class _Index:
    passages: list[Passage]
    tokenizer: Any
    model: Any


_INDEX_CACHE: dict[tuple, _Index] = {}
_INDEX_LOCK = threading.Lock()
_INDEX_CACHE_SIZE = 8


def _build_index(path: str, stem: bool, k1: float, b: float) -> _Index:
    # lazy (b): bm25s only when SearchGym builds its index
    import bm25s
    from bm25s.tokenization import Tokenizer

    passages = read_corpus(path)
    stemmer = None
    if stem:
        # lazy (b): PyStemmer is optional (not in pyproject)
        import Stemmer
        stemmer = Stemmer.Stemmer("english").stemWords
    tokenizer = Tokenizer(lower=True, stopwords="english", stemmer=stemmer)
    docs = [f"{p.title}\n{p.text}" for p in passages]
    ids = tokenizer.tokenize(docs, update_vocab=True, show_progress=False, return_as="ids")
    model = bm25s.BM25(k1=k1, b=b)
    model.index(ids, show_progress=False)
    return _Index(passages, tokenizer, model)


class BM25Retriever:
    """BM25 (bm25s, Lucene variant) over a JSONL corpus of {"id", "title", "text"} rows; title and text are
    indexed together. Passages whose score is 0 (no query term in common) are not returned, so a query with no
    known word gets no results.

    stem: None = use PyStemmer's English stemmer when that package is installed, else no stemming;
    True = require it; False = never stem.
    """

    def __init__(self, path: str | os.PathLike, *, stem: bool | None = None, k1: float = 1.5, b: float = 0.75):
        self.path = pathlib.Path(path).resolve()
        if stem is None:
            stem = _stemmer_available()
        elif stem and not _stemmer_available():
            raise EnvError("BM25Retriever(stem=True) needs the PyStemmer package (import Stemmer)")
        self.stem, self.k1, self.b = bool(stem), float(k1), float(b)
        self._index()  # fail early on a missing or malformed corpus

    def _index(self) -> _Index:
        if not self.path.is_file():
            raise EnvError(f"search corpus {self.path} does not exist")
        st = self.path.stat()
        key = (str(self.path), st.st_mtime_ns, st.st_size, self.stem, self.k1, self.b)
        with _INDEX_LOCK:
            index = _INDEX_CACHE.get(key)
            if index is None:
                for old in [k for k in _INDEX_CACHE if k[0] == key[0]]:  # a stale version of the same file
                    del _INDEX_CACHE[old]
                while len(_INDEX_CACHE) >= _INDEX_CACHE_SIZE:
                    del _INDEX_CACHE[next(iter(_INDEX_CACHE))]
                index = _INDEX_CACHE[key] = _build_index(str(self.path), self.stem, self.k1, self.b)
            return index

    def __len__(self) -> int:
        return len(self._index().passages)

    def search(self, query: str, k: int = 5) -> list[Passage]:
        k = _check_k(k)
        if not isinstance(query, str):
            raise EnvError(f"query must be a string, got {type(query).__name__}")
        index = self._index()
        q = index.tokenizer.tokenize([query], update_vocab=False, show_progress=False, return_as="ids")
        if not any(q[0]):  # only unknown words or stop words (id 0 is bm25s's empty token)
            return []
        docs, scores = index.model.retrieve(q, k=min(k, len(index.passages)), show_progress=False, n_threads=1)
        out = []
        for doc, score in zip(docs[0].tolist(), scores[0].tolist()):
            if score > 0:
                p = index.passages[int(doc)]
                out.append(Passage(p.id, p.title, p.text, float(score)))
        return out


# ------------------------------------------------------------------------------------ HTTP
_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


class HTTPRetriever:
    """A user's search service, called over HTTP with the standard library.

    Request: `POST <url>` with the JSON body `{"query": "<text>", "k": <int>}`, headers
    `Content-Type: application/json` and, when `api_key_env` is given, `Authorization: Bearer <key>` where the key
    is read from that environment variable at each call (it is never stored on the object, logged, or put in an
    error message).

    Expected reply (HTTP 200, JSON):

        {"results": [{"id": "doc-1", "title": "Page title", "text": "snippet or passage", "score": 12.3}, ...]}

    best first; `id`, `title`, `text` are strings (an integer id is accepted), `score` is a number and may be
    omitted (then 0.0). At most `k` results are used.

    Failures: HTTP 429 and 5xx, connection errors and timeouts are retried `retries` times with exponential
    backoff (`backoff * 2**attempt` seconds, a little jitter, at most `max_backoff`; a numeric `Retry-After`
    header is honoured up to `max_backoff`); other HTTP errors and malformed replies fail at once. Every failure
    raises `RetrieverError` naming the URL and the cause.

    Other APIs: override `payload(query, k)`, `headers(key)` and `passages(reply, k)`. For a Serper-style web
    search API (POST https://google.serper.dev/search, body {"q": query, "num": k}, key in an `X-API-KEY` header,
    reply {"organic": [{"title", "snippet", "link"}, ...]}):

        class SerperRetriever(HTTPRetriever):
            def payload(self, query, k):
                return {"q": query, "num": k}

            def headers(self, key):
                return {"X-API-KEY": key} if key else {}

            def passages(self, reply, k):
                rows = reply.get("organic") or []
                return [Passage(r.get("link", str(i)), r.get("title", ""), r.get("snippet", ""), float(-i))
                        for i, r in enumerate(rows[:k])]

        retriever = SerperRetriever("https://google.serper.dev/search", api_key_env="SERPER_API_KEY")

    or run a small service that translates between the two schemas.
    """

    def __init__(self, url: str, *, api_key_env: str | None = None, timeout: float = 10.0, retries: int = 3,
                 backoff: float = 0.5, max_backoff: float = 8.0):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise EnvError(f"HTTPRetriever url must start with http:// or https://, got {url!r}")
        if api_key_env is not None and (not isinstance(api_key_env, str) or not api_key_env):
            raise EnvError("HTTPRetriever api_key_env must be the NAME of an environment variable")
        if timeout <= 0:
            raise EnvError(f"HTTPRetriever timeout must be > 0, got {timeout}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise EnvError(f"HTTPRetriever retries must be an integer >= 0, got {retries!r}")
        if backoff < 0 or max_backoff < 0:
            raise EnvError("HTTPRetriever backoff and max_backoff must be >= 0")
        self.url, self.api_key_env = url, api_key_env
        self.timeout, self.retries, self.backoff, self.max_backoff = float(timeout), retries, backoff, max_backoff

    def __repr__(self):
        return f"HTTPRetriever(url={self.url!r}, api_key_env={self.api_key_env!r})"

    # -------------------------------------------------------------- hooks for other APIs
    def payload(self, query: str, k: int) -> dict:
        return {"query": query, "k": k}

    def headers(self, key: str | None) -> dict:
        return {"Authorization": f"Bearer {key}"} if key else {}

    def passages(self, reply: Any, k: int) -> list[Passage]:
        if not isinstance(reply, dict) or not isinstance(reply.get("results"), list):
            raise ValueError("the reply must be a JSON object with a list 'results'")
        out = []
        for i, r in enumerate(reply["results"][:k]):
            if not isinstance(r, dict):
                raise ValueError(f"results[{i}] must be an object")
            vals = {}
            for key in ("id", "title", "text"):
                v = r.get(key)
                if isinstance(v, bool) or not isinstance(v, (str, int)) or (key != "id" and not isinstance(v, str)):
                    raise ValueError(f"results[{i}].{key} must be a string")
                vals[key] = str(v)
            score = r.get("score", 0.0)
            if isinstance(score, bool) or not isinstance(score, (int, float)):
                raise ValueError(f"results[{i}].score must be a number")
            out.append(Passage(vals["id"], vals["title"], vals["text"], float(score)))
        return out

    # -------------------------------------------------------------- the call
    def _key(self) -> str | None:
        if self.api_key_env is None:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise RetrieverError(f"search service {self.url}: environment variable {self.api_key_env} is not set")
        return key

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        if retry_after is not None:
            try:
                return min(max(float(retry_after), 0.0), self.max_backoff)
            except ValueError:
                pass
        return min(self.backoff * (2 ** attempt) * (1.0 + 0.1 * random.random()), self.max_backoff)

    def search(self, query: str, k: int = 5) -> list[Passage]:
        k = _check_k(k)
        if not isinstance(query, str):
            raise EnvError(f"query must be a string, got {type(query).__name__}")
        key = self._key()

        def scrub(text: str) -> str:
            return text.replace(key, "***") if key else text

        body = json.dumps(self.payload(query, k)).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "application/json", **self.headers(key)}
        last = ""
        for attempt in range(self.retries + 1):
            retry_after = None
            try:
                req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    raw = resp.read()
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code} {e.reason}"
                retry_after = e.headers.get("Retry-After") if e.headers is not None else None
                e.close()
                if e.code not in _RETRY_STATUS:
                    raise RetrieverError(scrub(f"search service {self.url}: {last} (not retried)")) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
                reason = e.reason if isinstance(e, urllib.error.URLError) else e
                last = f"connection error: {type(reason).__name__}: {reason}"
            else:
                try:
                    return self.passages(json.loads(raw.decode("utf-8")), k)
                except (UnicodeDecodeError, json.JSONDecodeError) as e:
                    raise RetrieverError(scrub(f"search service {self.url}: reply is not JSON ({e})")) from None
                except (ValueError, KeyError, TypeError) as e:
                    raise RetrieverError(scrub(f"search service {self.url}: malformed reply: {e}")) from None
            if attempt < self.retries:
                time.sleep(self._delay(attempt, retry_after))
        raise RetrieverError(scrub(f"search service {self.url}: failed after {self.retries + 1} attempts; "
                                   f"last error: {last}"))


def from_option(option: str | None, key_env: str | None = None) -> Retriever | None:
    """The `--retriever` option of `rollout` and `evalagent` as a retriever (an http(s) URL, its API key read from
    the `key_env` variable, or bm25:<corpus>), or None when not given."""
    if option is None:
        return None
    if option.startswith(("http://", "https://")):
        return HTTPRetriever(option, api_key_env=key_env)
    if option.startswith("bm25:"):
        return BM25Retriever(option[len("bm25:"):])
    raise ConfigError(f"--retriever {option!r}: expected bm25:CORPUS.jsonl or http(s)://URL")
