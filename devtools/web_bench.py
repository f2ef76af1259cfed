"""`pkgq web bench` (`make bench-web`): the read API under a real HTTP load tool.

A real `pkgq web` process (uvicorn, the app's long-lived pool) serves, in one run, wrk's load on
GET /api/v1/users/{id}/current (one statement per request, over users with a realistic queue)
and on /api/v1/baseline: the same stack (auth, pool, JSON) around a bare one-row SELECT. The
figures that matter are the ratios of the two, measured back to back on the same machine."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID, uuid4

import asyncpg

from consumers.web.auth import new_token
from devtools.bench.support import bench_settings, spawn, stop_processes
from infra.postgres import catalog, web_bench_data
from infra.postgres.migrate import ensure_database, migrate
from infra.settings import Settings

LIMIT = 10 * 2**30
_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


@dataclass(frozen=True, slots=True)
class WrkResult:
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    requests: int
    errors: int
    """Non-2xx answers and socket errors: any makes the run invalid."""


def parse_wrk(output: str) -> WrkResult:
    """wrk --latency's report: requests/s, the 50th and 99th percentiles, errors."""

    def latency(percent: str) -> float:
        match = re.search(rf"^\s*{percent}%\s+([\d.]+)(us|ms|s|m)\s*$", output, re.MULTILINE)
        if match is None:
            raise ValueError(f"no {percent}% latency in wrk's output:\n{output}")
        return float(match.group(1)) * _UNITS[match.group(2)]

    rate = re.search(r"^Requests/sec:\s+([\d.]+)", output, re.MULTILINE)
    total = re.search(r"^\s*(\d+) requests in", output, re.MULTILINE)
    if rate is None or total is None:
        raise ValueError(f"no Requests/sec in wrk's output:\n{output}")
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    sockets = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output
    )
    errors = int(non_2xx.group(1)) if non_2xx else 0
    if sockets:
        errors += sum(int(g) for g in sockets.groups())
    return WrkResult(
        float(rate.group(1)), latency("50"), latency("99"), int(total.group(1)), errors
    )


def lua_script(paths: list[str], token: str) -> str:
    """wrk's request generator: the paths in turn (each thread its own copy), with the token."""
    listed = ",\n".join(json.dumps(p) for p in paths)
    return f"""
local paths = {{
{listed}
}}
local n = #paths
local i = math.random(n)
local headers = {{ ["Authorization"] = "Bearer {token}" }}
request = function()
  i = i % n + 1
  return wrk.format("GET", paths[i], headers)
end
"""


async def _prepare(settings: Settings, users: list[UUID]) -> None:
    await ensure_database(settings.owner_dsn())
    conn = await asyncpg.connect(settings.owner_dsn())
    try:
        await migrate(conn, runtime_role=settings.grantee())
        package = await catalog.add_package(conn, "bench-web", LIMIT, None)
        await web_bench_data.reset_and_seed(conn, users, package.id, LIMIT)
    finally:
        await conn.close()


async def _ready(port: int, process: subprocess.Popen[bytes], within: float = 60) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"pkgq web exited with status {process.returncode}")
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /readyz HTTP/1.0\r\nHost: bench\r\n\r\n")
            await writer.drain()
            head = await reader.read()
            writer.close()
            if head.startswith(b"HTTP/1.1 200") or head.startswith(b"HTTP/1.0 200"):
                return
        except OSError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"pkgq web was not ready on port {port} within {within} s")


def _wrk(url: str, script: Path, seconds: int, connections: int, threads: int) -> WrkResult:
    done = subprocess.run(  # noqa: S603  (wrk from the system, our own arguments)
        [
            shutil.which("wrk") or "wrk",
            f"-t{threads}",
            f"-c{connections}",
            f"-d{seconds}s",
            "--latency",
            "-s",
            str(script),
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 60,
    )
    return parse_wrk(done.stdout)


async def run_web_bench(
    base: Settings,
    *,
    users: int,
    seconds: int,
    connections: int,
    threads: int,
    port: int,
    rounds: int,
    say: Callable[[str], None],
) -> int:
    if shutil.which("wrk") is None:
        say("wrk is missing: run deploy/local/ensure-tools.sh (apt-get install wrk)")
        return 2
    settings = bench_settings(base, "bench_web")
    ids = [uuid4() for _ in range(users)]
    say(f"seeding {users} users (5 items each) in {settings.postgres_dsn.rsplit('/', 1)[-1]}")
    await _prepare(settings, ids)
    token, digest = new_token()
    env = {
        **settings.child_env(),
        "PKGQ_WEB_SECRET": uuid4().hex + uuid4().hex,
        "PKGQ_WEB_TOKENS": json.dumps({"bench": {"role": "viewer", "sha256": digest}}),
        "PKGQ_WEB_PORT": str(port),
        "PKGQ_LOG_LEVEL": "warning",
    }
    process = spawn(["web", "--baseline-endpoint"], {**os.environ, **env})
    try:
        await _ready(port, process)
        sample = random.sample(ids, min(len(ids), 2000))
        base_url = f"http://127.0.0.1:{port}"
        results: dict[str, WrkResult] = {}
        errors: dict[str, int] = {}
        with tempfile.TemporaryDirectory(prefix="pkgq-bench-web-") as work:
            scripts = {}
            for name, paths in (
                ("baseline", ["/api/v1/baseline"]),
                ("current", [f"/api/v1/users/{u}/current" for u in sample]),
            ):
                scripts[name] = Path(work) / f"{name}.lua"
                scripts[name].write_text(lua_script(paths, token))
                await asyncio.to_thread(_wrk, base_url, scripts[name], 3, connections, threads)
            # Alternate the two, round after round, and keep each one's best: on a shared
            # machine the load drifts, and back-to-back rounds see the same drift.
            for round_no in range(1, rounds + 1):
                for name in ("baseline", "current"):
                    say(
                        f"round {round_no}/{rounds}, {name}: {seconds} s of wrk "
                        f"-t{threads} -c{connections}"
                    )
                    r = await asyncio.to_thread(
                        _wrk, base_url, scripts[name], seconds, connections, threads
                    )
                    say(
                        f"  {r.requests_per_s:.0f} req/s, p50 {r.p50_ms:.2f} ms, "
                        f"p99 {r.p99_ms:.2f} ms"
                    )
                    errors[name] = errors.get(name, 0) + r.errors
                    best = results.get(name)
                    if best is None or r.requests_per_s > best.requests_per_s:
                        results[name] = r
    finally:
        stop_processes([process])
    bad = {n: count for n, count in errors.items() if count}
    if bad:
        say(f"errors during the load (non-2xx or socket errors): {bad}")
        return 1
    current, baseline = results["current"], results["baseline"]
    for key, value in (
        ("users", users),
        ("seconds", seconds),
        ("connections", connections),
        ("rounds", rounds),
        ("current_rps", round(current.requests_per_s, 1)),
        ("current_p50_ms", round(current.p50_ms, 3)),
        ("current_p99_ms", round(current.p99_ms, 3)),
        ("baseline_rps", round(baseline.requests_per_s, 1)),
        ("baseline_p50_ms", round(baseline.p50_ms, 3)),
        ("baseline_p99_ms", round(baseline.p99_ms, 3)),
        ("rps_ratio_vs_select_one", round(current.requests_per_s / baseline.requests_per_s, 3)),
        ("p99_ratio_vs_select_one", round(current.p99_ms / baseline.p99_ms, 3)),
    ):
        print(f"{key}={value}")
    return 0
