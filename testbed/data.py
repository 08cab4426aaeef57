"""What the tests and the benchmarks publish to the local Hub and send the daemon: the token the
daemon is given, the repository ids the tiny model and datasets are published under, chat rows."""

from __future__ import annotations

from daemon.cli.demo_requests import CHAT_ROWS as DEMO_CHAT_ROWS

HUB_TOKEN = "hf_adapterd_test_token"
TINY_MODEL = "tiny/qwen2-chat"
CHAT_DATASET = "tiny/chat-rows"
PREFERENCE_DATASET = "tiny/preferences"

# The demo's chat rows (daemon/cli/demo_requests.py), said once, but for two: the tests' counts and
# splits were written for these six.
CHAT_ROWS = [row for index, row in enumerate(DEMO_CHAT_ROWS) if index not in (2, 6)]
