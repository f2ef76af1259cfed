"""The read API for node management (/api/v1) and the process's probes.

Each call is one statement on the app's long-lived pool (infra/postgres/read_api.py) and answers
in the shapes of consumers/queue_view.py, the same `pkgq user show --json` prints. docs/openapi.json
is this module's OpenAPI document (`pkgq web openapi`; a test fails when it is stale)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from consumers.queue_view import (
    CURSOR_PATTERN,
    PAGE_DEFAULT,
    PAGE_MAX,
    access_row,
    current_package,
    packages_page,
    position_of,
)
from consumers.web.dependencies import ApiViewer, pool_of
from infra.postgres import read_api
from infra.postgres.pool import answers

router = APIRouter()
api = APIRouter(prefix="/api/v1", tags=["read API"])

UserId = Annotated[UUID, Field(description="The user's id (a UUID).")]
Limit = Annotated[int, Query(ge=1, le=PAGE_MAX, description=f"Items on the page (1..{PAGE_MAX}).")]
After = Annotated[
    str | None,
    Query(
        max_length=40,
        pattern=CURSOR_PATTERN,
        description="The `next` of the page before (opaque); absent: the first page.",
    ),
]


class Item(BaseModel):
    """One package in a user's queue, with the terms it was bought on."""

    model_config = ConfigDict(extra="forbid")

    id: int
    package: str = Field(description="The package's name when it was bought.")
    package_id: int
    status: Literal["in_queue", "active", "consumed", "cancelled"] = Field(
        description="By the database clock: an active item past its expire_at is consumed."
    )
    expired_by_time_pending_timer: bool = Field(
        description="Consumed by the clock while its stored status still says active."
    )
    by_order: str | None
    created_at: datetime
    activated_at: datetime | None
    expire_at: datetime | None
    traffic_limit: int | None = Field(description="Bytes bought; null: unlimited traffic.")
    duration_s: int | None = Field(description="Seconds it lasts once active; null: no limit.")
    upload: int
    download: int
    used: int = Field(description="Bytes used: upload + download.")
    adjust_quota: int
    quota: int | None = Field(description="traffic_limit + adjust_quota; null: unlimited.")
    remaining: int | None = Field(description="Bytes left; null: unlimited.")


class AccessRow(BaseModel):
    """The access read model (telecom.access), kept by the activate and all_expired consumers."""

    model_config = ConfigDict(extra="forbid")

    granted: bool = Field(description="As the last applied event left it.")
    granted_now: bool = Field(description="granted, and not past expire_at by the clock.")
    item_id: int | None = Field(description="The item access was granted for; null: none.")
    package_id: int | None = Field(description="Its package; null: none.")
    remaining: int | None = Field(description="Bytes left when last applied; null: unlimited.")
    expire_at: datetime | None = Field(description="When the item expires; null: never.")
    seq: int = Field(description="The user's event sequence number that last changed the row.")
    updated_at: datetime = Field(description="When the row was last changed.")


class CurrentPackage(BaseModel):
    """GetCurrentPackage."""

    model_config = ConfigDict(extra="forbid")

    user_id: UUID
    as_of: datetime = Field(description="The database clock the answer was read at.")
    state: Literal["active", "expired", "queued", "none"] = Field(
        description="active: in use, access granted; expired: the active item is past its "
        "expire_at (reported so before its timer has run); queued: items wait, none active "
        "yet; none: nothing to use."
    )
    access_granted: bool
    item: Item | None = Field(description="The active item (also when expired).")
    expire_at: datetime | None
    traffic_used: int | None
    traffic_remaining: int | None = Field(description="null: unlimited (or no item).")
    queued: int = Field(description="Items waiting behind the active one.")
    access: AccessRow | None


class Packages(BaseModel):
    """GetAllMyPackages, a page at a time: the user's items in queue order (first in, first
    out), keyset-paginated on that order, so a page never repeats or skips an item however
    items are bought or change meanwhile."""

    model_config = ConfigDict(extra="forbid")

    user_id: UUID
    as_of: datetime
    current_item_id: int | None = Field(
        description="The active item (not past its expire_at), wherever it is in the queue."
    )
    total: int = Field(description="Every item of the user, whatever its status.")
    next: str | None = Field(
        description="Pass as `after` for the next page; null: this page is the last."
    )
    packages: list[Item]


class Access(BaseModel):
    """The access read model's row for one user."""

    model_config = ConfigDict(extra="forbid")

    user_id: UUID
    as_of: datetime
    access: AccessRow | None = Field(description="null: never granted.")


class Problem(BaseModel):
    detail: Any


_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "No bearer token or session."},
    404: {"model": Problem, "description": "pkgq has never seen a message for this user."},
}


def _unknown(user_id: UUID) -> HTTPException:
    return HTTPException(404, f"unknown user {user_id}")


def _json(content: dict[str, Any]) -> JSONResponse:
    """The answer as built (JSON-ready: queue_view writes times as ISO text), sent without a
    second validation pass: the models above document it, and tests/web holds every answer to
    them. On this hot path that pass would cost more than the query."""
    return JSONResponse(content)


@api.get("/users/{user_id}/current", response_model=CurrentPackage, responses=_ERRORS)
async def get_current_package(user_id: UserId, request: Request, who: ApiViewer) -> Any:
    """The user's current package, its terms and traffic, and whether access is granted."""
    async with pool_of(request).acquire() as conn:
        facts = await read_api.current(conn, user_id)
    if not facts.known:
        raise _unknown(user_id)
    return _json(current_package(user_id, facts))


@api.get("/users/{user_id}/packages", response_model=Packages, responses=_ERRORS)
async def get_all_my_packages(
    user_id: UserId,
    request: Request,
    who: ApiViewer,
    limit: Limit = PAGE_DEFAULT,
    after: After = None,
) -> Any:
    """The user's packages in queue order, a page of `limit` at a time, each with its status by
    the clock; `next` continues after the page, and `total` counts them all."""
    try:
        position = position_of(after) if after is not None else None
    except ValueError as exc:
        raise HTTPException(
            422, [{"loc": ["query", "after"], "msg": str(exc), "type": "value_error"}]
        ) from None
    async with pool_of(request).acquire() as conn:
        page = await read_api.packages_page(conn, user_id, position, limit)
    if not page.known:
        raise _unknown(user_id)
    return _json(packages_page(user_id, page))


@api.get("/users/{user_id}/access", response_model=Access, responses=_ERRORS)
async def get_access(user_id: UserId, request: Request, who: ApiViewer) -> Any:
    """The access read model for node management: granted or not, on which item."""
    async with pool_of(request).acquire() as conn:
        now, known, row = await read_api.access(conn, user_id)
    if not known:
        raise _unknown(user_id)
    return _json(
        {"user_id": str(user_id), "as_of": now.isoformat(), "access": access_row(row, now)}
    )


router.include_router(api)


@router.get("/healthz", include_in_schema=False, response_class=PlainTextResponse)
async def healthz() -> str:
    return "ok"


@router.get("/readyz", include_in_schema=False, response_class=PlainTextResponse)
async def readyz(request: Request) -> PlainTextResponse:
    try:
        async with pool_of(request).acquire(timeout=2) as conn:
            ok = await answers(conn)
    except Exception:  # noqa: BLE001  (any failure means not ready; the detail is not the caller's)
        ok = False
    return PlainTextResponse("ready" if ok else "not ready", status_code=200 if ok else 503)
