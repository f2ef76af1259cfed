"""The built documentation site in headless Chromium (Debian's, driven by Playwright as the
console's browser tests do): its Mermaid diagrams render to SVG from the vendored mermaid.min.js
with every request off this machine refused, so the site needs no CDN. The lifecycle page's
screenshot goes to build/screenshots/docs-lifecycle.png for a person to look at."""

from __future__ import annotations

import html
import re
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from playwright.async_api import Page, Route

from tests.web.stack import browser, shoot


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def site_url(built_site: Path) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(built_site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


DIAGRAM = re.compile(r'<pre class="mermaid"><code>(.*?)</code></pre>', re.DOTALL)
PARSE = """async (source) => {
    try { await mermaid.parse(source); return null; } catch (e) { return String(e.message || e); }
}"""

OPEN_SHADOWS = """
const attach = Element.prototype.attachShadow;
Element.prototype.attachShadow = function (init) {
    return attach.call(this, {...init, mode: "open"});
};
"""
"""mkdocs-material puts each rendered diagram in a closed shadow root; opened for the test's
eyes only (the page's own code is unchanged), so the SVG inside can be found."""


async def _offline(page: Page, base: str, refused: list[str]) -> None:
    async def only_local(route: Route) -> None:
        if route.request.url.startswith(base):
            await route.continue_()
        else:
            refused.append(route.request.url)
            await route.abort()

    await page.route("**/*", only_local)
    await page.add_init_script(OPEN_SHADOWS)


async def _rendered_diagrams(page: Page) -> int:
    # mkdocs-material renders each ```mermaid fence into a div.mermaid holding an SVG in its
    # shadow root (opened by OPEN_SHADOWS; Playwright's CSS selectors pierce open ones).
    await page.locator("div.mermaid svg").first.wait_for(state="visible", timeout=20_000)
    return await page.locator("div.mermaid svg").count()


@pytest.fixture(scope="module")
def diagrams(built_site: Path) -> dict[str, list[str]]:
    """Every Mermaid diagram's source in the built site, by page."""
    found: dict[str, list[str]] = {}
    for page in sorted(built_site.rglob("*.html")):
        sources = DIAGRAM.findall(page.read_text())
        if sources:
            found[str(page.relative_to(built_site))] = [html.unescape(s) for s in sources]
    return found


HOW_TOS = (
    "Publish from another language",
    "Replay and edit dead letters",
    "Run under systemd",
    "Run on Kubernetes",
    "Run on the replicated profile",
    "Change a route's partitions",
    "Upgrade",
    "Rotate credentials",
    "Read the dashboards at 3 a.m.",
)


async def _lifecycle(page: Page, site_url: str, diagrams: dict[str, list[str]]) -> Path:
    await page.goto(f"{site_url}/explanation/lifecycle.html")
    assert await _rendered_diagrams(page) == 1
    svg = page.locator("div.mermaid svg").first
    for state in ("in_queue", "active", "consumed", "cancelled"):
        assert await svg.get_by_text(state, exact=True).count() >= 1, state
    shot = await shoot(page, "docs-lifecycle")
    # Every other diagram of the site, parsed by the same mermaid (which draws a bomb and
    # "Syntax error in text" for one it cannot parse).
    errors = {
        f"{name} #{i}": error
        for name, sources in diagrams.items()
        for i, source in enumerate(sources)
        if (error := await page.evaluate(PARSE, source))
    }
    assert not errors, errors
    return shot


async def _home(page: Page, site_url: str) -> None:
    await page.goto(f"{site_url}/index.html")
    assert await _rendered_diagrams(page) == 1
    assert await page.locator("div.mermaid svg").get_by_text("relay").count() >= 1
    await shoot(page, "docs-home")
    # One click: the How-to tab; its page's navigation lists every how-to (the second click).
    await page.get_by_role("link", name="How-to guides").first.click()
    await page.wait_for_url("**/how-to/index.html")
    nav = page.locator("nav.md-nav--primary")
    for title in HOW_TOS:
        assert await nav.get_by_role("link", name=title, exact=True).count() >= 1, title


async def test_the_diagrams_render_offline_and_each_how_to_is_two_clicks_from_home(
    site_url: str, diagrams: dict[str, list[str]]
) -> None:
    """One browser, one build for all of it: the lifecycle's state machine drawn as SVG (with
    a screenshot, build/screenshots/docs-lifecycle.png), every diagram of the site parsed, the
    message path on the home page, and the how-tos in the navigation."""
    assert len(diagrams) >= 6, diagrams  # home, tutorial, lifecycle, delivery, failures, outbox
    refused: list[str] = []
    async with browser() as chromium:
        page = await chromium.new_page(viewport={"width": 1360, "height": 900})
        await _offline(page, site_url, refused)
        shot = await _lifecycle(page, site_url, diagrams)
        await _home(page, site_url)

    assert shot.stat().st_size > 10_000
    assert not refused, refused  # no CDN: not mermaid, not fonts
