"""``serve``: the local web server for OS images and boot assets (spec 1.8), or its nginx site for production."""

from __future__ import annotations

import errno
import sys

from invoke.context import Context

from imagebuilder.cli import flags
from imagebuilder.cli._common import cli_task, task
from imagebuilder.core.errors import ExternalError, InputError
from imagebuilder.host.serve import ALL_INTERFACES, DEFAULT_PORT


@task(
    help={
        "dir": "directory to serve (e.g. the download.bottlerocket and download.hook destinations)",
        "repo": "instead of --dir: a TUF repository folder image.publish made (verified first); prints its URLs and"
        " each bare-metal image's osImageURL",
        "bind": f"address to listen on (default {ALL_INTERFACES}: all)",
        "port": f"TCP port (default {DEFAULT_PORT})",
        "listing": "list directories (off by default)",
        "access_log": "write the access log to this file (default: standard error)",
        "nginx_config": "write an nginx site for this directory to this file instead of serving",
        "dry_run": "check everything (the folder, the access log, that the address can be listened on) and print what"
        " would be served, or with --nginx-config the site; serve or write nothing",
    },
)
@cli_task
def serve(
    c: Context,
    dir: str = "",
    repo: str = "",
    bind: str = ALL_INTERFACES,
    port: str = str(DEFAULT_PORT),
    listing: bool = False,
    access_log: str = "",
    nginx_config: str = "",
    dry_run: bool = False,
) -> None:
    """Serve images and boot assets over HTTP (ranges, HEAD, sendfile); print osImageURL and hookImagesURLPath.

    Examples:
        image-builder serve --dir output --port 8080 --dry-run
    """
    from imagebuilder.host.serve import FileServer, cluster_values, nginx_site, repository_values

    if dir and repo:
        raise InputError("--dir and --repo both name what to serve", field="--repo", expected="one of them")
    root = flags.served_dir(repo, "--repo") if repo else flags.served_dir(
        flags.required(dir, "--dir", "the directory to serve (or --repo)"), "--dir")  # fmt: skip
    values = repository_values("", root) if repo else None  # verified before anything listens
    number = flags.port(port)
    address = flags.ip_address(bind, "--bind")
    if nginx_config:
        from imagebuilder.core.files import atomic_write

        site = flags.dest_file(nginx_config, "--nginx-config")
        text = nginx_site(root, address, number, listing)
        if dry_run:
            print(text, end="")
            return
        with atomic_write(site) as fh:
            fh.write(text)
        print(f"wrote {nginx_config}")
        return
    if access_log:
        flags.dest_file(access_log, "--access-log")
    try:
        server = FileServer(root, address, number, listing=listing, log=sys.stderr)
    except OSError as exc:
        hint = "choose another --port" if exc.errno == errno.EADDRINUSE else "choose an address of this host for --bind"
        raise ExternalError(f"cannot listen on {address}:{number}: {exc.strerror}", hint=hint) from None
    if dry_run:  # the address could be listened on: say what would be served, and let it go
        base = server.base_url
        server.server_close()
        print(f"would serve {root.resolve()} on {base}/ (--dry-run: nothing served)")
        pairs = repository_values(base, root) if values is not None else list(cluster_values(base, root).items())
        for key, value in pairs:
            print(f"{key}: {value}")
        return
    try:
        log = open(access_log, "a") if access_log else sys.stderr  # noqa: SIM115 -- lives as long as the server
    except OSError as exc:
        server.server_close()
        raise InputError(f"cannot open the access log: {exc.strerror}", field="--access-log") from None
    server.log = log
    base = server.base_url
    print(f"serving {root.resolve()} on {base}/ (Ctrl-C stops)")
    pairs = repository_values(base, root) if values is not None else list(cluster_values(base, root).items())
    for key, value in pairs:
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
