"""``mpsearch serve [--host H] [--port P] [--workdir DIR]``: the local web interface.

Thin CLI over :func:`mpsearch.serve.create_app`: binds the socket (loopback unless told
otherwise), prints the address and runs uvicorn until Ctrl-C.
"""

from __future__ import annotations

import argparse
import socket
from pathlib import Path
from typing import Any

from mpsearch.errors import MpsearchError

__all__ = ["LOOPBACK", "add_serve_parser", "bind", "handler"]

LOOPBACK = ("127.0.0.1", "localhost", "::1")


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


def handler(args: argparse.Namespace) -> int:
    import uvicorn

    from mpsearch.serve import ServeConfig, create_app

    if args.max_upload_mb <= 0 or args.jobs < 1:
        raise MpsearchError("--max-upload-mb must be positive and --jobs at least 1")
    workdir = Path(args.workdir).resolve()
    loopback = args.host in LOOPBACK
    config = ServeConfig(workdir=workdir, max_upload_bytes=int(args.max_upload_mb * 1e6),
                         max_running=args.jobs,
                         allowed_hosts=("127.0.0.1", "localhost") if args.host != "::1"
                         and loopback else None)
    sock = bind(args.host, args.port)
    port = sock.getsockname()[1]
    shown = f"[{args.host}]" if ":" in args.host else args.host
    server = uvicorn.Server(uvicorn.Config(create_app(config), log_level="warning",
                                           lifespan="on"))
    print(f"mpsearch serve: http://{shown}:{port}/  (work directory {workdir}; Ctrl-C stops)",
          flush=True)
    if not loopback:
        print("mpsearch serve: warning: listening beyond this machine; anyone who can reach "
              "it can upload models and run jobs", flush=True)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C once it has shut down cleanly
        pass
    finally:
        sock.close()
    print("mpsearch serve: stopped", flush=True)
    return 0
