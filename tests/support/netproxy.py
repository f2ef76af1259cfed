"""A TCP forwarder for the network-fault tests, run as a process of its own:

    python -m tests.support.netproxy LISTEN_HOST LISTEN_PORT:TARGET_HOST:TARGET_PORT ...

It copies bytes both ways. SIGUSR1 makes it hold every chunk for DELAY_S seconds before passing
it on, in each direction (added latency without netem: the bytes wait here, nothing is
dropped or closed); SIGUSR2 ends the delay. Killing it (SIGKILL) resets its connections. It
never closes a connection on its own while the delay lasts, so a silent peer stays silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys

DELAY_S = 0.3
"""Held per chunk and direction while the delay is on: 600 ms more per round trip."""


class Forwarder:
    def __init__(self) -> None:
        self.delay = 0.0

    async def pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy until EOF; each chunk leaves `delay` seconds after it came, in order."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        async def send() -> None:
            while True:
                due, chunk = await queue.get()
                if not chunk:
                    break
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(chunk)
                await writer.drain()

        sender = asyncio.create_task(send())
        try:
            while True:
                chunk = await reader.read(65536)
                await queue.put((loop.time() + self.delay, chunk))
                if not chunk:
                    break
            await sender
        except (ConnectionError, OSError):
            sender.cancel()
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def serve(
        self,
        target: tuple[str, int],
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
    ) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*target)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(
            self.pipe(client_r, server_w), self.pipe(server_r, client_w), return_exceptions=True
        )


async def main(host: str, routes: list[str]) -> None:
    forwarder = Forwarder()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, lambda: setattr(forwarder, "delay", DELAY_S))
    loop.add_signal_handler(signal.SIGUSR2, lambda: setattr(forwarder, "delay", 0.0))
    servers = []
    for route in routes:
        port, target_host, target_port = route.split(":")
        target = (target_host, int(target_port))

        async def serve(
            r: asyncio.StreamReader, w: asyncio.StreamWriter, target: tuple[str, int] = target
        ) -> None:
            await forwarder.serve(target, r, w)

        servers.append(await asyncio.start_server(serve, host, int(port), reuse_address=True))
    print("listening", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:]))
