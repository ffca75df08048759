"""The files ``mpsearch serve`` serves beside its pages: the favicon and plotly.js.

plotly.js is the very file the ``plotly`` package ships and the report embeds, served from this
server (pages load nothing from other origins); it is found without importing plotly.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response

from mpsearch.serve._store import UploadError

__all__ = ["STATIC", "favicon", "plotly", "plotly_js"]

STATIC = Path(__file__).parent.parent / "static"
_CACHE = {"cache-control": "max-age=86400"}


def plotly_js() -> Path | None:
    """``plotly.min.js`` of the installed ``plotly`` package; None when it is missing."""
    spec = importlib.util.find_spec("plotly")
    for folder in (spec.submodule_search_locations or ()) if spec else ():
        path = Path(folder) / "package_data" / "plotly.min.js"
        if path.is_file():
            return path
    return None


async def favicon(request: Request) -> Response:
    return FileResponse(STATIC / "favicon.ico", media_type="image/x-icon", headers=_CACHE)


async def plotly(request: Request) -> Response:
    path = plotly_js()
    if path is None:
        raise UploadError("plotly is not installed: pip install plotly", status=404)
    return FileResponse(path, media_type="text/javascript", headers=_CACHE)
