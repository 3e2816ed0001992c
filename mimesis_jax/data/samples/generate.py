"""Generates the shipped sample data (invented conversations; nothing is downloaded).

    python mimesis_jax/data/samples/generate.py      # rewrites the .jsonl files next to this script

* ``midtrain_everyday.jsonl``  -- everyday help conversations, OpenAI ``messages`` layout (role/content);
* ``midtrain_support.jsonl``   -- customer-support conversations, ShareGPT ``conversations`` layout (from/value);
* ``thoughttrace_sample.jsonl`` -- ThoughtTrace-schema records: ``type``/``content`` messages, ``reasons`` on user
  messages and ``reactions`` on assistant messages (label + the user's own words), ``task_summary``,
  ``task_expectation`` and ``survey_answers``.

Each user turn is a "move" (open, add a constraint, ask for detail, correct, ask for a format, continue, thank,
complain); the move decides the self-report labels, so thoughts and utterances agree. Deterministic (fixed seed).
"""

from __future__ import annotations

import json
import os
import random

TOPICS = {
    "cooking": dict(
        goal="cook {thing} for {who}", things=["a curry", "pancakes", "a lentil soup", "fried rice", "a birthday cake",
                                               "a pasta bake", "tacos", "a salad that keeps for lunch"],
        who=["my kids", "six friends", "myself tonight", "my parents", "a picky roommate"],
        constraints=["I don't have an oven", "it has to be vegetarian", "I only have 30 minutes",
                     "one of them is allergic to nuts", "I'm on a tight budget"],
        detail=["how long does it keep in the fridge?", "what can I use instead of cream?",
                "how do I know when it's done?", "can I make it the day before?"],
        answer=["Here is a simple plan: prep the vegetables first, then cook everything in one pan for about "
                "20 minutes, season at the end and taste as you go.",
                "A good option is to start with a base of onion and garlic, add the main ingredients, and let it "
                "simmer until thick. Serve with rice or bread.",
                "Try this: mix the dry ingredients, whisk in the wet ones, rest the batter ten minutes, then cook "
                "in small batches over medium heat."]),
    "travel": dict(
        goal="plan {thing} for {who}", things=["a weekend in Lisbon", "three days in Kyoto", "a road trip to the coast",
                                              "a cheap trip to Rome", "a ski weekend", "a day in Chicago"],
        who=["me and my partner", "a family of four", "two students", "my mom and me"],
        constraints=["we can't walk much", "the budget is 500 dollars total", "we arrive late on Friday",
                     "we don't want to rent a car", "my partner hates museums"],
        detail=["which neighbourhood should we stay in?", "how do we get from the airport?",
                "is it worth buying a city pass?", "what should we book in advance?"],
        answer=["Day one: arrive, check in and walk the old town. Day two: a morning market and an afternoon by "
                "the river. Day three: a short trip out of the city before you fly back.",
                "Stay near the centre so you can walk to most places; use the metro for the rest and book the "
                "popular sights a few days ahead.",
                "A relaxed plan: one main sight per day, long lunches, and free evenings for wandering."]),
    "tech": dict(
        goal="fix {thing}", things=["my laptop that won't connect to wifi", "a printer that prints blank pages",
                                    "my phone storage that is always full", "a slow old computer",
                                    "my email that stopped syncing"],
        who=[""], constraints=["I'm not very technical", "it's a work laptop so I can't install things",
                               "I already restarted it twice", "it's a Mac", "I need it working by tomorrow"],
        detail=["what does that setting actually do?", "will I lose my files?", "where do I find that menu?",
                "what if that doesn't work either?"],
        answer=["First, restart the device and check for updates. If the problem is still there, remove the "
                "connection and add it again, then test once more.",
                "Open the settings, look for the storage or network section, and clear the cached data. Your files "
                "stay where they are.",
                "Let's narrow it down: does it happen all the time or only sometimes? Meanwhile, try the built-in "
                "troubleshooter."]),
    "writing": dict(
        goal="write {thing}", things=["an email to my landlord about a broken heater", "a cover letter for a bakery job",
                                      "a short speech for my sister's wedding", "a complaint to my internet provider",
                                      "a thank-you note to my old teacher"],
        who=[""], constraints=["keep it under 150 words", "it should sound polite but firm", "I'm not a native speaker",
                               "it needs to be funny but not rude", "mention that this is the third time"],
        detail=["can you make the opening stronger?", "is 'kind regards' too formal?", "what should the subject line be?",
                "can you add a sentence about the deadline?"],
        answer=["Here is a draft:\n\nDear Ms. Lee,\nI am writing about the heater in my flat, which has not worked "
                "since Monday. Could you arrange a repair this week?\n\nKind regards,\nSam",
                "Draft: I am excited to apply for the position. I have two years of experience and I love working "
                "early mornings with a small team.",
                "Here is a version you can adapt. It opens with a short story, thanks everyone, and ends with a "
                "toast."]),
    "money": dict(
        goal="sort out {thing}", things=["a monthly budget", "how to save for a new bike", "splitting rent fairly",
                                         "paying off a small credit card debt", "saving for a holiday"],
        who=[""], constraints=["my income changes every month", "I live with two roommates", "I get paid weekly",
                               "I don't want to use an app", "I already spend too much on food"],
        detail=["how much should go to savings?", "what counts as a fixed cost?", "should I pay the card first?",
                "how do I track this without an app?"],
        answer=["A simple rule: half of your income for needs, a third for wants and the rest for savings. Write "
                "down every expense for two weeks first.",
                "List your fixed costs, then set a weekly limit for food and fun. Move the savings on payday so "
                "you don't see them.",
                "Split by room size: measure each room, add a share of the common space, and divide the rent in "
                "those proportions."]),
}
OPENERS = ["hi, I need to {goal}.", "Can you help me {goal}?", "I want to {goal}. Where do I start?",
           "need to {goal}, any ideas?", "Hello! I'm trying to {goal}."]
MOVES = {  # move: (utterance templates, reason label, reason text, reaction label for the reply before, its text)
    "constraint": (["Thanks, but {c}.", "ok but {c}", "One thing: {c}.", "Forgot to say, {c}."],
                   "context_grounding_and_constraints", "I asked this because {c} and the plan has to work with that.",
                   "partial_satisfaction", "It was a decent start but it ignored something important for me."),
    "detail": (["{d}", "And {d}", "Quick question, {d}"], "content_expectation",
               "I wanted a concrete answer to this before I go ahead.",
               "partial_satisfaction", "Useful, but too general for what I actually need."),
    "correct": (["No, that's not what I meant. I want to {goal}.", "That's not it. I said I want to {goal}.",
                 "You misunderstood, I need to {goal}."], "task_reorientation",
                "The assistant went in the wrong direction so I had to repeat what I want.",
                "content_relevance", "That answer was about something else. It missed my point."),
    "format": (["Can you put that in a short list?", "Shorter please.", "Can you make it bullet points?"],
               "style_expectation", "The content was fine but it was too long to read quickly.",
               "presentation_style", "Too long and hard to skim."),
    "scope": (["That's too much, I only need the first step.", "Can you focus on just one option?"],
              "content_expectation", "I only need one thing right now, not everything.",
              "scope_fit", "It covered way more than I asked for."),
    "continue": (["Great, what's next?", "ok, and after that?", "Makes sense. Then what?"], "task_continuation",
                 "I'm following the steps and want the next one.",
                 "explicit_affirmation", "That was clear and useful."),
    "thanks": (["Perfect, thank you!", "thanks, that helps a lot", "Great, thanks."], "social_and_others",
               "I just wanted to say thanks before leaving.",
               "explicit_affirmation", "This is exactly what I needed."),
    "complain": (["This still doesn't help.", "you keep saying the same thing", "Come on, that's useless."],
                 "task_reorientation", "I was getting frustrated because nothing new came up.",
                 "content_relevance", "Same advice again, it did not solve anything."),
}
FOLLOWUP = {"constraint": "Got it. With that in mind: ", "detail": "Good question. ", "correct": "Sorry about that. ",
            "format": "Here it is in short form: ", "scope": "Sure, just the first step: ",
            "continue": "Next: ", "complain": "Let's try something different. "}
SURVEY = [("age", ["18-24", "25-34", "35-44", "45-54", "55-64"]), ("gender", ["woman", "man", "non-binary"]),
          ("education", ["high school", "bachelor's degree", "master's degree", "some college"]),
          ("occupation", ["nurse", "student", "teacher", "software developer", "shop owner", "retired"]),
          ("ai_usage_frequency", ["daily", "a few times a week", "rarely"])]
SUPPORT = dict(
    issues=["my order #{n} never arrived", "I was charged twice for order #{n}", "I can't log into my account",
            "the blender I bought stopped working after a week", "I want to cancel my subscription"],
    asks=["Can you check the status?", "I want a refund.", "What are my options?", "How long will this take?"],
    agent=["I'm sorry to hear that. Could you confirm the email address on the account?",
           "Thanks for waiting. I can see the order; it is delayed at the depot and should arrive in 3 days.",
           "I've issued a refund for the duplicate charge. It takes 5 to 7 business days to show up.",
           "I can offer a replacement or a full refund. Which would you prefer?",
           "I've sent a password reset link to your email. It expires in one hour."],
    users=["it's {e}", "ok. and if it doesn't arrive by then?", "A refund please.", "That's too long, I need it "
           "this week.", "fine, thanks", "I already tried that twice.", "Can I talk to a manager?",
           "The replacement is fine."])


def _style(rng: random.Random, text: str) -> str:
    r = rng.random()
    if r < 0.2:
        return text.lower().rstrip(".!")
    if r < 0.3:
        return text + " pls"
    return text


def _conversation(rng: random.Random):
    """(topic, goal, constraint, [(role, text, move)]) for one invented chat."""
    topic = rng.choice(sorted(TOPICS))
    t = TOPICS[topic]
    goal = t["goal"].format(thing=rng.choice(t["things"]), who=rng.choice(t["who"])).strip()
    c = rng.choice(t["constraints"])
    turns = [("user", _style(rng, rng.choice(OPENERS).format(goal=goal)), "open"),
             ("assistant", rng.choice(t["answer"]), None)]
    for _ in range(rng.randint(0, 3)):
        move = rng.choice(["constraint", "detail", "correct", "format", "scope", "continue", "continue", "complain"])
        utt = rng.choice(MOVES[move][0]).format(c=c, d=rng.choice(t["detail"]), goal=goal)
        turns.append(("user", _style(rng, utt), move))
        turns.append(("assistant", FOLLOWUP[move] + rng.choice(t["answer"]), None))
    if rng.random() < 0.6:
        turns.append(("user", _style(rng, rng.choice(MOVES["thanks"][0])), "thanks"))
    return topic, goal, c, turns


def midtrain_everyday(rng: random.Random, n: int) -> list[dict]:
    out = []
    for i in range(n):
        _, _, _, turns = _conversation(rng)
        out.append({"id": f"everyday-{i:04d}", "messages": [{"role": r, "content": x} for r, x, _ in turns]})
    return out


def midtrain_support(rng: random.Random, n: int) -> list[dict]:
    out = []
    for i in range(n):
        issue = rng.choice(SUPPORT["issues"]).format(n=rng.randint(10000, 99999))
        conv = [{"from": "human", "value": _style(rng, f"Hi, {issue}. {rng.choice(SUPPORT['asks'])}")}]
        for _ in range(rng.randint(1, 4)):
            conv.append({"from": "gpt", "value": rng.choice(SUPPORT["agent"])})
            user = rng.choice(SUPPORT["users"]).format(e=f"{rng.choice(['sam', 'ana', 'li', 'omar'])}"
                                                          f"{rng.randint(1, 99)}@example.com")
            conv.append({"from": "human", "value": _style(rng, user)})
        out.append({"id": f"support-{i:04d}", "conversations": conv})
    return out


def thoughttrace(rng: random.Random, n: int) -> list[dict]:
    out = []
    t0 = 1_775_000_000
    for i in range(n):
        topic, goal, c, turns = _conversation(rng)
        msgs = []
        for k, (role, text, move) in enumerate(turns):
            m = {"content": text, "timestamp": t0 + 60 * k, "type": role, "id": t0 + 60 * k}
            if role == "user":
                if move == "open":
                    reason = ("task_motivation", f"I asked this because I really need to {goal} soon.")
                else:
                    reason = (MOVES[move][1], MOVES[move][2].format(c=c))
                if move == "open" or rng.random() < 0.85:  # some later messages have no report, as in the real data
                    m["reasons"] = [{"content": reason[1], "timestamp": t0 + 60 * k + 20, "label": reason[0]}]
            elif k + 1 < len(turns) and rng.random() < 0.85:
                nxt = turns[k + 1][2]
                m["reactions"] = [{"content": MOVES[nxt][4], "timestamp": t0 + 60 * k + 40, "label": MOVES[nxt][3]}]
            msgs.append(m)
        out.append({
            "id": f"user{rng.randint(1, 400)}_task{rng.randint(1, 3)}_conversation{i}",
            "model_name": rng.choice(["model-a", "model-b", "model-c"]),
            "task_summary": f"I wanted to {goal}.",
            "task_expectation": rng.choice(["Clear steps I can follow.", "A short, direct answer.",
                                            "Options to choose from, with trade-offs."]) + f" Keep in mind {c}.",
            "survey_answers": [{"question": q, "answer": rng.choice(a)} for q, a in SURVEY],
            "messages": msgs,
        })
    return out


def main(out_dir: str | None = None) -> None:
    out_dir = out_dir or os.path.dirname(os.path.abspath(__file__))
    rng = random.Random(20261101)
    files = {"midtrain_everyday.jsonl": midtrain_everyday(rng, 180),
             "midtrain_support.jsonl": midtrain_support(rng, 120),
             "thoughttrace_sample.jsonl": thoughttrace(rng, 80)}
    for name, records in files.items():
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        print(f"{name}: {len(records)} records")


if __name__ == "__main__":
    main()
