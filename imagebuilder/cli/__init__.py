"""The task namespace shared by ``invoke`` (through tasks.py) and the ``image-builder`` program.

One module per namespace; each task parses flags, calls the library and prints.
"""

from __future__ import annotations

from invoke.collection import Collection

from imagebuilder.cli import build as _build
from imagebuilder.cli import config as _config
from imagebuilder.cli import demo as _demo
from imagebuilder.cli import dev as _dev
from imagebuilder.cli import dhcp as _dhcp
from imagebuilder.cli import docs as _docs
from imagebuilder.cli import download as _download
from imagebuilder.cli import host as _host
from imagebuilder.cli import image as _image
from imagebuilder.cli import mirror as _mirror
from imagebuilder.cli import serve as _serve
from imagebuilder.cli import vsphere as _vsphere


def make_namespace() -> Collection:
    ns = Collection()
    ns.add_task(_build.build)
    ns.add_task(_docs.docs)
    ns.add_task(_demo.demo)
    ns.add_task(_dev.lint)
    ns.add_task(_dev.test)
    ns.add_task(_host.preflight)
    ns.add_task(_serve.serve)
    ns.add_collection(Collection.from_module(_config, name="config"))
    ns.add_collection(Collection.from_module(_mirror, name="mirror"))
    image = Collection("image")
    image.add_task(_image.base)
    image.add_task(_image.verify)
    ns.add_collection(image)
    dhcp = Collection("dhcp")
    dhcp.add_task(_dhcp.render_files, name="render")
    dhcp.add_task(_dhcp.install_server, name="install")
    dhcp.add_task(_dhcp.verify)
    dhcp.add_task(_dhcp.schema)
    ns.add_collection(dhcp)
    download = Collection("download")
    download.add_task(_download.bottlerocket)
    download.add_task(_download.hook)
    ns.add_collection(download)
    vsphere = Collection("vsphere")
    vsphere.add_task(_vsphere.setup_user, name="setup-user")
    vsphere.add_task(_vsphere.thumbprint)
    ns.add_collection(vsphere)
    template = Collection("template")
    template.add_task(_vsphere.import_ova, name="import")
    template.add_task(_vsphere.tag)
    template.add_task(_vsphere.validate)
    ns.add_collection(template)
    cluster = Collection("cluster")
    cluster.add_task(_vsphere.cluster_validate, name="validate")
    ns.add_collection(cluster)
    host = Collection("host")
    host.add_task(_host.prepare)
    ns.add_collection(host)
    return ns


namespace = make_namespace()
