"""The fork server never runs what touches CUDA at import, checks itself before it says ready, and a
server that refuses to serve is not started again (issue 38).

On a GPU host bitsandbytes' import initialises CUDA (it asks every GPU's compute capability to pick
its native library), and a server with CUDA initialised cannot fork a child that uses it. No CPU
host can see that initialisation, so these tests look at what can be seen here: whether
bitsandbytes' code ran in the server (its modules, its native library mapped), and that it runs,
native library and all, in a child forked from it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from daemon.children.forkserver import ForkServer
from daemon.children.warm import WarmChildren
from daemon.ops import metrics

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[3]

# What the server does, then a fork: the child is where bitsandbytes may run.
SERVER_THEN_CHILD = """
import json, os, sys
from pathlib import Path
os.environ["ADAPTERD_FORK_FD"] = "-1"  # what makes this interpreter the fork server, for deferred.defer_in_fork_server
from handlers.toolkit import deferred
deferred.defer_in_fork_server()  # what the server's main does first
import handlers.methods

def seen():
    return {"ran": "bitsandbytes.cextension" in sys.modules,
            "native": sorted({line.split("/")[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "libbitsandbytes" in line})}

server = seen()
server["deferred"] = deferred.pending()
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    deferred.stop_deferring()
    import peft.helpers  # holds `bnb`, imported at its module level in the server
    peft.helpers.bnb.nn.Linear4bit  # the first use: bitsandbytes runs here
    import bitsandbytes
    child = seen()
    child["same_module"] = sys.modules["bitsandbytes"] is bitsandbytes and bitsandbytes.nn is peft.helpers.bnb.nn
    os.write(write, json.dumps(child).encode())
    os._exit(0)
os.close(write)
child = json.loads(os.read(read, 65536))
os.waitpid(pid, 0)
print(json.dumps({"server": server, "child": child}))
"""  # noqa: E501 (a script's text, run as written)


def test_bitsandbytes_is_imported_in_name_only_in_the_server_and_runs_in_the_forked_child() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SERVER_THEN_CHILD],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    # In the server: peft, transformers and TRL imported it, and none of its code ran (no native library chosen).
    assert seen["server"] == {"ran": False, "native": [], "deferred": ["bitsandbytes", "boto3", "mlflow"]}
    # In the child: its code ran at first use and loaded the native library for this host (the CPU one
    # here; on a GPU host the CUDA one, which the GPU check shows), under the module peft already held.
    assert seen["child"]["ran"] and seen["child"]["same_module"]
    assert seen["child"]["native"] and all(name.startswith("libbitsandbytes_") for name in seen["child"]["native"])


async def test_the_real_server_is_one_thread_without_bitsandbytes_run_and_says_so_when_ready(tmp_path: Path) -> None:
    log_path = tmp_path / "children.log"
    server = await ForkServer.start(dict(os.environ), log_path)
    try:
        assert await server.server.ready_task
        pid = server.server.process.pid
        assert len(os.listdir(f"/proc/{pid}/task")) == 1  # no OpenMP workers, no jemalloc background thread
        assert "libbitsandbytes" not in Path(f"/proc/{pid}/maps").read_text()
    finally:
        await server.close()
    assert "ready; one thread, CUDA untouched, deferred to the children: bitsandbytes" in log_path.read_text()


# Loaded by the server's interpreter at start (PYTHONPATH): a thread that keeps running, as a library's
# background thread would. A fork keeps only the forking thread, so the server must refuse to serve.
A_THREAD_AT_START = (
    "import threading\nthreading.Thread(target=threading.Event().wait, name='stand-in', daemon=True).start()\n"
)


async def test_a_server_unfit_to_fork_refuses_and_the_daemon_goes_on_without_one(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(A_THREAD_AT_START)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    warm = WarmChildren(env, tmp_path / "children.log", tmp_path / "jobs", enabled=True)
    refused_before = metrics.FORKSERVER_FAILURES.labels("refused")._value.get()
    with structlog.testing.capture_logs() as logs:
        await warm.prepare([None])
        assert warm.server is not None
        first = warm.server
        assert not await first.server.ready_task  # it said why, then exited, instead of saying ready
        await first.server.process.wait()
        await warm.prepare([None])  # the daemon's next look: no server started again, a warm child instead
        try:
            assert warm.server is None and warm.mode == "spawn"
            assert len(warm._ready) == 1
            described = warm.describe()  # what /status and `adapterd doctor` say of it
            assert described["mode"] == "spawn" and described["fork_server"] is None
            assert str(described["fell_back"]).startswith("forkserver.refused: ") and "stand-in" in str(
                described["fell_back"]
            )
        finally:
            await warm.close()
    [refused] = [line for line in logs if line["event"] == "forkserver.refused"]
    assert (
        refused["pid"] == first.server.process.pid
        and "other thread(s) run in the server: stand-in" in refused["reason"]
    )
    assert not [line for line in logs if line["event"] == "forkserver.starting"][1:]  # one server, never restarted
    assert metrics.FORKSERVER_FAILURES.labels("refused")._value.get() == refused_before + 1
    assert metrics.WARM_START.labels("spawn")._value.get() == 1 and metrics.WARM_START.labels("fork")._value.get() == 0
    assert "refused: 1 other thread(s) run in the server: stand-in" in (tmp_path / "children.log").read_text()


async def test_a_server_that_keeps_dying_is_given_up_after_three(tmp_path: Path) -> None:
    warm = WarmChildren(dict(os.environ), tmp_path / "children.log", tmp_path / "jobs", enabled=True)
    servers = []
    with structlog.testing.capture_logs() as logs:
        try:
            for _ in range(3):
                await warm.prepare([None])
                assert warm.server is not None and await warm.server.server.ready_task
                servers.append(warm.server.server.process.pid)
                os.kill(servers[-1], 9)  # dies after it was ready, before any fork answered
                await warm.server.server.process.wait()
            await warm.prepare([None])
            assert warm.server is None and warm.mode == "spawn" and len(warm._ready) == 1
        finally:
            await warm.close()
    assert [line["pid"] for line in logs if line["event"] == "forkserver.died"] == servers
    assert [line["deaths"] for line in logs if line["event"] == "forkserver.given_up"] == [3]
