"""`pkgq web bench` (`make bench-web`): the read API under a real HTTP load tool.

A process serving what `pkgq web` serves, as it serves it (uvicorn, the app's long-lived pool),
with one route added (devtools/web_bench_app.py), takes, in one run, wrk's load on
GET /api/v1/users/{id}/current (one statement per request, over users with a realistic queue)
and on /api/v1/baseline: the same stack (auth, pool, JSON) around a bare one-row SELECT. The
figures that matter are the ratios of the two, measured back to back on the same machine.
The console's overview (`/`) and a user's timeline (`/users/{id}/timeline`, over users with a
history: by default 10,000 users and 1,000,000 outbox rows) are loaded the same way, signed in
as a viewer; each is judged by its p99 against TARGET_P99_MS."""

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
import httpx

from consumers.web.auth import hash_password, new_token
from devtools.bench.support import bench_settings, spawn, stop_processes
from devtools.postgres import web_bench_data
from infra.postgres import catalog
from infra.postgres.migrate import ensure_database, migrate
from infra.settings import Settings

LIMIT = 10 * 2**30
TARGET_P99_MS = 200.0
"""What a console page must answer within at the 99th percentile."""
CONSOLE_USER = "bench"
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


def lua_script(paths: list[str], token: str, cookie: str | None = None) -> str:
    """wrk's request generator: the paths in turn (each thread its own copy), with the token
    (or, for console pages, the signed-in session's cookie)."""
    listed = ",\n".join(json.dumps(p) for p in paths)
    header = (
        f'["Cookie"] = {json.dumps(cookie)}'
        if cookie is not None
        else f'["Authorization"] = "Bearer {token}"'
    )
    return f"""
local paths = {{
{listed}
}}
local n = #paths
local i = math.random(n)
local headers = {{ {header} }}
request = function()
  i = i % n + 1
  return wrk.format("GET", paths[i], headers)
end
"""


async def _prepare(
    settings: Settings, users: list[UUID], history: list[UUID], outbox_rows: int
) -> None:
    await ensure_database(settings.owner_dsn())
    conn = await asyncpg.connect(settings.owner_dsn())
    try:
        await migrate(conn, runtime_role=settings.grantee())
        package = await catalog.add_package(conn, "bench-web", LIMIT, None)
        await web_bench_data.reset_and_seed(conn, users, package.id, LIMIT)
        await web_bench_data.seed_history(conn, history, outbox_rows)
    finally:
        await conn.close()


def _session_cookie(base_url: str, password: str) -> str:
    """Sign in to the console as CONSOLE_USER (the login form with its CSRF token) and return
    the session cookie as a Cookie header's value."""
    with httpx.Client(base_url=base_url, timeout=30) as client:
        form = client.get("/login").text
        found = re.search(r'name="csrf" value="([^"]+)"', form)
        if found is None:
            raise RuntimeError("no CSRF token on the console's login form")
        signed_in = client.post(
            "/login",
            data={"csrf": found.group(1), "user": CONSOLE_USER, "password": password, "next": "/"},
        )
        if signed_in.status_code != 303:
            raise RuntimeError(f"signing in to the console answered {signed_in.status_code}")
        return "; ".join(f"{k}={v}" for k, v in client.cookies.items())


async def _ready(port: int, process: subprocess.Popen[bytes], within: float = 60) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the web bench's app exited with status {process.returncode}")
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
    raise RuntimeError(f"the web bench's app was not ready on port {port} within {within} s")


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
    history_users: int = 10_000,
    outbox_rows: int = 1_000_000,
    page_connections: int = 4,
) -> int:
    """The benchmark; `page_connections`: wrk's connections on the console's pages (a few
    operators at once, where node management's API takes `connections`)."""
    if shutil.which("wrk") is None:
        say("wrk is missing: run deploy/local/ensure-tools.sh (apt-get install wrk)")
        return 2
    settings = bench_settings(base, "bench_web")
    ids = [uuid4() for _ in range(max(users, history_users))]
    history = ids[:history_users]
    say(
        f"seeding {len(ids)} users (5 items each), {history_users} of them with a history "
        f"({outbox_rows} outbox rows) in {settings.postgres_dsn.rsplit('/', 1)[-1]}"
    )
    await _prepare(settings, ids, history, outbox_rows)
    token, digest = new_token()
    password = uuid4().hex
    console_users = {CONSOLE_USER: {"role": "viewer", "password": hash_password(password)}}
    env = {
        **settings.child_env(),
        "PKGQ_WEB_SECRET": uuid4().hex + uuid4().hex,
        "PKGQ_WEB_TOKENS": json.dumps({"bench": {"role": "viewer", "sha256": digest}}),
        "PKGQ_WEB_USERS": json.dumps(console_users),
        "PKGQ_WEB_PORT": str(port),
        "PKGQ_LOG_LEVEL": "warning",
    }
    process = spawn([], {**os.environ, **env}, module="devtools.web_bench_app")
    try:
        await _ready(port, process)
        sample = random.sample(ids, min(len(ids), 2000))
        storied = random.sample(history, min(len(history), 2000))
        base_url = f"http://127.0.0.1:{port}"
        cookie = await asyncio.to_thread(_session_cookie, base_url, password)
        results: dict[str, WrkResult] = {}
        errors: dict[str, int] = {}
        lines: dict[str, tuple[list[str], str | None]] = {
            "baseline": (["/api/v1/baseline"], None),
            "current": ([f"/api/v1/users/{u}/current" for u in sample], None),
            "overview": (["/"], cookie),
            "timeline": ([f"/users/{u}/timeline" for u in storied], cookie),
        }
        with tempfile.TemporaryDirectory(prefix="pkgq-bench-web-") as work:
            scripts = {}
            widths: dict[str, int] = {}
            for name, (paths, session) in lines.items():
                scripts[name] = Path(work) / f"{name}.lua"
                scripts[name].write_text(lua_script(paths, token, session))
                width = connections if session is None else min(connections, page_connections)
                widths[name] = width
                await asyncio.to_thread(_wrk, base_url, scripts[name], 3, width, threads)
            # Alternate them, round after round, and keep each one's best: on a shared
            # machine the load drifts, and back-to-back rounds see the same drift.
            for round_no in range(1, rounds + 1):
                for name in lines:
                    say(
                        f"round {round_no}/{rounds}, {name}: {seconds} s of wrk "
                        f"-t{threads} -c{widths[name]}"
                    )
                    r = await asyncio.to_thread(
                        _wrk, base_url, scripts[name], seconds, widths[name], threads
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
    for name in ("overview", "timeline"):
        page = results[name]
        say(
            f"{name}: p50 {page.p50_ms:.2f} ms, p99 {page.p99_ms:.2f} ms, "
            f"p99 < {TARGET_P99_MS:.0f} ms: {'yes' if page.p99_ms < TARGET_P99_MS else 'NO'}"
        )
    for key, value in (
        ("users", users),
        ("history_users", history_users),
        ("outbox_rows", outbox_rows),
        ("seconds", seconds),
        ("connections", connections),
        ("page_connections", min(connections, page_connections)),
        ("rounds", rounds),
        ("current_rps", round(current.requests_per_s, 1)),
        ("current_p50_ms", round(current.p50_ms, 3)),
        ("current_p99_ms", round(current.p99_ms, 3)),
        ("baseline_rps", round(baseline.requests_per_s, 1)),
        ("baseline_p50_ms", round(baseline.p50_ms, 3)),
        ("baseline_p99_ms", round(baseline.p99_ms, 3)),
        ("rps_ratio_vs_select_one", round(current.requests_per_s / baseline.requests_per_s, 3)),
        ("p99_ratio_vs_select_one", round(current.p99_ms / baseline.p99_ms, 3)),
        *(
            (f"{name}_{figure}", value)
            for name in ("overview", "timeline")
            for figure, value in (
                ("rps", round(results[name].requests_per_s, 1)),
                ("p50_ms", round(results[name].p50_ms, 3)),
                ("p99_ms", round(results[name].p99_ms, 3)),
                ("p99_under_200ms", str(results[name].p99_ms < TARGET_P99_MS).lower()),
            )
        ),
    ):
        print(f"{key}={value}")
    return 0
