"""pkgq's processes behind network faults a test controls: a network namespace of the test's
own, joined to the host by a veth pair, with a forwarder (tests/support/netproxy.py) on the
host's end that passes PostgreSQL's and RabbitMQ's ports on to the machine's services.

Faults: iptables DROP rules inside the namespace (packets vanish, nothing answers, no RST), a
delay held by the forwarder (this kernel has no netem) with iptables' random drops for loss,
and the forwarder killed (every connection reset) and started again. The development services
themselves are never touched, so tests using this run beside the others. Needs root, iproute2
and iptables (deploy/local/ensure-tools.sh).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

POSTGRES_PORT = 5432
AMQP_PORT = 5672


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def _moved(url: str, host: str) -> str:
    """`url` with its host replaced (the port kept)."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    port = parts.port
    where = f"{host}:{port}" if port else host
    netloc[-1] = where
    return urlunsplit(parts._replace(netloc="@".join(netloc)))


class NetLab:
    """One namespace, its veth pair and its forwarder. Use as a context manager."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}{random.randrange(100):02d}"
        self.namespace = f"pkgqnf{tag}"
        self._host_if = f"nfh{tag}"
        self._ns_if = f"nfn{tag}"
        block = random.randrange(1 << 14)
        base = f"10.{232 + (block >> 12)}.{(block >> 4) & 0xFF}"
        last = (block & 0xF) * 16
        self.host_ip = f"{base}.{last + 1}"
        self.ns_ip = f"{base}.{last + 2}"
        self._dir = tempfile.TemporaryDirectory(prefix="pkgq-netlab-")
        self.python = str(Path(self._dir.name) / "python")
        self._proxy: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> NetLab:
        ns, host_if, ns_if = self.namespace, self._host_if, self._ns_if
        _run("ip", "netns", "add", ns)
        try:
            _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
            _run("ip", "link", "set", ns_if, "netns", ns)
            _run("ip", "addr", "add", f"{self.host_ip}/28", "dev", host_if)
            _run("ip", "link", "set", host_if, "up")
            self.in_namespace("ip", "addr", "add", f"{self.ns_ip}/28", "dev", ns_if)
            self.in_namespace("ip", "link", "set", ns_if, "up")
            self.in_namespace("ip", "link", "set", "lo", "up")
            Path(self.python).write_text(
                f'#!/bin/sh\nexec ip netns exec {ns} {sys.executable} "$@"\n'
            )
            os.chmod(self.python, stat.S_IRWXU)
            self.start_proxy()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.kill_proxy()
        with contextlib.suppress(subprocess.CalledProcessError):
            _run("ip", "link", "del", self._host_if)
        with contextlib.suppress(subprocess.CalledProcessError):
            _run("ip", "netns", "del", self.namespace)
        self._dir.cleanup()

    def in_namespace(self, *cmd: str) -> None:
        _run("ip", "netns", "exec", self.namespace, *cmd)

    def env(self, postgres_dsn: str, amqp_url: str) -> dict[str, str]:
        """The PKGQ_* settings of a process in the namespace: the services through the veth."""
        return {
            "PKGQ_POSTGRES_DSN": _moved(postgres_dsn, self.host_ip),
            "PKGQ_AMQP_URL": _moved(amqp_url, self.host_ip),
        }

    # The forwarder.

    def start_proxy(self) -> None:
        routes = [f"{p}:127.0.0.1:{p}" for p in (POSTGRES_PORT, AMQP_PORT)]
        self._proxy = subprocess.Popen(
            [sys.executable, "-m", "tests.support.netproxy", self.host_ip, *routes],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert self._proxy.stdout is not None
        line = self._proxy.stdout.readline()  # "listening" once every port is bound
        assert line.strip() == b"listening", line

    def kill_proxy(self) -> None:
        """SIGKILL: the kernel resets every connection it forwarded."""
        if self._proxy is not None and self._proxy.poll() is None:
            self._proxy.kill()
            self._proxy.wait(timeout=10)
        self._proxy = None

    def delay(self, on: bool) -> None:
        assert self._proxy is not None
        self._proxy.send_signal(signal.SIGUSR1 if on else signal.SIGUSR2)

    # iptables rules inside the namespace.

    def drop(self, *rules: list[str]) -> list[list[str]]:
        """Append DROP rules (each the match part, e.g. ["INPUT", "-p", "tcp", ...])."""
        for rule in rules:
            self.in_namespace("iptables", "-A", *rule, "-j", "DROP")
        return list(rules)

    def undrop(self, rules: list[list[str]]) -> None:
        for rule in rules:
            self.in_namespace("iptables", "-D", *rule, "-j", "DROP")

    def blackhole_rules(self, port: int) -> list[list[str]]:
        """Packets to and from one service dropped both ways."""
        return [
            ["OUTPUT", "-p", "tcp", "-d", self.host_ip, "--dport", str(port)],
            ["INPUT", "-p", "tcp", "-s", self.host_ip, "--sport", str(port)],
        ]

    def one_way_rules(self) -> list[list[str]]:
        """Everything from the host to the namespace dropped; the other way passes."""
        return [["INPUT", "-s", self.host_ip]]

    def loss_rules(self, probability: float) -> list[list[str]]:
        return [
            [
                "INPUT",
                "-s",
                self.host_ip,
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                str(probability),
            ],
            [
                "OUTPUT",
                "-d",
                self.host_ip,
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                str(probability),
            ],
        ]


@contextlib.contextmanager
def netlab() -> Iterator[NetLab]:
    with NetLab() as lab:
        yield lab
