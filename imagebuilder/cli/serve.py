"""``serve``: the local web server for OS images and boot assets (spec 1.8), or its nginx site for production."""

from __future__ import annotations

import sys
from pathlib import Path

from invoke.context import Context
from invoke.tasks import task

from imagebuilder.cli._common import cli_task
from imagebuilder.errors import ExternalError, InputError
from imagebuilder.serve import ALL_INTERFACES, DEFAULT_PORT


@task(
    help={
        "dir": "directory to serve (e.g. the download.bottlerocket and download.hook destinations)",
        "bind": f"address to listen on (default {ALL_INTERFACES}: all)",
        "port": f"TCP port (default {DEFAULT_PORT})",
        "listing": "list directories (off by default)",
        "access_log": "write the access log to this file (default: standard error)",
        "nginx_config": "write an nginx site for this directory to this file instead of serving",
        "dry_run": "with --nginx-config: print the site instead of writing it",
    },
    auto_shortflags=False,
)
@cli_task
def serve(
    c: Context,
    dir: str = "",
    bind: str = ALL_INTERFACES,
    port: int = DEFAULT_PORT,
    listing: bool = False,
    access_log: str = "",
    nginx_config: str = "",
    dry_run: bool = False,
) -> None:
    """Serve images and boot assets over HTTP (ranges, HEAD, sendfile); print osImageURL and hookImagesURLPath."""
    from imagebuilder.serve import FileServer, cluster_values, nginx_site

    if not dir:
        raise InputError("required flag missing", field="--dir", expected="the directory to serve")
    root = Path(dir)
    if not root.is_dir():
        raise InputError(f"{dir} is not a directory", field="--dir")
    if nginx_config:
        from imagebuilder.files import atomic_write

        text = nginx_site(root, bind, port, listing)
        if dry_run:
            print(text, end="")
            return
        with atomic_write(nginx_config) as fh:
            fh.write(text)
        print(f"wrote {nginx_config}")
        return
    log = open(access_log, "a") if access_log else sys.stderr  # noqa: SIM115 -- lives as long as the server
    try:
        server = FileServer(root, bind, port, listing=listing, log=log)
    except OSError as exc:
        raise ExternalError(f"cannot listen on {bind}:{port}: {exc.strerror}", hint="choose another --port") from None
    base = server.base_url
    print(f"serving {root.resolve()} on {base}/ (Ctrl-C stops)")
    for key, value in cluster_values(base, root).items():
        print(f"{key}: {value}")
    sys.stdout.flush()
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        if log is not sys.stderr:
            log.close()
