"""SearchGym's search backends: BM25 over the shipped corpus (gold passages retrievable), corpus validation, the
in-process index cache, and HTTPRetriever against a local http.server (auth header, retries, errors without the
key)."""

import http.server
import json
import os
import pathlib
import threading

import pytest

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.userrl import retriever as rmod
from mimesis_jax.envs.userrl.common import DATA_DIR
from mimesis_jax.envs.userrl.retriever import BM25Retriever, HTTPRetriever, Passage, Retriever, RetrieverError

CORPUS = DATA_DIR / "search_corpus.jsonl"
QUESTIONS = json.loads((DATA_DIR / "questions.json").read_text(encoding="utf-8"))


def _norm(s):
    return "".join(c for c in s.lower() if c.isalnum())


# ------------------------------------------------------------------------------------ BM25, shipped data
def test_shipped_corpus_size_and_evidence_ids_exist():
    rows = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert 40 <= len(rows) <= 80
    ids = {r["id"] for r in rows}
    assert len(ids) == len(rows)
    assert 8 <= len(QUESTIONS) <= 12
    by_id = {r["id"]: r for r in rows}
    for q in QUESTIONS:
        assert q["evidence"] and all(e in ids for e in q["evidence"]), q["id"]
        # the last evidence passage states the answer
        assert _norm(q["answer"]) in _norm(by_id[q["evidence"][-1]]["text"]), q["id"]


@pytest.mark.parametrize("q", QUESTIONS, ids=[q["id"] for q in QUESTIONS])
def test_bm25_finds_the_answering_passage_in_the_top_5(q):
    r = BM25Retriever(CORPUS)
    hits = r.search(q["question"], k=5)
    assert 1 <= len(hits) <= 5
    assert all(isinstance(p, Passage) for p in hits)
    assert q["evidence"][-1] in [p.id for p in hits]
    assert q["evidence"][0] in [p.id for p in hits]  # and the first hop too
    scores = [p.score for p in hits]
    assert scores == sorted(scores, reverse=True) and scores[-1] > 0


def test_bm25_k_and_no_hit_queries():
    r = BM25Retriever(CORPUS)
    assert isinstance(r, Retriever)
    assert len(r) == len(CORPUS.read_text(encoding="utf-8").splitlines())
    assert len(r.search("lighthouse", k=1)) == 1
    assert r.search("lighthouse", k=1)[0].title.endswith("Lighthouse")
    assert len(r.search("the and of", k=5)) == 0  # stop words only
    assert r.search("xylophonequark", k=5) == []  # unknown word
    assert len(r.search("Corvane", k=1000)) <= len(r)  # k beyond the corpus size
    for bad in (0, -1, 2.5, True):
        with pytest.raises(EnvError, match="k must be"):
            r.search("lighthouse", k=bad)
    with pytest.raises(EnvError, match="query must be a string"):
        r.search(None)


def _write(path: pathlib.Path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


GOOD = [{"id": "a", "title": "Alpha", "text": "The alpha passage about otters."},
        {"id": "b", "title": "Beta", "text": "The beta passage about herons."}]


@pytest.mark.parametrize("bad_row, line, message", [
    ("{not json", 3, "not valid JSON"),
    ({"id": "c", "text": "no title"}, 3, "missing field 'title'"),
    ({"id": "c", "title": "T", "text": 7}, 3, "field 'text' must be a string"),
    ({"id": "a", "title": "T", "text": "dup"}, 3, "duplicate id 'a' \\(first on line 1\\)"),
    ({"id": "", "title": "T", "text": "x"}, 3, "field 'id' is empty"),
    ('["a", "b"]', 3, "expected an object"),
])
def test_malformed_corpus_names_file_and_line(tmp_path, bad_row, line, message):
    f = _write(tmp_path / "corpus.jsonl", GOOD + [bad_row])
    with pytest.raises(EnvError, match=f"corpus.jsonl, line {line}: {message}"):
        BM25Retriever(f)


def test_missing_or_empty_corpus(tmp_path):
    with pytest.raises(EnvError, match="does not exist"):
        BM25Retriever(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n", encoding="utf-8")
    with pytest.raises(EnvError, match="holds no passages"):
        BM25Retriever(tmp_path / "empty.jsonl")


def test_index_is_cached_per_path_and_mtime(tmp_path, monkeypatch):
    f = _write(tmp_path / "c.jsonl", GOOD)
    builds = []
    real = rmod._build_index
    monkeypatch.setattr(rmod, "_build_index", lambda *a: builds.append(a) or real(*a))
    r1, r2 = BM25Retriever(f), BM25Retriever(f)
    assert [p.id for p in r1.search("otters")] == ["a"] and [p.id for p in r2.search("herons")] == ["b"]
    assert len(builds) == 1  # built once, shared
    _write(f, GOOD + [{"id": "c", "title": "Gamma", "text": "A passage about walruses."}])
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a new modification time
    assert [p.id for p in r1.search("walruses")] == ["c"]
    assert len(builds) == 2


def test_stemming_needs_pystemmer():
    if rmod._stemmer_available():
        assert BM25Retriever(CORPUS, stem=True).stem is True
    else:
        assert BM25Retriever(CORPUS).stem is False
        with pytest.raises(EnvError, match="PyStemmer"):
            BM25Retriever(CORPUS, stem=True)


# ------------------------------------------------------------------------------------ HTTP
KEY = "sk-test-9f8e7d6c5b4a"
ENV = "MIMESIS_TEST_SEARCH_KEY"
RESULTS = {"results": [{"id": "d1", "title": "First", "text": "one", "score": 3.5},
                       {"id": 2, "title": "Second", "text": "two"}]}


class _Server:
    """A local search service on 127.0.0.1 answering at most `max_requests` requests in a thread.

    plan: list of (status, body) per request (the last one repeats)."""

    def __init__(self, plan, *, max_requests=10, delay=0.0):
        self.plan, self.requests = plan, []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(n))
                outer.requests.append({"auth": self.headers.get("Authorization"), "body": body,
                                       "type": self.headers.get("Content-Type")})
                if delay:
                    threading.Event().wait(delay)
                if self.headers.get("Authorization") != f"Bearer {KEY}":
                    status, payload = 401, {"error": "bad key"}
                else:
                    status, payload = outer.plan[min(len(outer.requests), len(outer.plan)) - 1]
                data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    if status == 429:
                        self.send_header("Retry-After", "0")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *a):
                pass

        self.httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.timeout = 5
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/search"
        self.thread = threading.Thread(target=self._serve, args=(max_requests,), daemon=True)

    def _serve(self, n):
        for _ in range(n):
            self.httpd.handle_request()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.server_close()


def test_http_retries_503_then_answers(monkeypatch):
    r = HTTPRetriever("http://127.0.0.1:1/x", api_key_env=ENV, retries=3, backoff=0.01)
    monkeypatch.setenv(ENV, KEY)  # read at call time, not at construction
    with _Server([(503, {"error": "busy"}), (503, {"error": "busy"}), (200, RESULTS)], max_requests=3) as srv:
        r.url = srv.url
        hits = r.search("otters of Corvane", k=5)
    assert hits == [Passage("d1", "First", "one", 3.5), Passage("2", "Second", "two", 0.0)]
    assert len(srv.requests) == 3
    assert all(q["auth"] == f"Bearer {KEY}" and q["type"] == "application/json" for q in srv.requests)
    assert srv.requests[0]["body"] == {"query": "otters of Corvane", "k": 5}
    assert KEY not in repr(r) and KEY not in str(vars(r))


def test_http_retries_429_with_retry_after(monkeypatch):
    monkeypatch.setenv(ENV, KEY)
    with _Server([(429, {"error": "slow down"}), (200, RESULTS)], max_requests=2) as srv:
        r = HTTPRetriever(srv.url, api_key_env=ENV, retries=1, backoff=5.0)  # Retry-After: 0 wins over 5 s
        assert [p.id for p in r.search("q")] == ["d1", "2"]
    assert len(srv.requests) == 2


def test_http_results_are_cut_to_k(monkeypatch):
    monkeypatch.setenv(ENV, KEY)
    with _Server([(200, RESULTS)], max_requests=1) as srv:
        assert [p.id for p in HTTPRetriever(srv.url, api_key_env=ENV).search("q", k=1)] == ["d1"]


def test_http_always_failing_gives_a_clear_error_without_the_key(monkeypatch):
    monkeypatch.setenv(ENV, KEY)
    with _Server([(503, {"error": f"down, your key {KEY}"})], max_requests=3) as srv:
        with pytest.raises(RetrieverError) as e:
            HTTPRetriever(srv.url, api_key_env=ENV, retries=2, backoff=0.01).search("q")
    msg = str(e.value)
    assert len(srv.requests) == 3
    assert srv.url in msg and "failed after 3 attempts" in msg and "HTTP 503" in msg
    assert KEY not in msg


def test_http_non_retryable_and_malformed_replies(monkeypatch):
    monkeypatch.setenv(ENV, "wrong-key-123")
    with _Server([(200, RESULTS)], max_requests=1) as srv:
        with pytest.raises(RetrieverError, match="HTTP 401.*not retried") as e:
            HTTPRetriever(srv.url, api_key_env=ENV, retries=3, backoff=0.01).search("q")
    assert len(srv.requests) == 1 and "wrong-key-123" not in str(e.value)
    monkeypatch.setenv(ENV, KEY)
    for payload, match in (("not json", "not JSON"), ({"hits": []}, "list 'results'"),
                           ({"results": [{"id": "x", "title": 3, "text": "t"}]}, r"results\[0\].title")):
        with _Server([(200, payload)], max_requests=1) as srv:
            with pytest.raises(RetrieverError, match=match):
                HTTPRetriever(srv.url, api_key_env=ENV, retries=0).search("q")


def test_http_missing_key_connection_errors_and_timeouts(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    with pytest.raises(RetrieverError, match=f"environment variable {ENV} is not set"):
        HTTPRetriever("http://127.0.0.1:9/x", api_key_env=ENV).search("q")
    monkeypatch.setenv(ENV, KEY)
    with _Server([(200, RESULTS)], max_requests=0) as srv:  # bound, then closed: nothing listens
        url = srv.url
    with pytest.raises(RetrieverError, match="failed after 2 attempts; last error: connection error") as e:
        HTTPRetriever(url, api_key_env=ENV, retries=1, backoff=0.0).search("q")
    assert KEY not in str(e.value)
    with _Server([(200, RESULTS)], max_requests=1, delay=0.6) as srv:
        with pytest.raises(RetrieverError, match="connection error"):
            HTTPRetriever(srv.url, api_key_env=ENV, retries=0, timeout=0.1).search("q")
    with pytest.raises(EnvError, match="http"):
        HTTPRetriever("ftp://x")
    with pytest.raises(EnvError, match="retries"):
        HTTPRetriever("http://x", retries=-1)
