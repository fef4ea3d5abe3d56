"""The web admin's pages (`/admin`): routes parse, call `views`/`upstream`, render.

Every page needs a logged-in viewer (`ViewerDep`); every POST also a valid CSRF token
(`CheckedForm`). `AdminRoute` answers failures with HTML (login redirect, error page).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.background import BackgroundTask
from starlette.responses import StreamingResponse

from gateway.admin import upstream, views
from gateway.admin.access import (
    AdminRoute,
    CheckedForm,
    LoginRequired,
    ViewerDep,
    check_login_form,
    current_viewer,
    log_in,
    log_out,
    login_form_token,
    set_login_cookie,
)
from gateway.admin.templating import render, safe_next
from gateway.deps import ReplicasDep, SessionsDep, UpstreamsDep
from gateway.health.health import stack_health
from services.common.errors import LoomError

router = APIRouter(prefix="/admin", route_class=AdminRoute, include_in_schema=False)

OptionalText = Annotated[str | None, Form()]


@router.get("")
@router.get("/")
async def home() -> RedirectResponse:
    return RedirectResponse("/admin/jobs", status_code=303)


@router.get("/login")
async def login_page(request: Request, next: str | None = None) -> Response:
    try:
        await current_viewer(request)
    except LoginRequired:
        return _login_form(request, next, message=None, status_code=200)
    return RedirectResponse(safe_next(next), status_code=303)


@router.post("/login")
async def login(
    request: Request,
    api_key: Annotated[str, Form()] = "",
    csrf_token: OptionalText = None,
    next: OptionalText = None,
) -> Response:
    check_login_form(request, csrf_token)
    response = RedirectResponse(safe_next(next), status_code=303)
    if await log_in(request, response, api_key) is None:
        return _login_form(
            request, next, "That API key is not valid (unknown or revoked).", status_code=401
        )
    return response


@router.post("/logout")
async def logout(request: Request, _form: CheckedForm, viewer: ViewerDep) -> RedirectResponse:
    response = RedirectResponse("/admin/login", status_code=303)
    log_out(request, response, viewer)
    return response


@router.get("/jobs")
async def jobs_page(request: Request, viewer: ViewerDep, sessions: SessionsDep) -> HTMLResponse:
    jobs = await views.jobs_overview(sessions, viewer.key)
    return render(request, "jobs.html", {"jobs": jobs})


@router.get("/jobs/table")
async def jobs_table(request: Request, viewer: ViewerDep, sessions: SessionsDep) -> HTMLResponse:
    jobs = await views.jobs_overview(sessions, viewer.key)
    return render(request, "_jobs_table.html", {"jobs": jobs})


@router.get("/jobs/{job_id}")
async def job_page(
    request: Request,
    job_id: str,
    viewer: ViewerDep,
    sessions: SessionsDep,
    upstreams: UpstreamsDep,
    done: str | None = None,
    versions_page: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
    aliased: bool = False,
) -> HTMLResponse:
    page = await views.job_page(
        sessions,
        upstreams,
        viewer.key,
        job_id,
        views.VersionFilter(page=versions_page, aliased=aliased),
    )
    return render(request, "job.html", {"page": page, "done": done})


@router.get("/jobs/{job_id}/summary")
async def job_summary(
    request: Request, job_id: str, viewer: ViewerDep, sessions: SessionsDep
) -> HTMLResponse:
    job, run = await views.job_status(sessions, viewer.key, job_id)
    return render(request, "_job_summary.html", {"job": job, "run": run})


@router.get("/jobs/{job_id}/samples")
async def job_samples(
    request: Request, job_id: str, viewer: ViewerDep, sessions: SessionsDep
) -> HTMLResponse:
    samples = await views.job_samples(sessions, viewer.key, job_id)
    return render(request, "_samples.html", {"samples": samples})


@router.get("/jobs/{job_id}/charts.json")
async def job_charts(job_id: str, viewer: ViewerDep, sessions: SessionsDep) -> JSONResponse:
    charts = await views.job_charts(sessions, viewer.key, job_id)
    return JSONResponse(charts, headers={"Cache-Control": "no-store"})


@router.post("/jobs/{job_id}/aliases")
async def move_alias(
    request: Request,
    job_id: str,
    _form: CheckedForm,
    viewer: ViewerDep,
    sessions: SessionsDep,
    upstreams: UpstreamsDep,
    alias: Annotated[str, Form()],
    number: Annotated[int, Form()],
) -> Response:
    job = await views.job_summary(sessions, viewer.key, job_id)
    try:
        await upstream.move_alias(upstreams, job.id, alias.strip(), number)
    except LoomError as exc:
        return await _job_page_with_problem(request, job.id, viewer, sessions, upstreams, exc)
    return RedirectResponse(f"/admin/jobs/{job.id}?done=alias#versions", status_code=303)


@router.post("/jobs/{job_id}/versions/{number}/delete")
async def delete_version(
    request: Request,
    job_id: str,
    number: int,
    _form: CheckedForm,
    viewer: ViewerDep,
    sessions: SessionsDep,
    upstreams: UpstreamsDep,
) -> Response:
    job = await views.job_summary(sessions, viewer.key, job_id)
    try:
        await upstream.delete_version(upstreams, job.id, number)
    except LoomError as exc:
        return await _job_page_with_problem(request, job.id, viewer, sessions, upstreams, exc)
    return RedirectResponse(f"/admin/jobs/{job.id}?done=deleted#versions", status_code=303)


@router.get("/jobs/{job_id}/versions/{number}/download")
async def download_version(
    job_id: str, number: int, viewer: ViewerDep, sessions: SessionsDep, upstreams: UpstreamsDep
) -> StreamingResponse:
    job = await views.job_summary(sessions, viewer.key, job_id)
    archive = await upstream.open_archive(upstreams, job.id, number)
    headers = {
        "Cache-Control": "no-store",
        "X-Content-Type-Options": "nosniff",
        "Content-Disposition": archive.headers.get(
            "content-disposition", f'attachment; filename="{job.id}-v{number}.tar"'
        ),
    }
    return StreamingResponse(
        archive.aiter_raw(),
        media_type="application/x-tar",
        headers=headers,
        background=BackgroundTask(archive.aclose),
    )


@router.get("/health")
async def health_page(request: Request, viewer: ViewerDep, replicas: ReplicasDep) -> HTMLResponse:
    health = await stack_health(request.app.state, request.app.version)
    return render(
        request,
        "health.html",
        {"health": health, "replicas": views.replica_table(replicas, viewer.key)},
    )


@router.get("/health/replicas")
async def replicas_table(
    request: Request, viewer: ViewerDep, replicas: ReplicasDep
) -> HTMLResponse:
    return render(
        request,
        "_replicas_table.html",
        {"replicas": views.replica_table(replicas, viewer.key, required=True)},
    )


@router.get("/health/table")
async def health_table(request: Request, _viewer: ViewerDep) -> HTMLResponse:
    health = await stack_health(request.app.state, request.app.version)
    return render(request, "_health_table.html", {"health": health})


def _login_form(
    request: Request, next: str | None, message: str | None, status_code: int
) -> HTMLResponse:
    token, cookie = login_form_token(request)
    response = render(
        request,
        "login.html",
        {"next": safe_next(next), "message": message, "csrf_token": token},
        status_code,
    )
    set_login_cookie(request, response, cookie)
    return response


async def _job_page_with_problem(
    request: Request,
    job_id: str,
    viewer: ViewerDep,
    sessions: SessionsDep,
    upstreams: UpstreamsDep,
    problem: LoomError,
) -> HTMLResponse:
    """The job page again, with the service's refusal shown above the versions."""
    page = await views.job_page(sessions, upstreams, viewer.key, job_id)
    return render(
        request,
        "job.html",
        {"page": page, "problem": problem.message},
        status_code=problem.status_code,
    )
