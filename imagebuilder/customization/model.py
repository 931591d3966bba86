"""The customization file (``customize.yaml``, spec 4.8): what a node image gets beyond the build.

One file feeds the three ways to apply it (a vSphere template, a local image, a build): the user that logs in to
apply it, CA certificates to trust, private registries and their credentials, extra packages. Everything is checked
here, before any VM boots: every certificate parsed as X.509, every registry a ``host[:port]``, every package name a
package name, and every secret read from where the file says (an environment variable or a file) so that a missing
one fails in seconds. Secrets stay :class:`~pydantic.SecretStr` from here on; only the role's 0600 variables file
ever holds them in clear.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, field_validator, model_validator

from imagebuilder.core import grammar, untrusted
from imagebuilder.core.errors import InputError, InputErrors
from imagebuilder.core.files import load_json_object, load_yaml_mapping, read_text
from imagebuilder.core.validation import StrictModel, validated

#: the environment variable that carries registry credentials to the role (see ansible/roles/customize)
REGISTRY_AUTH_ENV = "IMAGE_BUILDER_REGISTRY_AUTH"
#: the four guestinfo properties cloud-init's VMware datasource reads (spec 4.8 step 3)
GUESTINFO_KEYS = (
    "guestinfo.metadata",
    "guestinfo.metadata.encoding",
    "guestinfo.userdata",
    "guestinfo.userdata.encoding",
)
GUESTINFO_ENCODING = "gzip+base64"
_CERT_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def _digest(pem: str) -> str:
    """A short content digest for a CA file's name on the node."""
    return hashlib.sha256(pem.encode()).hexdigest()[:12]


#: OpenSSH public key types a customization user may log in with
KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa")
_KEY_BLOB = re.compile(r"[A-Za-z0-9+/]+={0,3}")
#: Debian and RPM package names (Debian policy 5.6.1; RPM allows upper case and '_')
PACKAGE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9+._-]{0,127}")
_ENV_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def _public_key(text: str) -> str:
    if any(c in text.strip() for c in "\r\n\x00"):
        raise ValueError("must be one line (one key)")
    parts = text.strip().split()
    if len(parts) < 2 or parts[0] not in KEY_TYPES or not _KEY_BLOB.fullmatch(parts[1]):
        raise ValueError(f"must be an OpenSSH public key line ({', '.join(KEY_TYPES)} then base64)")
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except ValueError:
        raise ValueError("the key's base64 does not decode") from None
    # the blob starts with its own type, length-prefixed: a key pasted under the wrong type is refused
    size = int.from_bytes(blob[:4], "big")
    if blob[4 : 4 + size].decode(errors="replace") != parts[0]:
        raise ValueError(f"the key's blob is not a {parts[0]} key")
    return f"{parts[0]} {parts[1]}"  # the comment is dropped: it may carry a user's mail address or host name


class User(StrictModel):
    name: str = Field("image-builder", description="the user the customization logs in as (removed afterwards)")
    ssh_public_key: str | None = Field(
        None, description="its authorized key; absent: a key pair is made for the run and deleted after"
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return grammar.linux_user(value)

    @field_validator("ssh_public_key")
    @classmethod
    def _key(cls, value: str | None) -> str | None:
        return None if value is None else _public_key(value)


class Registry(StrictModel):
    """Credentials of one registry. Each secret is given at most one way: inline, ``*_env`` or ``*_file``."""

    username: str | None = Field(None, description="registry user name")
    password: SecretStr | None = Field(None, description="password (prefer password_env or password_file)")
    password_env: str | None = Field(None, description="environment variable holding the password")
    password_file: str | None = Field(None, description="file holding the password (relative to this file)")
    auth: SecretStr | None = Field(None, description="base64 of user:password; computed when absent")
    identitytoken: SecretStr | None = Field(None, description="an identity token instead of a password")
    identitytoken_env: str | None = Field(None, description="environment variable holding the identity token")
    identitytoken_file: str | None = Field(None, description="file holding the identity token")

    @field_validator("password_env", "identitytoken_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_VAR.fullmatch(value):
            raise ValueError("must be an environment variable name")
        return value

    @model_validator(mode="after")
    def _one_way_each(self) -> Registry:
        for secret in ("password", "identitytoken"):
            given = [f"{secret}{s}" for s in ("", "_env", "_file") if getattr(self, f"{secret}{s}") is not None]
            if len(given) > 1:
                raise ValueError(f"give {secret} one way only, not {' and '.join(given)}")
        has_password = any(getattr(self, f"password{s}") is not None for s in ("", "_env", "_file"))
        if has_password and not self.username:
            raise ValueError("a password needs a username")
        return self


class CustomizeFile(StrictModel):
    user: User = Field(default_factory=User, description="the user that applies the customization")
    ca_certificates: list[str] = Field(
        default_factory=list, description="PEM files of CA certificates to trust (relative to this file)"
    )
    registries: dict[str, Registry] = Field(default_factory=dict, description="credentials per registry host[:port]")
    packages: list[str] = Field(default_factory=list, description="extra packages, from the configured mirror")

    @field_validator("registries")
    @classmethod
    def _hosts(cls, value: dict[str, Registry]) -> dict[str, Registry]:
        for host in value:
            grammar.host_port(host)
            if host.startswith("["):  # containerd's TOML parser refuses ']' in a quoted table key
                raise ValueError(f"{host}: containerd cannot read an IPv6 literal as a registry key; use its DNS name")
        return value

    @field_validator("packages")
    @classmethod
    def _packages(cls, value: list[str]) -> list[str]:
        for name in value:
            if not PACKAGE_NAME.fullmatch(name):
                raise ValueError(f"{name[:60]!r} is not a package name")
        return list(dict.fromkeys(value))


_MODE = re.compile(r"0?[0-7]{3}")
_OWNER = re.compile(r"[a-z_][a-z0-9_-]{0,31}\$?|[0-9]{1,10}")


class AdditionalFile(StrictModel):
    """One entry of the reference tool's ``files.json`` (``additional_files_list``)."""

    src: str = Field(description="file on this host (relative paths from the list file's folder)")
    dest: str = Field(description="absolute path in the image")
    owner: str = Field("root", description="user that owns it in the image (name or uid)")
    group: str = Field("root", description="group that owns it in the image (name or gid)")
    mode: str = Field("0644", description='permissions as an octal string, e.g. "0644"')

    @field_validator("dest")
    @classmethod
    def _dest(cls, value: str) -> str:
        parts = value.split("/")
        if not value.startswith("/") or value.endswith("/") or any(p in ("", ".", "..") for p in parts[1:]):
            raise ValueError(f"must be a normalized absolute file path in the image, got {value[:80]!r}")
        if any(ord(c) < 0x20 or c in "\x7f{}" for c in value):
            raise ValueError("may not contain control characters or braces")
        return value

    @field_validator("owner", "group")
    @classmethod
    def _owner(cls, value: str) -> str:
        if not _OWNER.fullmatch(value):
            raise ValueError(f"{value[:40]!r} is not a user or group name or id")
        return value

    @field_validator("mode", mode="before")
    @classmethod
    def _mode(cls, value: Any) -> str:
        if not isinstance(value, str) or not _MODE.fullmatch(value):
            raise ValueError(f'must be an octal mode as a string, e.g. "0644", got {value!r}')
        return value.rjust(4, "0")


class AdditionalFilesList(StrictModel):
    additional_files_list: list[AdditionalFile] = Field(description="files copied into the image")


def load_additional_files(path: str | Path) -> list[dict[str, str]]:
    """The reference tool's ``files.json``: each ``src`` must be a readable file here; every problem at once."""
    path = Path(path)
    model = validated(AdditionalFilesList, load_json_object(path, "additional files list"), path)
    problems: list[InputError] = []
    files: list[dict[str, str]] = []
    for i, entry in enumerate(model.additional_files_list):
        src = Path(entry.src).expanduser()
        src = src if src.is_absolute() else path.parent / src
        if not src.is_file():
            problems.append(
                InputError(f"{entry.src!r} is not a file", source=path, field=f"additional_files_list[{i}].src")
            )
            continue
        files.append({**entry.model_dump(), "src": str(src.resolve())})
    dests = [f["dest"] for f in files]
    problems += [
        InputError(f"{d} is given twice", source=path, field="additional_files_list")
        for d in dict.fromkeys(d for d in dests if dests.count(d) > 1)
    ]
    if problems:
        raise InputErrors(problems)
    return files


def build_extras(
    *,
    source: Path,
    packages: list[str],
    files_list: Path | None,
    repo_file: Path | None,
    repo_suffix: str,
    disable_public_repos: bool,
) -> Customization | None:
    """The reference tool's build options (extra packages, additional files, extra repositories) as a
    customization, so they go through the same role as ``build --customize``. None when there is nothing."""
    files = load_additional_files(files_list) if files_list else []
    repo = None
    if repo_file is not None:
        repo = (f"image-builder-extra{repo_suffix}", read_text(repo_file, "extra repositories file"))
    if not (packages or files or repo or disable_public_repos):
        return None
    return Customization(
        source, User(), packages=list(packages), files=files, repo_file=repo, disable_public_repos=disable_public_repos
    )


@dataclass(frozen=True)
class RegistryAuth:
    """A registry's credentials with every secret read: what the role writes into containerd's config."""

    host: str
    username: str | None
    password: SecretStr | None
    auth: SecretStr | None
    identitytoken: SecretStr | None


@dataclass(frozen=True)
class Customization:
    """A checked customization file: certificates as PEM text, secrets read."""

    source: Path
    user: User
    ca_certificates: list[tuple[str, str]] = field(default_factory=list)  # (file name, PEM bundle)
    registries: list[RegistryAuth] = field(default_factory=list)
    packages: list[str] = field(default_factory=list)
    #: files copied into the image: {src (absolute, on this host), dest, owner, group, mode}
    files: list[dict[str, str]] = field(default_factory=list)
    #: a package source file added to the image: (file name on the node, its text)
    repo_file: tuple[str, str] | None = None
    disable_public_repos: bool = False

    def merged(self, other: Customization | None) -> Customization:
        """This customization and ``other`` applied together (``other``'s user wins; lists add up)."""
        if other is None:
            return self
        return Customization(
            other.source,
            other.user,
            [*self.ca_certificates, *other.ca_certificates],
            [*self.registries, *(r for r in other.registries if r.host not in {x.host for x in self.registries})],
            list(dict.fromkeys([*self.packages, *other.packages])),
            [*self.files, *other.files],
            other.repo_file or self.repo_file,
            self.disable_public_repos or other.disable_public_repos,
        )

    def secret_values(self) -> list[str]:
        """Every secret, for the redactor that guards logs and messages."""
        return [
            s.get_secret_value()
            for r in self.registries
            for s in (r.password, r.auth, r.identitytoken)
            if s is not None and s.get_secret_value()
        ]

    def summary(self) -> dict[str, Any]:
        """What was customized, for manifests and plans: names and hosts, never a secret."""
        return {
            "user": self.user.name,
            "ca_certificates": [name for name, _ in self.ca_certificates],
            "registries": [r.host for r in self.registries],
            "packages": list(self.packages),
            "files": [f["dest"] for f in self.files],
            "repositories": self.repo_file[0] if self.repo_file else None,
            "public_repositories": "disabled" if self.disable_public_repos else "kept",
        }

    def role_vars(self, *, user: str, keep_user: bool = False) -> dict[str, Any]:
        """The customize role's variables: everything but the secrets (see :meth:`secret_env`)."""
        return {
            "customize_ca_certificates": [
                # the file name is ours: a name from the customization file never becomes a path on the node. It
                # carries the bundle's digest, so customizing again converges and a second customization adds its
                # CAs beside the first one's instead of replacing a same-named file.
                {"name": f"image-builder-{_CERT_NAME.sub('-', Path(name).stem)[:40]}-{_digest(pem)}.crt", "pem": pem}
                for name, pem in self.ca_certificates
            ],
            "customize_packages": list(self.packages),
            "customize_files": list(self.files),
            "customize_repo_file": {"name": self.repo_file[0], "content": self.repo_file[1]} if self.repo_file else {},
            "customize_disable_public_repos": self.disable_public_repos,
            "customize_registries": [r.host for r in self.registries],
            "customize_registry_auth_env": REGISTRY_AUTH_ENV,
            "customize_keep_user": keep_user,
            "build_user": user,
        }

    def secret_env(self) -> dict[str, str]:
        """The registry credentials, for the Ansible controller's environment only (never a file or argv)."""
        if not self.registries:
            return {}

        def clear(s: SecretStr | None) -> str | None:
            return None if s is None else s.get_secret_value()

        auth = [
            {
                "host": r.host,
                "username": r.username,
                "password": clear(r.password),
                "auth": clear(r.auth),
                "identitytoken": clear(r.identitytoken),
            }
            for r in self.registries
        ]
        return {REGISTRY_AUTH_ENV: json.dumps(auth)}


@dataclass(frozen=True)
class SeedDocuments:
    """The two cloud-init documents of spec 4.8 step 2, as the bytes a VM reads."""

    meta_data: str
    user_data: str

    def guestinfo(self) -> dict[str, str]:
        """Spec 4.8 step 3: each document gzipped and base64-encoded, as the four guestinfo properties."""

        def encode(text: str) -> str:
            return base64.b64encode(gzip.compress(text.encode(), mtime=0)).decode()

        values = (encode(self.meta_data), GUESTINFO_ENCODING, encode(self.user_data), GUESTINFO_ENCODING)
        return dict(zip(GUESTINFO_KEYS, values, strict=True))

    @classmethod
    def from_guestinfo(cls, props: dict[str, str]) -> SeedDocuments:
        """The documents back from the four properties (what cloud-init's VMware datasource does)."""
        docs = []
        for kind in ("metadata", "userdata"):
            value = props.get(f"guestinfo.{kind}", "")
            if props.get(f"guestinfo.{kind}.encoding") in ("gzip+base64", "gz+b64"):
                value = gzip.decompress(base64.b64decode(value)).decode()
            elif props.get(f"guestinfo.{kind}.encoding") in ("base64", "b64"):
                value = base64.b64decode(value).decode()
            docs.append(value)
        return cls(docs[0], docs[1])

    def nocloud_files(self) -> dict[str, str]:
        """The same documents as a NoCloud seed: NoCloud reads the network from its own file, ``network-config``."""
        import yaml

        meta = yaml.safe_load(self.meta_data) or {}
        files = {"meta-data": self.meta_data, "user-data": self.user_data}
        if "network" in meta:
            files["network-config"] = yaml.safe_dump(meta["network"], sort_keys=False)
        return files


def seed_documents(user: str, public_keys: list[str], *, hostname: str = "image-builder-customize") -> SeedDocuments:
    """Spec 4.8 step 2 for this run: a fresh instance-id (so cloud-init runs again), the user and its key.

    Every value is checked against its grammar before it is rendered: a user name, a one-line OpenSSH key, a
    host name; the instance-id is ours.
    """
    from imagebuilder.core.render import template_env

    ctx = {
        "instance_id": f"iid-image-builder-{uuid.uuid4().hex[:12]}",
        "hostname": grammar.hostname(hostname),
        "user": grammar.linux_user(user),
        "ssh_public_keys": [_public_key(k) for k in public_keys],
    }
    env = template_env()
    return SeedDocuments(
        env.get_template("cloud-init/customize-meta-data.yaml.j2").render(ctx),
        env.get_template("cloud-init/customize-user-data.yaml.j2").render(ctx),
    )


def _certificates(path: Path) -> str:
    """The PEM text of a CA bundle, every certificate in it parsed as X.509."""
    from cryptography import x509

    text = read_text(path, "CA certificate")
    try:
        certs = x509.load_pem_x509_certificates(text.encode())
    except ValueError:
        raise ValueError("is not a PEM file of X.509 certificates") from None
    if not certs:
        raise ValueError("holds no certificate")
    return text


def _read_secret(where: str, reg: Registry, name: str, base: Path, env: dict[str, str]) -> SecretStr | None:
    inline: SecretStr | None = getattr(reg, name)
    var, file = getattr(reg, f"{name}_env"), getattr(reg, f"{name}_file")
    if var is not None:
        value = env.get(var, "")
        if not value:
            raise InputError(f"environment variable {var} is empty or unset", field=f"{where}.{name}_env")
        return SecretStr(value)
    if file is not None:  # a file the document points at: a regular file, bounded, never waited on
        text = untrusted.read_text(
            base / file, "secret file", limit=untrusted.LIMITS["small"], field=f"{where}.{name}_file"
        )
        return SecretStr(text.rstrip("\n"))
    return inline


def load_customization(path: str | Path, env: dict[str, str] | None = None) -> Customization:
    """Read and check ``customize.yaml``; every problem of the file is reported at once (exit 2)."""
    path = Path(path)
    raw: dict[str, Any] = load_yaml_mapping(path, "customization file")
    model = validated(CustomizeFile, raw, path)
    env = dict(os.environ) if env is None else env
    base = path.parent
    problems: list[InputError] = []
    certs: list[tuple[str, str]] = []
    for i, name in enumerate(model.ca_certificates):
        try:
            certs.append((Path(name).name, _certificates(base / name)))
        except ValueError as exc:
            problems.append(InputError(f"{name}: {exc}", source=path, field=f"ca_certificates[{i}]"))
        except InputError as exc:
            problems.append(InputError(exc.detail, source=path, field=f"ca_certificates[{i}]"))
    registries: list[RegistryAuth] = []
    for host, reg in model.registries.items():
        where = f"registries.{host}"
        try:
            password = _read_secret(where, reg, "password", base, env)
            token = _read_secret(where, reg, "identitytoken", base, env)
        except InputError as exc:
            problems.append(InputError(exc.detail, source=path, field=exc.field))
            continue
        auth = reg.auth
        if auth is None and reg.username and password is not None:
            pair = f"{reg.username}:{password.get_secret_value()}"
            auth = SecretStr(base64.b64encode(pair.encode()).decode())
        registries.append(RegistryAuth(host, reg.username, password, auth, token))
    if problems:
        raise InputErrors(problems)
    return Customization(path, model.user, certs, registries, model.packages)


__all__ = [
    "AdditionalFile",
    "Customization",
    "CustomizeFile",
    "RegistryAuth",
    "SeedDocuments",
    "build_extras",
    "load_additional_files",
    "load_customization",
    "seed_documents",
]
