"""The HA lab's node scripts (deploy/local/ha/rabbit.sh) on the paths a healthy lab never takes:
`rabbit_down` SIGKILLs a node that outlives its SIGTERM, and `rabbit_await` gives up on a node
whose Erlang VM exits while it boots, instead of waiting out its limit. The functions run from
the scripts' own files in a bash of their own, on real processes named as lab nodes 6, 7 and 8,
one per test (the lab has 1-3, so a running lab is never touched): a process named beam.smp run
by the rabbitmq user with the node's name in its environment is what rabbit_down looks for, and
an Erlang VM registered with epmd under the node's name is what rabbit_await waits on."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

HA = Path(__file__).resolve().parents[2] / "deploy" / "local" / "ha"


LAB_SOURCES = ("../common.sh", "lib.sh", "rabbit.sh", "haproxy.sh", "pg.sh")
"""What lab.sh sources, in its order: a later file that replaced a function of rabbit.sh's (as
haproxy.sh's `alive` once did) replaces it here too."""


def lab_script(call: str) -> str:
    """A bash script that runs `call` with the lab's files sourced as lab.sh sources them, under
    its shell options."""
    sources = "; ".join(f'source "{HA}/{name}"' for name in LAB_SOURCES)
    return f"set -eEuo pipefail; SCRIPT=ha-lab; {sources}; {call}"


def lab_function(call: str, *, timeout: float = 90, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `call` (see lab_script) to its end."""
    return subprocess.run(
        ["bash", "-c", lab_script(call)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **env},
    )


def beam_pids(node_name: str) -> list[int]:
    """Pids of the rabbitmq user's beam.smp processes whose environment names the node."""
    found = subprocess.run(
        ["pgrep", "-u", "rabbitmq", "-x", "beam.smp"], capture_output=True, text=True
    )
    pids = []
    for word in found.stdout.split():
        try:
            environ = Path(f"/proc/{word}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RABBITMQ_NODENAME={node_name}".encode() in environ:
            pids.append(int(word))
    return pids


@pytest.fixture
def fake_beam() -> Iterator[Path]:
    """A copy of sleep named beam.smp, in a directory the rabbitmq user may read."""
    where = Path(tempfile.mkdtemp(prefix="pkgq-fake-beam-", dir="/var/tmp"))
    try:
        where.chmod(0o755)
        beam = where / "beam.smp"
        shutil.copy("/bin/sleep", beam)
        beam.chmod(0o755)
        yield beam
    finally:
        shutil.rmtree(where, ignore_errors=True)


def start_node_process(beam: Path, node_name: str, *, ignore_term: bool) -> subprocess.Popen[str]:
    """A process that rabbit_pids takes for the node's VM; with `ignore_term`, SIGTERM is
    ignored (the disposition survives exec), as by a VM stuck in its shutdown."""
    trap = "trap '' TERM; " if ignore_term else ""
    proc = subprocess.Popen(
        [
            "runuser", "-u", "rabbitmq", "--", "env", "-i", f"RABBITMQ_NODENAME={node_name}",
            "bash", "-c", f"{trap}exec {beam} 600",
        ],
        text=True,
    )  # fmt: skip
    for _ in range(100):
        if beam_pids(node_name):
            return proc
        time.sleep(0.05)
    stop_node_process(proc, beam)
    raise AssertionError(f"the fake {node_name} did not start")


def stop_node_process(proc: subprocess.Popen[str], beam: Path) -> None:
    """Kill whatever the test left of its fake node: the beam.smp copy (runuser does not pass
    SIGKILL on) and runuser itself."""
    subprocess.run(["pkill", "-KILL", "-f", f"^{beam} "], check=False)
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def gone(pid: int) -> bool:
    """Whether the process has exited (a zombie has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return True
    return state == "Z"


def test_rabbit_down_sigkills_a_node_that_is_still_running_after_the_grace(
    fake_beam: Path,
) -> None:
    proc = start_node_process(fake_beam, "pkgqha7@localhost", ignore_term=True)
    try:
        (pid,) = beam_pids("pkgqha7@localhost")
        done = lab_function("RABBIT_NODES=(7); rabbit_down", PKGQ_HA_STOP_GRACE="1")
        assert done.returncode == 0, done.stderr
        assert "stopping pkgqha7@localhost" in done.stderr
        assert f"SIGKILL to what is left of the lab's nodes (pids {pid}, 1 s after SIGTERM)" in (
            done.stderr
        )
        assert "outlived SIGKILL" not in done.stderr
        assert gone(pid)
        assert proc.wait(timeout=10) != 0  # runuser reports its child's death by SIGKILL
    finally:
        stop_node_process(proc, fake_beam)


def test_rabbit_down_stops_a_node_that_obeys_sigterm_without_sigkill(fake_beam: Path) -> None:
    proc = start_node_process(fake_beam, "pkgqha6@localhost", ignore_term=False)
    try:
        (pid,) = beam_pids("pkgqha6@localhost")
        done = lab_function("RABBIT_NODES=(6); rabbit_down", PKGQ_HA_STOP_GRACE="30")
        assert done.returncode == 0, done.stderr
        assert "stopping pkgqha6@localhost" in done.stderr
        assert "SIGKILL" not in done.stderr
        assert gone(pid)
    finally:
        stop_node_process(proc, fake_beam)


def test_rabbit_await_gives_up_when_the_node_exits_while_booting_not_at_its_time_limit(
    tmp_path: Path,
) -> None:
    # An Erlang VM registered with epmd as pkgqha8, whose management API never answers: a node
    # still booting. It exits once rabbit_await has begun to wait for its boot (the test closes
    # its stdin when the wrapped check first runs), as a node whose boot fails. The wait must
    # end there, with that reason, not at its limit with the limit's message.
    vm = subprocess.Popen(
        [
            "erl", "-noshell", "-sname", "pkgqha8@localhost", "-setcookie", "pkgq-lab-test",
            "-kernel", "inet_dist_use_interface", "{127,0,0,1}",
            "-eval", 'io:get_line(""), halt().',
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "ERL_EPMD_ADDRESS": "127.0.0.1"},  # as the lab's nodes
    )  # fmt: skip
    waiting = tmp_path / "waiting-for-boot"
    awaiting = subprocess.Popen(
        [
            "bash",
            "-c",
            lab_script(
                'eval "original_$(declare -f rabbit_booted_or_gone)"; rabbit_booted_or_gone() '
                f'{{ : >"{waiting}"; original_rabbit_booted_or_gone "$@"; }}; '
                "rabbit_await 8 60"
            ),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        for _ in range(600):
            if waiting.exists() or awaiting.poll() is not None:
                break
            time.sleep(0.1)
        assert waiting.exists(), "rabbit_await never began to wait for the boot"
        assert vm.stdin is not None
        vm.stdin.close()  # the node exits
        assert vm.wait(timeout=30) == 0
        _, stderr = awaiting.communicate(timeout=120)
        assert awaiting.returncode == 1, stderr
        assert "pkgqha8@localhost exited while booting" in stderr
        assert "did not finish booting" not in stderr
    finally:
        for proc in (vm, awaiting):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
