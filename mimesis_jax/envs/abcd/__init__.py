"""ABCD (Action-Based Conversations Dataset) in one place: the realistic-behaviour task of the simulator's RL stage.

* `dataset`: the release loaders (conversations, kb, guidelines, ontology) and the identity-verification replay.
* `behaviour`: the 13 behaviours of Table 5 + neutral as cards, the Eq 12-13 reward, meta-narration detection.
* `env`: the behaviour environment (`SimEnv` protocol, domain ``abcd_behaviour``) and its per-behaviour report.
* ``data/``: an invented conversation sample, kb, guidelines, ontology, behaviour cards and the prompt templates.

This file imports nothing: `dataset` and `behaviour` sit low (next to the env protocols), `env` sits above
``chat/`` with the other simulator worlds, so each is imported by its own path.
"""
