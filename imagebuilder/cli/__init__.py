"""The task namespace shared by ``invoke`` (through tasks.py) and the ``image-builder`` program.

One module per namespace, each collected the same way (``Collection.from_module``): the modules of
:data:`TOP_LEVEL` give the top-level tasks (``build``, ``lint``...), every module of :data:`NAMESPACES` a namespace
named after it (``template.import``...). Each task parses flags, calls one library function and prints.
"""

from __future__ import annotations

from types import ModuleType

from invoke.collection import Collection

from imagebuilder.cli import (
    ami,
    attest,
    build,
    cloudstack,
    cluster,
    config,
    demo,
    dev,
    dhcp,
    docs,
    download,
    host,
    image,
    mirror,
    nutanix,
    preflight,
    release,
    repo,
    serve,
    template,
    vsphere,
)

TOP_LEVEL: tuple[ModuleType, ...] = (demo, dev, docs, preflight, serve)
NAMESPACES: tuple[ModuleType, ...] = (
    ami,
    attest,
    build,  # build (its default task) and build.matrix
    cloudstack,
    cluster,
    config,
    dhcp,
    download,
    host,
    image,
    mirror,
    nutanix,
    release,
    repo,
    template,
    vsphere,
)


def make_namespace() -> Collection:
    ns = Collection()
    for module in TOP_LEVEL:
        for t in Collection.from_module(module).tasks.values():
            ns.add_task(t)
    for module in NAMESPACES:
        ns.add_collection(Collection.from_module(module, name=module.__name__.rpartition(".")[2]))
    return ns


namespace = make_namespace()
