"""The console's release of an orphaned hold: a hold whose blocker has no way out (no retry on
its way, no buried dead letter: `pkgq doctor`'s hold_without_way_out), which nothing but an
operator will ever release. A confirmation page shows the hold and its way out; the release
(operators only, CSRF-checked, audited) runs consumers/operations.release_hold, as
`pkgq dlq release-hold` does, and the check's stored result follows at once."""

from __future__ import annotations

from urllib.parse import quote
from uuid import UUID

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from consumers import operations
from consumers.web import auth
from consumers.web.dependencies import Operator, pool_of, render
from infra.postgres import invariants

router = APIRouter(include_in_schema=False)


def _uuid(value: str | None, what: str) -> UUID:
    try:
        return UUID(value or "")
    except ValueError:
        raise HTTPException(422, f"{what} {value!r} is not a UUID") from None


@router.get("/holds/release", response_class=HTMLResponse)
async def release_confirm(
    request: Request, who: Operator, consumer: str = "", user_id: str = ""
) -> Response:
    """The confirmation step: the hold, what is parked behind it, and whether it has a way out
    (then the page warns what is pending and what becomes of it: it is released all the
    same if the operator says so)."""
    user = _uuid(user_id, "user_id")
    async with pool_of(request).acquire() as conn:
        found = await invariants.hold_way_out(conn, consumer, user)
    if found is None:
        raise HTTPException(404, f"no hold on consumer {consumer!r} for user {user}")
    return render(request, "hold_confirm.html", {"hold": found})


@router.post("/holds/release")
async def release(request: Request, who: Operator) -> Response:
    form = await auth.checked_form(request)
    consumer = form.get("consumer", "")
    user = _uuid(form.get("user_id"), "user_id")
    blocker = _uuid(form.get("blocker"), "blocker")
    async with pool_of(request).acquire() as conn:
        try:
            async with conn.transaction():
                found = await operations.release_hold(
                    conn, consumer, user, who.actor, blocker=blocker
                )
        except operations.UnknownHoldError as exc:
            raise HTTPException(404, str(exc)) from None
        except operations.HoldReleaseRefusedError as exc:
            raise HTTPException(409, f"not released: {exc}") from None
        # The overview reads the stored result: it follows the release at once.
        await invariants.check_and_store(conn, names=[invariants.HOLD_WITHOUT_WAY_OUT.name])
    done = (
        f"released the hold on {consumer} for user {user} (blocker {found.blocker}); "
        f"{found.parked} parked message(s) will be applied in order"
    )
    if found.release_warning:
        done += f". Warning: {found.release_warning}"
    return RedirectResponse(f"/holds?done={quote(done)}", status_code=303)
