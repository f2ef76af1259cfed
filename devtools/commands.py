"""The developer tools' commands, added to `pkgq` when this package is installed: `pkgq bench`,
`pkgq demo` and `pkgq web bench`. What they run is imported only when they run: `pkgq` loads
this module to resolve any of its groups (a plugin may add to one), so it stays light."""

from __future__ import annotations

import sys
from typing import Annotated

import typer


def _bench_namespace(value: str) -> str:
    if not value.replace("_", "").isalnum() or not value.isascii() or not value[:1].isalpha():
        raise typer.BadParameter("letters, digits and _ only, starting with a letter")
    return value.lower()


def bench_cmd(
    users: Annotated[int, typer.Option(min=1, help="Users in the scenario.")] = 400,
    packages: Annotated[int, typer.Option(min=1, help="Packages each user buys and uses up.")] = 5,
    small_rows: Annotated[
        int, typer.Option(min=0, help="Rows already in package_queue, first runs.")
    ] = 10_000,
    large_rows: Annotated[
        int, typer.Option(min=0, help="Rows already in package_queue, last run.")
    ] = 1_000_000,
    batch_size: Annotated[
        int | None, typer.Option(min=1, max=1000, help="Default: PKGQ_BATCH_SIZE's (32).")
    ] = None,
    batch_max: Annotated[
        int | None, typer.Option(min=1, max=1000, help="Default: PKGQ_BATCH_MAX's (512).")
    ] = None,
    prefetch: Annotated[
        int | None, typer.Option(min=1, help="Default: PKGQ_PREFETCH's (1024).")
    ] = None,
    raw_messages: Annotated[int, typer.Option(min=1, help="Messages in the raw baseline.")] = 5000,
    replicas: Annotated[
        int, typer.Option(min=1, max=16, help="pkgq run processes (routes split to match).")
    ] = 1,
    repeat: Annotated[
        int,
        typer.Option(
            min=1,
            max=10,
            help="Runs of each backlog drain (pkgq's and the broker's taking turns); the best "
            "counts.",
        ),
    ] = 2,
    lifecycle_repeat: Annotated[
        int,
        typer.Option(
            min=1,
            max=10,
            help="Runs of the raw broker and of each pkgq lifecycle phase (the raw broker's "
            "interleaved with pkgq's); the best counts (for latency: the lowest p99).",
        ),
    ] = 3,
    backlog_users: Annotated[
        int, typer.Option(min=1, help="Users of the backlog phase, each with an active package.")
    ] = 1000,
    backlog_records: Annotated[
        int,
        typer.Option(
            min=1,
            help="Usage records queued before the simple consumer, FastStream and pkgq drain "
            "them (and messages the broker alone consumes).",
        ),
    ] = 20_000,
    namespace: Annotated[
        str,
        typer.Option(
            help="Its own names: database pkgq_NAME, exchange and queues NAME.*.",
            callback=_bench_namespace,
        ),
    ] = "bench",
) -> None:
    """Benchmark pkgq against the raw broker, its naive mode, a simple consumer, a FastStream
    consumer and the broker's own consume rate; prints key=value lines last (a developer tool).

    Scale it with --users and --packages (events per run are about users x (3 x packages + 3)).
    It uses its own database (pkgq_bench) and broker names (bench.*) next to the configured ones.
    """
    import structlog
    from rich.console import Console
    from rich.progress import Progress

    from consumers.cli.running import load_settings, run
    from devtools.bench.run import PHASES, run_bench
    from devtools.bench.scenario import Scenario

    settings = load_settings()
    scenario = Scenario(
        users=users,
        packages=packages,
        small_rows=small_rows,
        large_rows=large_rows,
        batch_size=batch_size or settings.batch_size,
        batch_max=batch_max or settings.batch_max,
        prefetch=prefetch or settings.prefetch,
        raw_messages=raw_messages,
        replicas=replicas,
        repeat=repeat,
        lifecycle_repeat=lifecycle_repeat,
        backlog_users=backlog_users,
        backlog_records=backlog_records,
        namespace=namespace,
    )
    err = Console(stderr=True)
    if sys.stderr.isatty():
        with Progress(console=err) as progress:
            task = progress.add_task("bench", total=PHASES)

            def say(text: str) -> None:
                if not text.startswith(" "):
                    progress.advance(task)
                progress.console.print(text, highlight=False)

            code = run(run_bench(settings, scenario, say))
    else:
        bench_log = structlog.get_logger("pkgq.bench")
        code = run(run_bench(settings, scenario, lambda text: bench_log.info(text.strip())))
    raise typer.Exit(code)


def demo_cmd(
    timeout: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 90.0,
) -> None:
    """Start the relay and all consumers, drive sample users through every route, show it (a
    developer tool). Exit 1 if a step failed, 5 if it timed out."""
    from consumers.cli.running import load_routing_settings, run
    from devtools.demo import run_demo

    settings = load_routing_settings()
    raise typer.Exit(run(run_demo(settings, timeout)))


def web_bench_cmd(
    users: Annotated[int, typer.Option(min=1, help="Users seeded (5 items each).")] = 20_000,
    seconds: Annotated[int, typer.Option(min=1, help="Seconds of load per endpoint.")] = 10,
    connections: Annotated[int, typer.Option(min=1, help="wrk's open connections.")] = 32,
    threads: Annotated[int, typer.Option(min=1, help="wrk's threads.")] = 2,
    rounds: Annotated[
        int, typer.Option(min=1, max=10, help="Alternating rounds; each endpoint's best counts.")
    ] = 3,
    port: Annotated[int, typer.Option(help="Where the benchmarked pkgq web listens.")] = 18081,
    history_users: Annotated[
        int, typer.Option(min=1, help="Users with a history, whose timelines are loaded.")
    ] = 10_000,
    outbox_rows: Annotated[
        int, typer.Option(min=1, help="Outbox rows spread over the users with a history.")
    ] = 1_000_000,
    page_connections: Annotated[
        int, typer.Option(min=1, help="wrk's open connections on the console's pages.")
    ] = 4,
) -> None:
    """Benchmark /api/v1/users/{id}/current with wrk against a one-row SELECT endpoint on the
    same stack, and the console's overview and users' timelines (p99 against 200 ms), in a
    database of its own (pkgq_bench_web); prints key=value lines last."""
    from consumers.cli.running import load_settings, run
    from devtools.web_bench import run_web_bench

    settings = load_settings()

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    code = run(
        run_web_bench(
            settings,
            users=users,
            seconds=seconds,
            connections=connections,
            threads=threads,
            port=port,
            rounds=rounds,
            say=say,
            history_users=history_users,
            outbox_rows=outbox_rows,
            page_connections=page_connections,
        )
    )
    raise typer.Exit(code)


web_extras = typer.Typer()
"""What this package adds to `pkgq web`: added under the group's name, its commands join the
group's (consumers/cli/lazy.py), without importing consumers/cli/web.py here."""
web_extras.command("bench")(web_bench_cmd)


def register(app: typer.Typer) -> None:
    """Add `bench`, `demo` and `web bench` to the `pkgq` app."""
    app.command("bench")(bench_cmd)
    app.command("demo")(demo_cmd)
    app.add_typer(web_extras, name="web")
