"""What the tests and the benchmarks publish to the local Hub and send the daemon: the token the
daemon is given, the repository ids the tiny model and datasets are published under, chat rows."""

from __future__ import annotations

HUB_TOKEN = "hf_adapterd_test_token"
TINY_MODEL = "tiny/qwen2-chat"
CHAT_DATASET = "tiny/chat-rows"
PREFERENCE_DATASET = "tiny/preferences"

CHAT_ROWS = [
    {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
    for q, a in [
        ("What is the capital of France?", "The capital of France is Paris."),
        ("What is two plus two?", "Two plus two equals four."),
        ("Where are the requests kept?", "Kafka keeps the requests."),
        ("Where are the adapters kept?", "The Hub keeps the adapters."),
        ("What is three plus five?", "Three plus five equals eight."),
        ("Is the dog lazy?", "yes, the dog is lazy."),
    ]
]
