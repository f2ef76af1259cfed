"""A fork server for the `pkgq` commands tests run: one process per test worker imports the
command line once, and each `pkgq ...` the tests run (short ones, and long-running ones that
`PkgqProcess` signals and waits for by pid) is a fork of it that runs the command with its own
arguments, environment, working directory and standard streams, then exits with the
command's status, as `python -m consumers ...` would.

Why: a fresh interpreter spends about half a second of CPU importing before a command does
anything, and the suite runs a few hundred of them on a 2-core machine. A fork starts with
the imports done. What differs from a fresh process: the imports were made under the
worker's environment (pkgq reads its settings when a command runs, never at import), and so
were the interpreter's own choices (PYTHON* variables, locale, hash seed) and the plugins'
entry points read at preload; an unhandled KeyboardInterrupt ends it with status 1, not by
the signal; and the child ends with `os._exit` after running the exit handlers, without
waiting for threads a command left behind. When the worker goes, the server stops the
commands it left running (SIGTERM, then SIGKILL after GRACE_S) and ends. Another release's
interpreter (the rolling-upgrade test) still starts fresh; `tests/unit/test_zygote.py` runs
commands both ways and compares them. PKGQ_TEST_ZYGOTE=0 turns it off.

The protocol: JSON lines. A request {"id", "argv", "env", "cwd", "stdin", "stdout", "stderr"}
(paths of files for the streams; "stderr" null: into "stdout") is answered {"id", "pid"}
when the child is forked and {"id", "code"} when it has ended (negative: killed by that
signal, as subprocess says).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import locale
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import Future
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ENTRY = str(ROOT / "consumers" / "__main__.py")
"""What `sys.argv[0]` is in `python -m consumers`: click names the program from it."""


# -- the server (in its own process) -------------------------------------------------------


def _preload() -> None:
    """Import every command's module, the plugins' too, as `pkgq --help` does."""
    import typer.main
    import uvloop  # noqa: F401  (every command's event loop: infra/event_loop.py)

    from consumers.cli.app import app

    root = typer.main.get_command(app)
    with root.make_context("pkgq", ["--help"], resilient_parsing=True) as ctx:
        for name in root.list_commands(ctx):  # type: ignore[attr-defined]
            root.get_command(ctx, name)  # type: ignore[attr-defined]


def _child(request: dict[str, Any], keep: tuple[int, ...]) -> None:
    """Run one command in this forked process and exit with its status; never returns."""
    code = 1
    try:
        for fd in keep:
            os.close(fd)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        streams = [
            (0, request["stdin"] or os.devnull, os.O_RDONLY),
            (1, request["stdout"], os.O_WRONLY | os.O_APPEND),
        ]
        if request["stderr"] is not None:
            streams.append((2, request["stderr"], os.O_WRONLY | os.O_APPEND))
        for target, path, flags in streams:
            fd = os.open(path, flags)
            os.dup2(fd, target)
            os.close(fd)
        if request["stderr"] is None:  # stderr=STDOUT
            os.dup2(1, 2)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [ENTRY, *request["argv"]]
        sys.modules["__main__"].__package__ = "consumers"  # click: "python -m consumers"
        from consumers.cli import main

        try:
            main()
            code = 0
        except SystemExit as exit_:
            if exit_.code is None:
                code = 0
            elif isinstance(exit_.code, int):
                code = exit_.code
            else:  # as the interpreter does: the value on stderr, status 1
                print(exit_.code, file=sys.stderr)
                code = 1
        except BaseException:  # noqa: BLE001  (as the interpreter does: a traceback, status 1)
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


GRACE_S = 10.0
"""How long commands left running by a worker that went get after a SIGTERM."""


def _signal_all(children: dict[int, int], sig: int) -> None:
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _write_all(fd: int, data: bytes) -> None:
    """All of `data` (a pipe write of more than PIPE_BUF bytes may be cut short)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def serve(requests_fd: int, answers_fd: int) -> None:
    """Read requests, fork a child for each, say its pid and later its status; end when the
    requests' pipe closes (the test worker went) and every child has been reaped."""
    _preload()
    children: dict[int, int] = {}  # pid -> request id
    pending = b""

    def answer(message: dict[str, Any]) -> None:
        _write_all(answers_fd, (json.dumps(message) + "\n").encode())

    def start(request: dict[str, Any]) -> None:
        pid = os.fork()
        if pid == 0:
            _child(request, (requests_fd, answers_fd))
        children[pid] = request["id"]
        answer({"id": request["id"], "pid": pid})

    open_ = True
    gone_at = 0.0
    while open_ or children:
        watched = [requests_fd] if open_ else []
        ready, _, _ = select.select(watched, [], [], 0.01 if children else None)
        if ready:
            chunk = os.read(requests_fd, 1 << 16)
            if not chunk:  # the worker went: stop what it left running (TERM, then KILL)
                open_ = False
                gone_at = time.monotonic()
                _signal_all(children, signal.SIGTERM)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                start(json.loads(line))
        if not open_ and children and time.monotonic() - gone_at > GRACE_S:
            _signal_all(children, signal.SIGKILL)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            answer({"id": children.pop(pid), "code": os.waitstatus_to_exitcode(status)})


# -- the client (in the test worker) --------------------------------------------------------


class Zygote:
    """The test worker's fork server, started on first use; thread-safe."""

    def __init__(self) -> None:
        requests_read, self._requests = os.pipe()
        answers_read, answers_write = os.pipe()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.zygote", str(requests_read), str(answers_write)],
            pass_fds=(requests_read, answers_write),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            cwd=ROOT,  # where `tests` imports from, whatever directory pytest runs in
        )
        os.close(requests_read)
        os.close(answers_write)
        self._answers = os.fdopen(answers_read, "r", encoding="utf-8")
        self._lock = threading.Lock()
        self._next_id = 0
        self._pids: dict[int, Future[int]] = {}
        self._codes: dict[int, Future[int]] = {}
        threading.Thread(target=self._read, name="pkgq-test-zygote", daemon=True).start()

    def _read(self) -> None:
        for line in self._answers:
            message = json.loads(line)
            with self._lock:
                if "pid" in message:
                    self._pids.pop(message["id"]).set_result(message["pid"])
                else:
                    self._codes.pop(message["id"]).set_result(message["code"])
        with self._lock:  # the server is gone: nobody waits for ever
            for future in (*self._pids.values(), *self._codes.values()):
                future.set_exception(RuntimeError("the test zygote ended"))

    def alive(self) -> bool:
        return self._process.poll() is None

    def close(self) -> None:
        """End the server (it stops the commands still running first)."""
        with contextlib.suppress(OSError):
            os.close(self._requests)
        self._process.wait(timeout=GRACE_S + 30)

    def start(
        self, args: list[str], env: dict[str, str], stdout: str, stderr: str | None
    ) -> Forked:
        """Fork `python -m consumers *args` with `env`, its output appended to the file
        `stdout` and its error output to `stderr` (None: to `stdout` too); no input."""
        return self._fork(args, env, None, stdout, stderr)

    def _fork(
        self,
        args: list[str],
        env: dict[str, str],
        stdin: str | None,
        stdout: str,
        stderr: str | None,
    ) -> Forked:
        pid_future: Future[int] = Future()
        code_future: Future[int] = Future()
        with self._lock:
            self._next_id += 1
            request_id = self._next_id
            self._pids[request_id] = pid_future
            self._codes[request_id] = code_future
            request = {
                "id": request_id,
                "argv": args,
                "env": env,
                "cwd": os.getcwd(),
                "stdin": stdin,
                "stdout": stdout,
                "stderr": stderr,
            }
            _write_all(self._requests, (json.dumps(request) + "\n").encode())
        command = [sys.executable, "-m", "consumers", *args]
        return Forked(command, pid_future.result(timeout=30), code_future)

    def run(
        self, args: list[str], env: dict[str, str], stdin: str | None, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """`python -m consumers *args` with `env`, as subprocess.run(capture_output=True,
        text=True) gives it."""
        encoding = locale.getpreferredencoding(False)
        with tempfile.TemporaryDirectory(prefix="pkgq-zygote-") as scratch:
            paths = {name: os.path.join(scratch, name) for name in ("stdin", "stdout", "stderr")}
            for name in ("stdout", "stderr"):
                Path(paths[name]).touch()
            if stdin is not None:
                Path(paths["stdin"]).write_text(stdin, encoding=encoding)
            child = self._fork(
                args,
                env,
                paths["stdin"] if stdin is not None else None,
                paths["stdout"],
                paths["stderr"],
            )
            try:
                code = child.wait(timeout)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(30)
                raise
            out, err = (
                Path(paths[name]).read_text(encoding=encoding) for name in ("stdout", "stderr")
            )
        return subprocess.CompletedProcess(child.args, code, out, err)


class Forked:
    """A forked command, with the part of subprocess.Popen's interface the tests use."""

    def __init__(self, args: list[str], pid: int, code: Future[int]) -> None:
        self.args = args
        self.pid = pid
        self._code = code
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self._code.done() and self._code.exception() is None:
            self.returncode = self._code.result()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        try:
            self.returncode = self._code.result(timeout=timeout)
        except TimeoutError:
            raise subprocess.TimeoutExpired(self.args, timeout or 0) from None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # not once its status is known (its pid may be reused then)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


_zygote: Zygote | None = None
_started = threading.Lock()


def zygote() -> Zygote | None:
    """This worker's fork server, or None when PKGQ_TEST_ZYGOTE=0."""
    global _zygote
    if os.environ.get("PKGQ_TEST_ZYGOTE", "1") == "0":
        return None
    with _started:
        if _zygote is None or not _zygote.alive():  # started on first use, again if it died
            _zygote = Zygote()
        return _zygote


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
