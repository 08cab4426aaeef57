"""A request's own chat template, rendered once in preflight in a forked process held to a memory
and a time bound, before any data or model loads.

A Jinja template of forty characters can allocate hundreds of megabytes or loop for minutes when
rendered (`{{ 'x' * 10**9 }}`), and transformers renders it on every row. Rendering it here once, on
a short conversation, in a fork whose address space may grow by at most `max_bytes` and which is
killed after `max_s`, turns that into a `config_invalid` failure naming `model.chat_template`. A
template that merely fails to render is left to the real render, which names its error.
"""

from __future__ import annotations

import os
import resource
import select
import signal

from transformers.utils.chat_template_utils import render_jinja_template

from handlers.protocol import JobFailed

SAMPLE = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is two plus two?"},
    {"role": "assistant", "content": "Four."},
]
_OUT_OF_MEMORY = 3


def check_template_render(template: str, *, max_bytes: int, max_s: float) -> None:
    """Raise JobFailed when rendering `template` on a short conversation needs more than `max_bytes`
    of new memory or more than `max_s` seconds."""
    pid = os.fork()
    if pid == 0:  # the fork: bound its address space to what it has now plus max_bytes, then render
        code = 0
        try:
            resource.setrlimit(resource.RLIMIT_AS, (_address_space() + max_bytes, resource.RLIM_INFINITY))
            render_jinja_template(
                [SAMPLE], chat_template=template, add_generation_prompt=True, bos_token="<s>", eos_token="</s>"
            )
        except MemoryError:
            code = _OUT_OF_MEMORY
        except BaseException:  # an ordinary template error is the real render's to report
            code = 0
        os._exit(code)
    # The fork's exit is the event to wait for: its pidfd becomes readable then, or the time is up.
    pidfd = os.pidfd_open(pid)
    try:
        exited, _, _ = select.select([pidfd], [], [], max_s)
    finally:
        os.close(pidfd)
    if not exited:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise JobFailed(
            "config_invalid",
            "preflight",
            f"model.chat_template: rendering a three-message conversation took more than {max_s:g} s",
        )
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) == _OUT_OF_MEMORY or os.WIFSIGNALED(status):
        raise JobFailed(
            "config_invalid",
            "preflight",
            "model.chat_template: rendering a three-message conversation needs more "
            f"than {max_bytes:,} bytes of memory",
        )


def _address_space() -> int:
    """This process's virtual size in bytes (VmSize), which RLIMIT_AS bounds."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmSize in /proc/self/status")
