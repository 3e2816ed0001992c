"""Chat models: the `ChatModel` base class every chat model subclasses and `chat_many` (base.py); local models
over this project's generators (local.py: the static sampler or the engine); OpenAI-compatible remotes
(remote.py); a turn's thought and utterance (thoughts.py); model specs named on the command line (specs.py); a
checkpoint as a chat model (loading.py); token streams as text (stream.py); concurrent calls batched in process
(batching.py); refusal detection (refusal.py)."""
