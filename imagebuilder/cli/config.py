"""``config.*``: the provider config files (spec 2.3)."""

from __future__ import annotations

import json

from invoke.context import Context

from imagebuilder.cli import flags
from imagebuilder.cli._common import cli_task, print_json, task
from imagebuilder.core.errors import InputError, did_you_mean


def _provider_name(value: str) -> str:
    from imagebuilder.providers.registry import config_models
    from imagebuilder.release.catalog import load_catalog

    name = load_catalog().provider(value, flag="--provider").name
    if name not in config_models():
        raise InputError(f"no config model for {value}{did_you_mean(value, config_models())}", field="--provider")
    return name


@task(
    help={
        "provider": "{=providers}",
        "dest": "write the schema to this file instead of printing it",
        "customize": "the schema of customize.yaml (spec 4.8) instead of a provider config",
    },
)
@cli_task
def schema(c: Context, provider: str = "", dest: str = "", customize: bool = False) -> None:
    """Print the JSON Schema of a provider config file (or of customize.yaml), for editors.

    Examples:
        image-builder config.schema --provider vsphere
        image-builder config.schema --customize
    """
    if customize and provider:
        raise InputError("give --provider or --customize, not both", field="--customize")
    target = flags.dest_file(dest, "--dest") if dest else None
    if provider:  # the name first, from the catalog: a mistyped --provider is answered before the models load
        from imagebuilder.release.catalog import load_catalog

        load_catalog().provider(provider, flag="--provider")
    from imagebuilder.core.files import atomic_write
    from imagebuilder.customization.model import CustomizeFile
    from imagebuilder.plan.config import json_schema
    from imagebuilder.providers.registry import config_models

    if customize:
        data = CustomizeFile.model_json_schema()
    else:
        name = _provider_name(flags.required(provider, "--provider", f"one of {', '.join(config_models())}"))
        data = json_schema(config_models()[name])
    if target:
        with atomic_write(target) as fh:
            json.dump(data, fh, indent=2)
            fh.write("\n")
        print(f"wrote {dest}")
    else:
        print_json(data)
