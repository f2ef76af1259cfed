"""The HA lab's node scripts (deploy/local/ha/rabbit.sh) on the paths a healthy lab never takes:
`rabbit_down` SIGKILLs a node that outlives its SIGTERM, and `rabbit_await` gives up on a node
whose Erlang VM exits while it boots, instead of waiting out its limit. The functions run from
the scripts' own files in a bash of their own, on real processes named as lab nodes 6, 7 and 8,
one per test (the lab has 1-3, so a running lab is never touched): a process named beam.smp run
by the rabbitmq user with the node's name in its environment is what rabbit_down looks for, and
an Erlang VM registered with epmd under the node's name is what rabbit_await waits on."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.observing import eventually

HA = Path(__file__).resolve().parents[2] / "deploy" / "local" / "ha"

LAB_SOURCES = ("../common.sh", "lib.sh", "rabbit.sh", "haproxy.sh", "pg.sh")
"""What lab.sh sources, in its order: a later file that replaced a function of rabbit.sh's (as
haproxy.sh's `alive` once did) replaces it here too."""


def lab_script(call: str) -> str:
    """A bash script that runs `call` with the lab's files sourced as lab.sh sources them, under
    its shell options."""
    sources = "; ".join(f'source "{HA}/{name}"' for name in LAB_SOURCES)
    return f"set -eEuo pipefail; SCRIPT=ha-lab; {sources}; {call}"


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


async def lab_function(call: str, **env: str) -> Ran:
    """Run `call` (see lab_script) to its end (killed if the caller stops waiting)."""
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        lab_script(call),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **env},
    )
    try:
        out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(), err.decode())


async def node_pids(n: int) -> list[int]:
    """The pids that the script's own rabbit_pids takes for node N's VM."""
    async with asyncio.timeout(30):
        done = await lab_function(f"rabbit_pids {n}")
    assert done.returncode == 0, done.stderr
    return [int(word) for word in done.stdout.split()]


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


@asynccontextmanager
async def fake_node(
    beam: Path, n: int, *, ignore_term: bool
) -> AsyncIterator[tuple[asyncio.subprocess.Process, int]]:
    """A process that rabbit_pids takes for node N's VM, run by the rabbitmq user, and its
    pid once rabbit_pids finds it; with `ignore_term`, SIGTERM is ignored (the disposition
    survives exec), as by a VM stuck in its shutdown. Whatever is left of it is killed on the
    way out: the beam.smp copy (runuser does not pass SIGKILL on) and runuser itself."""
    trap = "trap '' TERM; " if ignore_term else ""
    name = f"pkgqha{n}@localhost"
    runuser = await asyncio.create_subprocess_exec(
        "runuser", "-u", "rabbitmq", "--", "env", "-i", f"RABBITMQ_NODENAME={name}",
        "bash", "-c", f"{trap}exec {beam} 600",
    )  # fmt: skip
    try:

        async def found() -> bool:
            return bool(await node_pids(n))

        found.__qualname__ = f"the fake {name} started"
        await eventually(found, within=10)
        (pid,) = await node_pids(n)
        yield runuser, pid
    finally:
        killing = await asyncio.create_subprocess_exec("pkill", "-KILL", "-f", f"^{beam} ")
        await killing.wait()
        if runuser.returncode is None:
            runuser.kill()
        await asyncio.wait_for(runuser.wait(), 10)


async def rabbit_down(n: int, grace: int) -> Ran:
    """rabbit_down of node N alone, with a grace of `grace` seconds before SIGKILL; it must
    end well and say that it stops the node."""
    async with asyncio.timeout(90):
        done = await lab_function(f"RABBIT_NODES=({n}); rabbit_down", PKGQ_HA_STOP_GRACE=str(grace))
    assert done.returncode == 0, done.stderr
    assert f"stopping pkgqha{n}@localhost" in done.stderr
    return done


def gone(pid: int) -> bool:
    """Whether the process has exited (a zombie has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return True
    return state == "Z"


async def test_rabbit_down_sigkills_a_node_that_is_still_running_after_the_grace(
    fake_beam: Path,
) -> None:
    async with fake_node(fake_beam, 7, ignore_term=True) as (runuser, pid):
        done = await rabbit_down(7, grace=1)
        assert f"SIGKILL to what is left of the lab's nodes (pids {pid}, 1 s after SIGTERM)" in (
            done.stderr
        )
        assert "outlived SIGKILL" not in done.stderr
        assert gone(pid)
        # runuser reports its child's death by SIGKILL
        assert await asyncio.wait_for(runuser.wait(), 10) != 0


async def test_rabbit_down_stops_a_node_that_obeys_sigterm_without_sigkill(
    fake_beam: Path,
) -> None:
    async with fake_node(fake_beam, 6, ignore_term=False) as (_, pid):
        done = await rabbit_down(6, grace=30)
        assert "SIGKILL" not in done.stderr
        assert gone(pid)


async def test_rabbit_await_gives_up_when_the_node_exits_while_booting_not_at_its_time_limit(
    tmp_path: Path,
) -> None:
    # An Erlang VM registered with epmd as pkgqha8, whose management API never answers: a node
    # still booting. It exits once rabbit_await has begun to wait for its boot (the test closes
    # its stdin when the wrapped check first runs), as a node whose boot fails. The wait must
    # end there, with that reason, not at its limit with the limit's message.
    vm = await asyncio.create_subprocess_exec(
        "erl", "-noshell", "-sname", "pkgqha8@localhost", "-setcookie", "pkgq-lab-test",
        "-kernel", "inet_dist_use_interface", "{127,0,0,1}",
        "-eval", 'io:get_line(""), halt().',
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "ERL_EPMD_ADDRESS": "127.0.0.1"},  # as the lab's nodes
    )  # fmt: skip
    waiting = tmp_path / "waiting-for-boot"
    awaiting = asyncio.ensure_future(
        lab_function(
            'eval "original_$(declare -f rabbit_booted_or_gone)"; rabbit_booted_or_gone() '
            f'{{ : >"{waiting}"; original_rabbit_booted_or_gone "$@"; }}; '
            "rabbit_await 8 60",
        )
    )
    try:

        async def began_or_ended() -> bool:
            return waiting.exists() or awaiting.done()

        await eventually(began_or_ended, within=60)
        assert waiting.exists(), "rabbit_await never began to wait for the boot"
        assert vm.stdin is not None
        vm.stdin.close()  # the node exits
        assert await asyncio.wait_for(vm.wait(), 30) == 0
        done = await asyncio.wait_for(awaiting, 120)
        assert done.returncode == 1, done.stderr
        assert "pkgqha8@localhost exited while booting" in done.stderr
        assert "did not finish booting" not in done.stderr
    finally:
        awaiting.cancel()
        if vm.returncode is None:
            vm.kill()
            await vm.wait()
