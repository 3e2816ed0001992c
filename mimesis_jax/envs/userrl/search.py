"""SearchGym: answer a multi-hop question, searching step by step (docs/reference/environments.md, "The gyms" table: eval-only,
"a search backend (top-5 results, at most 5 searches) + LLM judge", "1.0 for a correct answer").

Rules (as UserRL's SearchGym, `gyms/SearchGym/searchgym/env/search_env.py`, with its default config and the
settings its tool's env manager uses: eval_method "llm", max_steps = the task's `max_turns`, default 15 as
UserRL's `InteractTool.create(max_turns=15)` passes it):

* `[search] <query>` -- every search action counts toward the limit of `max_search_steps` (5), empty ones
  included. Past the limit the search is not run: a message asks for an answer instead (reward 0). An empty
  query gets a message (reward 0). Otherwise the retriever's top `max_search_results` (5) passages are returned as
  a numbered list, title then "- Snippet:" line, as UserRL lays out web results (reward 0). A backend failure
  (`RetrieverError`) is answered with SEARCH_FAILED and the error, reward 0, and the episode goes on, as in
  UserRL.
* `[answer] <text>` -- an empty answer gets a message (reward 0). Otherwise the answer is first compared with the
  reference after normalisation (lower case, letters and digits only); equal = correct without asking the judge.
  Else (eval_method "llm") the judge model decides (prompts/search.toml: JSON {reasoning, judgment, feedback},
  correct iff judgment is "Yes"). Correct: reward 1.0 and the episode ends; incorrect: reward 0.0 and the
  episode goes on (the agent may answer again). The judge's feedback is not shown to the agent (UserRL computes
  and discards it); it is kept in `info["judge"]`.
* `[action]` -- not part of SearchGym: answered as an invalid action (reward 0), as is text without a prefix.
* The episode is truncated after `max_steps` steps. No step penalty, no reward normalisation (UserRL's defaults
  0.0 / off); correct/incorrect rewards 1.0 / 0.0.

Choices where UserRL is ambiguous or cannot be followed:
* UserRL's `[finish]` (ends the episode, reward 0) cannot be sent through `interact_with_env` (choices are
  action/answer/search), so it is not implemented; text starting "[finish]" is an invalid action.
* UserRL's judge call swallows every error into an "incorrect" verdict; here (docs/reference/paper.md 4.3) a judge whose answer
  does not parse is asked again once, then the episode is INVALID (`ask_parsed`). A verdict parses when the reply
  holds a JSON object whose "judgment" is "Yes" or "No" (any case; UserRL compares with "Yes" exactly and needs
  all three keys -- here reasoning/feedback are optional).
* The search backend is this project's `Retriever` (retriever.py): the shipped offline BM25 corpus
  (`search_corpus.jsonl`) by default, or any retriever passed in (e.g. `HTTPRetriever` for a web search API).
  Passages with no query term in common are not returned; a search with no hit says so.
* Search results are recorded in `info["results"]` (passage ids) for analysis; the agent sees only the text.

Data: `questions.json` (UserRL's file name and format): a list of {"id", "question", "answer"}; this project's
records may add an optional "evidence" list of corpus passage ids (the last one states the answer).
"""

from __future__ import annotations

import os

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.model_io import field, parse_json_object
from mimesis_jax.envs.userrl.common import USERRL_TOOL_MAX_TURNS, UserRLEnv, data_file, index_records, read_json
from mimesis_jax.envs.userrl.retriever import BM25Retriever, RetrieverError
from mimesis_jax.envs.userrl.tasks import register_gym

QUESTIONS_FILE = "questions.json"
CORPUS_FILE = "search_corpus.jsonl"

CORRECT_REWARD = 1.0
# feedback (this project's wording)
RESET = "Question: {question}\nLook things up with [search], and reply with [answer] once you know."
SEARCH_LIMIT = ("You have used all {limit} searches allowed. Give your answer with [answer] now; further searches "
                "will not run.")
SEARCH_EMPTY = "Nothing to look up: write a query after [search]."
SEARCH_FAILED = "The search backend returned an error: {error}"
ANSWER_EMPTY = "Nothing to grade: write your answer after [answer]."
ANSWER_CORRECT = "'{answer}' is right. Well done!"
ANSWER_WRONG = "'{answer}' does not answer the question."
INCORRECT_REWARD = 0.0


def normalize_answer(text: str) -> str:
    """Lower case, letters and digits only (UserRL's exact-match rule before the judge is asked)."""
    return "".join(ch for ch in text.lower() if ch.isalnum())


def load_questions(path) -> dict[str, dict]:
    """questions.json -> {id: record}, every record checked (errors name the file, record and field)."""
    records = read_json(path)
    where = str(path)
    table = index_records(records, "id", where)
    for i, r in enumerate(records):
        at = f"{where}, record {i} (id {r['id']!r})"
        q = field(r, "question", str, at)
        if not q.strip():
            raise EnvError(f"{at}: field 'question' is empty")
        a = field(r, "answer", (str, int, float), at)
        if not str(a).strip():
            raise EnvError(f"{at}: field 'answer' is empty")
        ev = field(r, "evidence", list, at, optional=True, default=[])
        if not all(isinstance(e, str) and e for e in ev):
            raise EnvError(f"{at}: field 'evidence' must be a list of passage ids (strings)")
    return table


def parse_verdict(text: str) -> dict:
    """The judge's JSON verdict -> {"correct": bool, "reasoning", "feedback"}; ValueError when it does not parse."""
    obj = parse_json_object(text)
    judgment = obj.get("judgment")
    if not isinstance(judgment, str) or judgment.strip().strip(".").lower() not in ("yes", "no"):
        raise ValueError(f"'judgment' must be \"Yes\" or \"No\", got {judgment!r}")
    return {"correct": judgment.strip().strip(".").lower() == "yes",
            "reasoning": obj.get("reasoning"), "feedback": obj.get("feedback")}


def format_results(query: str, passages) -> str:
    """The agent's view of a search: a numbered list, each a title line and a snippet line."""
    if not passages:
        return f"The search '{query}' found no results. Try other words."
    lines = [f"Top results for '{query}':"]
    for i, p in enumerate(passages, start=1):
        lines.append(f"{i}. {p.title}")
        lines.append(f"- Snippet: {p.text}")
    return "\n".join(lines)


@register_gym("SearchGym")
class SearchGym(UserRLEnv):
    """One multi-hop question; the agent searches (at most `max_search_steps` times) and answers."""

    prompt_file = "search"
    default_max_steps = USERRL_TOOL_MAX_TURNS  # what UserRL's InteractTool passes, not the gym config's own default
    invalid_action_feedback = ("Invalid action. Use [search] followed by a query to look something up, or [answer] "
                               "followed by your answer.")

    def __init__(self, record: dict, *, retriever, judge=None, max_steps: int | None = None,
                 max_search_steps: int = 5, max_search_results: int = 5, eval_method: str = "llm", **kwargs):
        super().__init__(judge=judge, max_steps=max_steps, **kwargs)
        where = f"{self.name} record"
        self.question_id = str(field(record, "id", (str, int), where))
        self.question = field(record, "question", str, where)
        self.answer_text = str(field(record, "answer", (str, int, float), where))
        if retriever is None or not callable(getattr(retriever, "search", None)):
            raise EnvError(f"{self.name}: retriever must have a search(query, k) method, got {retriever!r}")
        self.retriever = retriever
        for name, v in (("max_search_steps", max_search_steps), ("max_search_results", max_search_results)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise EnvError(f"{self.name}: {name} must be a positive integer, got {v!r}")
        self.max_search_steps, self.max_search_results = max_search_steps, max_search_results
        if eval_method not in ("llm", "rule"):
            raise EnvError(f"{self.name}: eval_method must be 'llm' or 'rule', got {eval_method!r}")
        if eval_method == "llm" and judge is None:
            raise EnvError(f"{self.name} needs a judge model (pass judge=<ChatModel>, or eval_method='rule')")
        self.eval_method = eval_method
        self.search_count = 0
        self.answered_correctly = False
        self.search_history: list[dict] = []

    # -------------------------------------------------------------- protocol
    def _reset(self):
        self.search_count, self.answered_correctly, self.search_history = 0, False, []
        feedback = RESET.format(question=self.question)
        return feedback, {"question_id": self.question_id, "question": self.question,
                          "correct_answer": self.answer_text}

    def choice_not_allowed(self, choice: str) -> str:
        return self.invalid_action_feedback

    def _search(self, query: str):
        self.search_count += 1  # counted before anything else, as UserRL does (empty and over-limit ones too)
        info = {"question_id": self.question_id, "search_count": self.search_count}
        if self.search_count > self.max_search_steps:
            return SEARCH_LIMIT.format(limit=self.max_search_steps), 0.0, False, {**info, "search_limit": True}
        if not query:
            return SEARCH_EMPTY, 0.0, False, info
        try:
            passages = list(self.retriever.search(query, k=self.max_search_results))[: self.max_search_results]
        except RetrieverError as e:
            return SEARCH_FAILED.format(error=e), 0.0, False, {**info, "search_error": str(e)}
        ids = [p.id for p in passages]
        self.search_history.append({"query": query, "results": ids, "step": self.step_count})
        return format_results(query, passages), 0.0, False, {**info, "query": query, "results": ids}

    def _answer(self, answer: str):
        info = {"question_id": self.question_id}
        if not answer:
            return ANSWER_EMPTY, 0.0, False, info
        correct = normalize_answer(answer) == normalize_answer(self.answer_text)
        info["judged_by"] = "match"
        if not correct and self.eval_method == "llm":
            messages = [{"role": "system", "content": self.prompt("judge_system")},
                        {"role": "user", "content": self.prompt("judge_user", question=self.question,
                                                                model_answer=answer,
                                                                correct_answer=self.answer_text)}]
            verdict = self.ask_parsed(self.judge, messages, parse_verdict, role="judge")
            correct = verdict["correct"]
            info.update(judged_by="judge", judge=verdict)
        self.answered_correctly = correct
        info["correct"] = correct
        if correct:
            return ANSWER_CORRECT.format(answer=answer), CORRECT_REWARD, True, info
        return ANSWER_WRONG.format(answer=answer), INCORRECT_REWARD, False, info

    # -------------------------------------------------------------- construction
    @classmethod
    def from_task(cls, task, *, data_dir=None, user=None, judge=None, retriever=None, seed=None, max_steps=None,
                  **options) -> "SearchGym":
        """The env of a SearchGym task: its record in `questions.json` (selected by `task.id`), the judge, and
        the search backend: `retriever` (any object with `search(query, k)`), else a BM25 retriever over
        `options["corpus"]` or the `search_corpus.jsonl` found in `data_dir` (default: the shipped corpus).
        `max_steps` defaults to the task's `max_turns` create argument, then 15 (UserRL's InteractTool). Other options:
        max_search_steps (5), max_search_results (5), eval_method ("llm" | "rule"), and UserRLEnv's keywords.
        `user` is ignored: SearchGym has no user simulator."""
        path = data_file(QUESTIONS_FILE, data_dir)
        table = load_questions(path)
        record = table.get(str(task.id))
        if record is None:
            raise EnvError(f"{path}: no question with id {task.id!r} (task {task.source or task.id})")
        if max_steps is None and task.create_kwargs.get("max_turns") is not None:
            max_steps = int(task.create_kwargs["max_turns"])
        corpus = options.pop("corpus", None)
        if retriever is None:
            if corpus is None:
                try:
                    corpus = data_file(CORPUS_FILE, data_dir)
                except EnvError as e:
                    raise EnvError(f"{e}; SearchGym needs a search backend: pass retriever=<Retriever> (e.g. "
                                   "HTTPRetriever for a web search API) or corpus=<JSONL file>") from None
            retriever = BM25Retriever(os.fspath(corpus))
        elif corpus is not None:
            raise EnvError("SearchGym.from_task: pass either retriever= or corpus=, not both")
        return cls(record, retriever=retriever, judge=judge, max_steps=max_steps, seed=seed, **options)
