"""``mpsearch serve [--host H] [--port P] [--workdir DIR]``: the local web interface.

Thin CLI over :func:`mpsearch.serve.create_app`: binds the socket (loopback unless told
otherwise), prints the address with this start's access token (``?token=``, as Jupyter does)
and runs uvicorn until Ctrl-C or SIGTERM, then prints "stopped" and exits 0.

uvicorn has no header timeout, so a client sending half a request would hold its connection
forever (slowloris). :func:`guarded_protocol` is uvicorn's h11 protocol with one added: a
connection must finish its request headers within :data:`HEADER_TIMEOUT_S` of opening (or of
its previous response), and at most :data:`MAX_WAITING` connections may wait for headers at
once: past that the oldest is closed (a real browser sends its headers at once, so it is
never the oldest). Request bodies that pause are cut by :mod:`mpsearch.serve`'s guard.
"""

from __future__ import annotations

import argparse
import signal
import socket
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpsearch.errors import MpsearchError

if TYPE_CHECKING:  # asyncio costs the CLI's start-up; only `serve` runs an event loop
    import asyncio

__all__ = ["LOOPBACK", "add_serve_parser", "bind", "handler"]

LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
HEADER_TIMEOUT_S = 10.0
MAX_WAITING = 256


class _Terminated(Exception):
    """SIGTERM arrived: uvicorn has shut down and re-raises the signal; stop cleanly."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise _Terminated


def add_serve_parser(subparsers: Any) -> None:
    """Register ``serve``."""
    parser = subparsers.add_parser(
        "serve", help="local web interface: upload a model, configure, run, see results",
        description="Start a local web server: upload an ONNX model (its summary shows at "
                    "once), pick a hardware profile and data, run analyses and searches as "
                    "background jobs, and download exported QDQ models and their search specs. "
                    "Jobs write ordinary run directories under WORKDIR/runs/.")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1, this machine only; "
                             "0.0.0.0 exposes the server to the network)")
    parser.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 = any)")
    parser.add_argument("--workdir", default="mpsearch-serve",
                        help="where uploads and run directories go (default ./mpsearch-serve)")
    parser.add_argument("--max-upload-mb", type=float, default=256.0,
                        help="largest accepted upload in MB (default 256)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="jobs running at once (default 1; the rest queue)")
    parser.set_defaults(func=handler)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); :class:`MpsearchError` if it cannot be had."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as e:
        raise MpsearchError(f"cannot listen on {host}:{port} ({e.strerror or e}); pick another "
                            "--port or --host") from e
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def guarded_protocol(header_timeout_s: float = HEADER_TIMEOUT_S,
                     max_waiting: int = MAX_WAITING) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with a header timeout and a cap on connections waiting for
    their headers (see the module doc)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    waiting: OrderedDict[Any, asyncio.TimerHandle] = OrderedDict()

    class Guarded(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._check()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._check()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._check()

        def connection_lost(self, exc: Exception | None) -> None:
            self._done()
            super().connection_lost(exc)

        def _check(self) -> None:
            if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
                self._done()
            elif self not in waiting:  # the deadline runs from the first byte awaited
                waiting[self] = self.loop.call_later(header_timeout_s, self._expire)
                while len(waiting) > max_waiting:
                    oldest, timer = waiting.popitem(last=False)
                    timer.cancel()
                    oldest.transport.close()

        def _done(self) -> None:
            timer = waiting.pop(self, None)
            if timer is not None:
                timer.cancel()

        def _expire(self) -> None:
            waiting.pop(self, None)
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return Guarded


def handler(args: argparse.Namespace) -> int:
    import uvicorn

    from mpsearch.serve import LOOPBACK_HOSTS, ServeConfig, create_app

    if args.max_upload_mb <= 0 or args.jobs < 1:
        raise MpsearchError("--max-upload-mb must be positive and --jobs at least 1")
    workdir = Path(args.workdir).resolve()
    host = args.host.strip("[]")
    loopback = args.host in LOOPBACK
    config = ServeConfig(workdir=workdir, max_upload_bytes=int(args.max_upload_mb * 1e6),
                         max_running=args.jobs,
                         allowed_hosts=LOOPBACK_HOSTS if loopback else None)
    sock = bind(host, args.port)
    port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    server = uvicorn.Server(uvicorn.Config(create_app(config), log_level="warning",
                                           lifespan="on", http=guarded_protocol()))
    print(f"mpsearch serve: http://{shown}:{port}/?token={config.token}  (work directory "
          f"{workdir}; Ctrl-C stops)", flush=True)
    if not loopback:
        print("mpsearch serve: warning: listening beyond this machine; anyone who can reach "
              "it and has the token can upload models and run jobs", flush=True)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        server.run(sockets=[sock])
    except (KeyboardInterrupt, _Terminated):  # uvicorn re-raises the signal once it has
        pass                                  # shut down cleanly
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
    print("mpsearch serve: stopped", flush=True)
    return 0
