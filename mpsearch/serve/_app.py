"""``mpsearch serve``: a local web interface over the Python API (Starlette, run by uvicorn).

Consumes a work directory and requests from a browser; produces uploads
(``WORKDIR/uploads/``, :mod:`mpsearch.serve._store`), jobs whose run directories are the CLI's
(``WORKDIR/runs/{id}/``, :mod:`mpsearch.serve._jobs`), and pages: the model summary as soon as
a model is uploaded, the profile's formats and op rules, the data and quantization form, live
job progress and the results (the run's report with its charts, the Pareto front, each point's
QDQ model and the job's ``spec.yaml`` to rerun it from the CLI).

Safety: every request needs the server's access token (``?token=`` once, then a cookie), every
state-changing one a same-origin ``Origin`` (:mod:`mpsearch.serve._access`); unknown Host
headers are refused when ``allowed_hosts`` is set; request bodies are capped (413 past
``max_upload_bytes``), uploads get generated names, every id in a URL is checked against
``[0-9a-f]{16}``, pages may load nothing from other origins, and errors are one-line messages
(a traceback only reaches the server log).
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from mpsearch.errors import MpsearchError
from mpsearch.rundir import RunDir
from mpsearch.serve import _assets as assets
from mpsearch.serve import _pages as pages
from mpsearch.serve._access import Access, new_token
from mpsearch.serve._choices import Choices, bundled_files, demo_names
from mpsearch.serve._http import Guard, error_handlers, error_response, wants_json
from mpsearch.serve._job_pages import job_page, model_page
from mpsearch.serve._jobs import ACTIVE, Job, JobQueue, job_title
from mpsearch.serve._progress import job_progress, read_journal
from mpsearch.serve._spec import (
    image_options,
    metric_names,
    parse_form,
    write_spec,
)
from mpsearch.serve._store import Store, Upload, UploadError, valid_id
from mpsearch.serve._summaries import analysis_headline, job_summary, metric_note
from mpsearch.serve._targetview import verify_html

__all__ = ["ServeConfig", "bundled_files", "create_app"]

logger = logging.getLogger(__name__)

@dataclass(frozen=True, slots=True, kw_only=True)
class ServeConfig:
    """How the server runs: where it stores everything, its limits and its access token
    (a fresh random one unless given; None switches the token check off)."""

    workdir: Path
    max_upload_bytes: int = 256 * 1024 * 1024
    max_running: int = 1
    allowed_hosts: tuple[str, ...] | None = None
    poll_s: float = 0.25
    token: str | None = field(default_factory=new_token)


class _App:
    """The routes, sharing one upload store and one job queue."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.store = Store(config.workdir, max_upload_bytes=config.max_upload_bytes)
        self.choices = Choices(self.store)
        self.queue = JobQueue(config.workdir, max_running=config.max_running,
                              poll_s=config.poll_s)
        self.bundling = asyncio.Lock()  # two clicks on "open the demo" make one entry

    # -- helpers -------------------------------------------------------------------------
    async def _form(self, request: Request) -> tuple[dict[str, str], UploadFile | None]:
        form = await request.form()
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        if "formats" in form:
            fields["formats"] = ",".join(v for v in form.getlist("formats")
                                         if isinstance(v, str))
        upload = form.get("file")
        return fields, upload if isinstance(upload, UploadFile) and upload.filename else None

    def _created(self, request: Request, url: str, record: Mapping[str, Any]) -> Response:
        if wants_json(request):
            return JSONResponse({**record, "url": url}, status_code=201)
        return RedirectResponse(url, status_code=303)

    async def _model_view(self, request: Request, model: Upload, *, status: int = 200,
                          errors: Mapping[str, UploadError] | None = None,
                          form: Mapping[str, str] | None = None) -> Response:
        query = request.query_params
        form = dict(form or {})
        profiles = self.choices.profiles()
        known = {v for v, _ in profiles}
        default = "shipped:x86_ort" if "shipped:x86_ort" in known else profiles[0][0]
        profile = next((p for p in (form.get("profile"), query.get("profile")) if p in known),
                       default)  # an unknown choice (the error says so) falls back
        form["profile"] = profile
        try:
            card = await run_in_threadpool(self._card, profile, form.get("verify", "none"))
        except MpsearchError as e:
            card = f'<p class="error">{pages.e(e)}</p>'
        data = self.choices.data(model)
        notice = self.choices.notice(query.get("uploaded", ""), query)
        html = model_page(
            model, self.store.summary(model), profiles=profiles, profile=profile, card=card,
            data=data, selected_data=(form.get("data") or query.get("data")
                                      or (data[0][0] if data else "")),
            metrics=await run_in_threadpool(metric_names), form=form,
            errors=errors or {}, max_bytes=self.config.max_upload_bytes, notice=notice)
        return HTMLResponse(html, status_code=status)

    def _card(self, ref: str, verify: str = "none") -> str:
        """The profile's card, then its target toolchain and the form's ``verify`` choice."""
        from mpsearch import load_profile

        profile = load_profile(self.choices.resolve_profile(ref)[0]).to_dict()
        return pages.profile_card(profile) + verify_html(profile, verify)

    # -- pages ---------------------------------------------------------------------------
    async def index(self, request: Request, error: UploadError | None = None,
                    status: int = 200) -> Response:
        jobs = self.queue.list()
        summaries = await run_in_threadpool(self._summaries, jobs)
        html = pages.index_page(self.store.list("models"), jobs,
                                list(bundled_files()[0]), self.config.max_upload_bytes, error,
                                demo=demo_names(), summaries=summaries)
        return HTMLResponse(html, status_code=status)

    def _summaries(self, jobs: tuple[Job, ...]) -> dict[str, dict[str, str]]:
        return {j.id: job_summary(j, self.queue.run_dir(j.id)) for j in jobs}

    async def upload_model(self, request: Request) -> Response:
        _, upload = await self._form(request)
        try:
            if upload is None:
                raise UploadError("choose an ONNX model file to upload")
            model = await run_in_threadpool(self.store.add_model, upload.file, upload.filename)
        except UploadError as err:
            if wants_json(request):
                return error_response(request, str(err), err.status)
            return await self.index(request, err, err.status)
        return self._created(request, f"/models/{model.id}", model.to_dict())

    async def bundled_model(self, request: Request) -> Response:
        fields, _ = await self._form(request)
        source = bundled_files()[0].get(fields.get("name", ""))
        if source is None:
            return await self.index(request, UploadError("no such bundled model"), 404)
        label = "demo" if source.name in demo_names() else "test fixture"
        async with self.bundling:
            model = self.choices.opened(source, label)
            if model is None:
                model = await run_in_threadpool(self.store.add_bundled, "models", source,
                                                source.name, None, label)
        return self._created(request, f"/models/{model.id}", model.to_dict())

    async def model(self, request: Request) -> Response:
        model = self.store.get("models", request.path_params["id"])
        if wants_json(request):
            return JSONResponse({**model.to_dict(), "summary": self.store.summary(model)})
        return await self._model_view(request, model)

    async def upload_profile(self, request: Request) -> Response:
        model = self.store.get("models", request.path_params["id"])
        fields, upload = await self._form(request)
        try:
            if upload is None:
                raise UploadError("choose a profile YAML file to upload")
            profile = await run_in_threadpool(self.store.add_profile, upload.file,
                                              upload.filename)
        except UploadError as err:
            if wants_json(request):
                return JSONResponse({"error": str(err), "line": err.line,
                                     "source_line": err.source_line}, status_code=err.status)
            return await self._model_view(request, model, status=err.status,
                                          errors={"profile": err}, form=fields)
        url = _model_url(model, profile=f"upload:{profile.id}", data=fields.get("data"),
                         uploaded="profile")
        return self._created(request, url, profile.to_dict())

    async def upload_data(self, request: Request) -> Response:
        model = self.store.get("models", request.path_params["id"])
        fields, upload = await self._form(request)
        images = {k.removeprefix("image_"): v.strip() for k, v in fields.items()
                  if k.startswith("image_") and v.strip()}
        try:
            if upload is None:
                raise UploadError("choose a data file (.npz or a .zip of images) to upload")
            options = image_options(images)
            data = await run_in_threadpool(self.store.add_data, upload.file, upload.filename,
                                           model, options)
        except UploadError as err:
            if wants_json(request):
                return error_response(request, str(err), err.status)
            return await self._model_view(request, model, status=err.status,
                                          errors={"data": err}, form=fields)
        url = _model_url(model, profile=fields.get("profile"), data=data.id, uploaded="data")
        return self._created(request, url, data.to_dict())

    async def create_job(self, request: Request) -> Response:
        model = self.store.get("models", request.path_params["id"])
        fields, _ = await self._form(request)
        run_dir = None
        try:
            profile, label = self.choices.resolve_profile(fields.get("profile", ""))
            data = await run_in_threadpool(self.choices.resolve_data, fields.get("data", ""),
                                           model)
            fields["data"] = data.id
            config = parse_form(fields, model=model.path, data=data.path, profile=profile,
                                labels=bool(data.info.get("labels", True)))
            job_id, run_dir = self.queue.new_run_dir()
            title = job_title(self.queue.number(job_id), config, model, label)
            commands = await run_in_threadpool(write_spec, run_dir, config, title=title,
                                               name=model.name)
        except UploadError as err:
            if run_dir is not None:
                shutil.rmtree(run_dir, ignore_errors=True)
            if wants_json(request):
                return error_response(request, str(err), err.status)
            return await self._model_view(request, model, status=err.status,
                                          errors={"job": err}, form=fields)
        job = self.queue.submit(Job(
            id=job_id, kind=config.kind, title=title, model=model.id, model_name=model.name,
            profile=label,
            trials=config.trials if config.kind == "search" else None,
            higher_is_better=config.metric != "mse", commands=commands))
        return self._created(request, f"/jobs/{job.id}", job.to_dict())

    async def profile_card(self, request: Request) -> Response:
        try:
            card = await run_in_threadpool(self._card, request.query_params.get("ref", ""))
        except MpsearchError as e:
            card = f'<p class="error">{pages.e(e)}</p>'
        return HTMLResponse(card)

    async def jobs(self, request: Request) -> Response:
        jobs = self.queue.list()
        summaries = await run_in_threadpool(self._summaries, jobs)
        if wants_json(request):
            return JSONResponse({"jobs": [{**j.to_dict(), "summary": summaries[j.id]}
                                          for j in jobs]})
        return HTMLResponse(pages.jobs_page(jobs, summaries))

    def _status(self, job: Job) -> dict[str, Any]:
        run_dir = self.queue.run_dir(job.id)
        progress = None
        if job.state == "running":
            progress = job_progress(run_dir, kind=job.kind, trials=job.trials,
                                    higher_is_better=job.higher_is_better, started=job.started)
        return {"job": job.to_dict(), "progress": progress,
                "position": self.queue.position(job.id)}

    async def job(self, request: Request) -> Response:
        job = self.queue.get(request.path_params["id"])
        status = await run_in_threadpool(self._status, job)
        if wants_json(request):
            return JSONResponse(status)
        results = await run_in_threadpool(self.choices.results, job, self.queue.run_dir(job.id))
        run_dir = self.queue.run_dir(job.id)
        headline = (await run_in_threadpool(analysis_headline, run_dir)
                    if job.kind != "search" and job.state == "done" else None)
        front = results.get("front")
        measured = (front or {}).get("metric") or (headline or {}).get("metric")
        note = await run_in_threadpool(metric_note, run_dir, measured)
        html = job_page(job, progress=status["progress"], **results,
                        has_report=job.state not in ACTIVE
                        and RunDir(run_dir).report_html.is_file(),
                        has_profile=RunDir(run_dir).hw_profile_yaml.is_file(),
                        run_dir=str(run_dir), position=status["position"],
                        headline=headline, metric_note=note)
        return HTMLResponse(html)

    async def cancel(self, request: Request) -> Response:
        job = self.queue.cancel(request.path_params["id"])
        return self._created(request, f"/jobs/{job.id}", job.to_dict())

    async def resume(self, request: Request) -> Response:
        job = self.queue.resume(request.path_params["id"])
        return self._created(request, f"/jobs/{job.id}", job.to_dict())

    async def finish(self, request: Request) -> Response:
        job = self.queue.get(request.path_params["id"])
        _, finished = await run_in_threadpool(read_journal, self.queue.run_dir(job.id) /
                                              "study.journal")
        job = await run_in_threadpool(self.queue.finish, job.id, finished)
        return self._created(request, f"/jobs/{job.id}", job.to_dict())

    async def job_file(self, request: Request) -> Response:
        job = self.queue.get(request.path_params["id"])
        name = request.path_params["name"]
        files = {"report": ("report.html", "text/html"),
                 "spec.yaml": ("spec.yaml", "application/x-yaml"),
                 "hw_profile.yaml": ("hw_profile.yaml", "application/x-yaml")}
        if name not in files:
            raise UploadError(f"no file '{name[:40]}' for a job", status=404)
        file, media = files[name]
        path = self.queue.run_dir(job.id) / file
        if not path.is_file():
            raise UploadError(f"{file} of job {job.id} does not exist (yet)", status=404)
        disposition = None if name == "report" else f"{job.id}-{file}"
        return FileResponse(path, media_type=media, filename=disposition)

    async def export(self, request: Request) -> Response:
        job = self.queue.get(request.path_params["id"])
        text = request.query_params.get("point", "")
        if not re.fullmatch(r"[0-9]{1,6}", text):
            raise UploadError(f"point must be the number of a front point, such as 0; got "
                              f"'{text[:20]}'")
        path = await run_in_threadpool(self.queue.export, job.id, int(text))
        model = self.store.get("models", job.model)
        stem = Path(model.name).stem or "model"
        return FileResponse(path, media_type="application/octet-stream",
                            filename=f"{stem}-point{int(text)}.onnx")

    async def profiles_api(self, request: Request) -> Response:
        return JSONResponse({"profiles": [v for v, _ in self.choices.profiles()]})


def _model_url(model: Upload, **query: str | None) -> str:
    kept = urlencode({k: v for k, v in query.items() if v})
    return f"/models/{model.id}" + (f"?{kept}" if kept else "")


def create_app(config: ServeConfig) -> Starlette:
    """The ASGI application; the job queue starts and stops with its lifespan."""
    config.workdir.mkdir(parents=True, exist_ok=True)
    app = _App(config)

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        app.queue.start()
        # the metric table comes with onnxruntime: import it now, not on the first model page
        warmup = threading.Thread(target=metric_names, name="mpsearch-warmup", daemon=True)
        warmup.start()
        try:
            yield
        finally:
            await run_in_threadpool(app.queue.stop)
            # an exit in the middle of onnxruntime's import aborts the process (a C++ thread
            # torn down): a SIGTERM right after the start waits for the import to end
            await run_in_threadpool(warmup.join)

    def checked(handler: Callable[[Request], Awaitable[Response]]
                ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            if "id" in request.path_params and not valid_id(request.path_params["id"]):
                return error_response(request, "not found: malformed id in the address", 404)
            return await handler(request)
        return endpoint

    routes = [
        Route("/", checked(app.index)),
        Route("/models", checked(app.upload_model), methods=["POST"]),
        Route("/models/bundled", checked(app.bundled_model), methods=["POST"]),
        Route("/models/{id}", checked(app.model)),
        Route("/models/{id}/profiles", checked(app.upload_profile), methods=["POST"]),
        Route("/models/{id}/data", checked(app.upload_data), methods=["POST"]),
        Route("/models/{id}/jobs", checked(app.create_job), methods=["POST"]),
        Route("/profiles/card", checked(app.profile_card)),
        Route("/jobs", checked(app.jobs)),
        Route("/jobs/{id}", checked(app.job)),
        Route("/jobs/{id}/cancel", checked(app.cancel), methods=["POST"]),
        Route("/jobs/{id}/resume", checked(app.resume), methods=["POST"]),
        Route("/jobs/{id}/finish", checked(app.finish), methods=["POST"]),
        Route("/jobs/{id}/export", checked(app.export)),
        Route("/jobs/{id}/{name}", checked(app.job_file)),
        Route("/api/jobs", checked(app.jobs)),
        Route("/api/jobs/{id}", checked(app.job)),
        Route("/api/models/{id}", checked(app.model)),
        Route("/api/profiles", checked(app.profiles_api)),
        Route("/favicon.ico", assets.favicon),
        Route("/static/plotly.min.js", assets.plotly),
        Mount("/static", StaticFiles(directory=assets.STATIC), name="static"),
    ]
    access = Access(config.token, config.allowed_hosts or None)
    middleware = [Middleware(Guard, max_bytes=config.max_upload_bytes, access=access)]
    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                     exception_handlers=error_handlers())
