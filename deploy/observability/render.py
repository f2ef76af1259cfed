#!/usr/bin/env python3
"""Render the dashboard without Grafana: a real Prometheus scrapes a short `pkgq bench` and a
fault phase, then every panel's PromQL is asked over the run through Prometheus' HTTP API, and
printed.

    deploy/observability/render.py                     # a small bench (about 2 minutes)
    deploy/observability/render.py -- --users 400      # any `pkgq bench` options after --

Prometheus is Debian's (`prometheus`, installed by deploy/local/ensure-tools.sh when missing),
run on a free loopback port with a throwaway data directory and pkgq's alert rules loaded; the
bench's relay and consumer processes serve /metrics on ports it is given
(PKGQ_BENCH_STATUS_PORT, devtools/bench/support.py). Grafana's `$__rate_interval` becomes
RATE_INTERVAL. The bench only shows healthy traffic, so a fault phase follows: a `pkgq run` of
every route (with the dead-letter ingester) in the bench's namespace, fed with Debian's
amqp-publish: commands without a message_id (dead letters), commands on a partition key that
does not exist (`unroutable` dead letters) and cancels of items that do not exist (buried, their
users held). For each panel: its title, each query, and per series its labels, the number of
samples, min, max and last value. Then the alerts that fired during the run. Nothing is
written into the repository.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SCRAPE_INTERVAL_S = 1
RATE_INTERVAL = "15s"
FAULT_ROUNDS = 6
FAULT_EVERY_S = 12
NAMESPACE = "render"
SMALL_BENCH = [
    "--users", "150", "--packages", "2", "--small-rows", "0", "--large-rows", "1000",
    "--raw-messages", "1000", "--repeat", "1", "--backlog-users", "100",
    "--backlog-records", "2000", "--namespace", NAMESPACE,
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def free_ports(count: int) -> int:
    """A base port B with B .. B + count - 1 all free now."""
    for _ in range(100):
        base = free_port()
        if base + count > 65535:
            continue
        try:
            for port in range(base, base + count):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise SystemExit("render: no run of free ports found")


def api(prometheus: str, path: str, **params: str) -> Any:
    url = f"{prometheus}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310  (loopback)
        answer = json.loads(response.read())
    if answer.get("status") != "success":
        raise RuntimeError(f"{path}: {answer}")
    return answer["data"]


def wait_ready(prometheus: str, process: subprocess.Popen[bytes], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit("render: prometheus exited at start; see its log above")
        try:
            with urllib.request.urlopen(f"{prometheus}/-/ready", timeout=2):  # noqa: S310
                return
        except OSError:
            time.sleep(0.3)
    raise SystemExit(f"render: prometheus not ready within {seconds} s")


def summary(values: list[list[Any]]) -> str:
    numbers = [float(v) for _, v in values if not math.isnan(float(v))]
    if not numbers:
        return "no numeric samples"
    return (
        f"{len(numbers)} samples, min {numbers[0] if len(numbers) == 1 else min(numbers):.4g}, "
        f"max {max(numbers):.4g}, last {numbers[-1]:.4g}"
    )


def labels(metric: dict[str, str]) -> str:
    shown = {k: v for k, v in metric.items() if k not in {"job"}}
    return "{" + ", ".join(f"{k}={v}" for k, v in sorted(shown.items())) + "}" if shown else "{}"


def _get(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as response:
            return int(response.status)
    except OSError:
        return 0


def with_database(dsn: str, name: str) -> str:
    """The DSN with database `name` in its path, its hosts and parameters kept: several hosts
    (`h1:5432,h2:5432`), `?target_session_attrs=read-write`, a `host=/socket/dir` parameter."""
    base, mark, query = dsn.partition("?")
    scheme, sep, rest = base.partition("://")
    if not sep:
        return f"{dsn.rsplit('/', 1)[0]}/{name}"
    authority = rest.split("/", 1)[0]
    return f"{scheme}{sep}{authority}/{urllib.parse.quote(name)}{mark}{query}"


def fault_phase(pkgq: str, port: int, namespace: str) -> None:
    """Dead letters, unroutable commands and held users, published by amqp-publish to a
    `pkgq run` serving /metrics on `port`."""
    runtime = os.environ.get("PKGQ_POSTGRES_DSN", "postgresql://pkgq_runtime@127.0.0.1:5432/pkgq")
    amqp = os.environ.get("PKGQ_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
    exchange = f"{namespace}.telecom"
    env = {
        **os.environ,
        "PKGQ_POSTGRES_DSN": with_database(runtime, f"pkgq_{namespace}"),
        "PKGQ_EXCHANGE": exchange,
        "PKGQ_QUEUE_PREFIX": f"{namespace}.pkgq",
        "PKGQ_HTTP_PORT": str(port),
        "PKGQ_HTTP_HOST": "127.0.0.1",
        "PKGQ_METRICS_REFRESH_INTERVAL": "1",
        "PKGQ_LOG_LEVEL": "warning",
    }
    run = subprocess.Popen([pkgq, "run"], env=env)  # noqa: S603  (this checkout's pkgq)
    try:
        deadline = time.monotonic() + 60
        while _get(port, "/readyz") != 200:
            if run.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("render: the fault phase's `pkgq run` did not become ready")
            time.sleep(0.5)
        url = amqp.rstrip("/") if urllib.parse.urlsplit(amqp).path == "/" else amqp
        publisher = shutil.which("amqp-publish")
        if publisher is None:
            raise SystemExit("render: amqp-publish is missing: run deploy/local/ensure-tools.sh")

        def publish(key: str, body: str, *headers: str) -> None:
            flags = [f"--header={h}" for h in ("x-schema-version: 1", *headers)]
            subprocess.run(  # noqa: S603  (Debian's amqp-publish, our own arguments)
                [
                    publisher, f"--url={url}", f"--exchange={exchange}",
                    f"--routing-key={key}", "--content-type=application/json",
                    "--persistent", *flags, f"--body={body}",
                ],
                check=True,
            )  # fmt: skip

        for round_ in range(FAULT_ROUNDS):
            for _ in range(round_ + 1):
                user = str(uuid.uuid4())
                usage = json.dumps({"user_id": user, "upload": 1, "download": 1})
                publish("telecom.usage_record", usage)  # no message_id: a dead letter
                publish(
                    "telecom.usage_record.p9",  # no such partition: unroutable
                    usage,
                    f"x-message-id: {uuid.uuid4()}",
                    "x-message-type: RecordUsage",
                )
            cancel = {"user_id": str(uuid.uuid4()), "item_id": 2**62 + round_}
            publish(  # no such item: buried, and its user held behind it
                "telecom.package_cancel",
                json.dumps(cancel),
                f"x-message-id: {uuid.uuid4()}",
                "x-message-type: CancelPackage",
            )
            time.sleep(FAULT_EVERY_S)
    finally:
        run.terminate()
        run.wait(timeout=60)


def render(prometheus: str, start: float, end: float) -> int:
    dashboard = json.loads((HERE / "pkgq-dashboard.json").read_text())
    step = str(max(SCRAPE_INTERVAL_S, math.ceil((end - start) / 300)))
    empty = 0
    for panel in dashboard["panels"]:
        print(f"\n== {panel['title']}")
        for target in panel["targets"]:
            query = target["expr"].replace("$__rate_interval", RATE_INTERVAL)
            print(f"   {query}")
            found = api(
                prometheus,
                "/api/v1/query_range",
                query=query,
                start=f"{start:.3f}",
                end=f"{end:.3f}",
                step=step,
            )["result"]
            if not found:
                empty += 1
                print("     (no series during the run)")
            for series in found[:12]:
                print(f"     {labels(series['metric'])}: {summary(series['values'])}")
            if len(found) > 12:
                print(f"     ... and {len(found) - 12} more series")
    fired = api(
        prometheus,
        "/api/v1/query_range",
        query='ALERTS{alertstate="firing"}',
        start=f"{start:.3f}",
        end=f"{end:.3f}",
        step=step,
    )["result"]
    print("\n== Alerts that fired during the run")
    for series in fired:
        print(f"   {labels(series['metric'])}")
    if not fired:
        print("   none")
    return empty


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pkgq", default=str(REPO / ".venv" / "bin" / "pkgq"))
    parser.add_argument("bench_args", nargs="*", help="`pkgq bench` options (after --)")
    options = parser.parse_args()
    subprocess.run([str(REPO / "deploy" / "local" / "ensure-tools.sh")], check=True)  # noqa: S603
    prometheus_bin = shutil.which("prometheus")
    if prometheus_bin is None:
        raise SystemExit("render: prometheus is missing: run deploy/local/ensure-tools.sh")
    bench_args = options.bench_args or SMALL_BENCH
    replicas = 1
    if "--replicas" in bench_args:
        replicas = int(bench_args[bench_args.index("--replicas") + 1])
    base = free_ports(2 + replicas)  # the relay, the replicas, the fault phase's pkgq run
    port = free_port()
    prometheus = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="pkgq-render-") as work:
        targets = [f"127.0.0.1:{p}" for p in range(base, base + 2 + replicas)]
        config = Path(work) / "prometheus.yml"
        config.write_text(
            json.dumps(  # JSON is YAML
                {
                    "global": {
                        "scrape_interval": f"{SCRAPE_INTERVAL_S}s",
                        "evaluation_interval": f"{SCRAPE_INTERVAL_S}s",
                    },
                    "rule_files": [str(HERE / "pkgq-alerts.rules.yml")],
                    "scrape_configs": [
                        {"job_name": "pkgq", "static_configs": [{"targets": targets}]}
                    ],
                }
            )
        )
        server = subprocess.Popen(  # noqa: S603  (Debian's prometheus, our own arguments)
            [
                prometheus_bin,
                f"--config.file={config}",
                f"--storage.tsdb.path={work}/data",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
        )
        try:
            wait_ready(prometheus, server)
            print(f"render: prometheus on {prometheus}, scraping {', '.join(targets)}")
            env = {
                **os.environ,
                "PKGQ_BENCH_STATUS_PORT": str(base),
                "PKGQ_METRICS_REFRESH_INTERVAL": "1",
            }
            start = time.time()
            bench = subprocess.run(  # noqa: S603  (this checkout's pkgq)
                [options.pkgq, "bench", *bench_args], env=env, check=False
            )
            if bench.returncode != 0:
                print(f"render: pkgq bench exited {bench.returncode}", file=sys.stderr)
            bench_end = time.time()
            namespace = NAMESPACE
            if "--namespace" in bench_args:
                namespace = bench_args[bench_args.index("--namespace") + 1]
            fault_phase(options.pkgq, base + 1 + replicas, namespace)
            time.sleep(2 * SCRAPE_INTERVAL_S)
            end = time.time()
            print(
                f"\nrender: the bench ran {bench_end - start:.0f} s, the fault phase "
                f"{end - bench_end:.0f} s; each panel over the whole window"
            )
            empty = render(prometheus, start, end)
            print(f"\nrender: {empty} queries had no series during the run")
            return 1 if bench.returncode != 0 else 0
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
