"""How :meth:`Agent.connect <switchboard.Agent.connect>` finds the fabric and signs in, as NATS
users do: a URL, a credentials file (``creds``), an NKey seed (``nkey_seed``: the per-agent
``agents/<id>.nk`` that ``switchboard nats-config`` writes), or a NATS CLI context by name
(``context``: ``$XDG_CONFIG_HOME/nats/context/<name>.json``, default
``~/.config/nats/context/``, the files ``nats context add`` writes).

A context's fields (the NATS context format, ADR-21): ``url`` (comma-separated servers),
``creds``, ``nkey``, ``user`` and ``password``, ``token``, ``ca``, ``cert`` and ``key`` (TLS),
``tls_first``. ``creds`` and ``nkey`` are paths (``~`` expanded) or ``file://``, ``env://NAME``
or ``data:;base64,…`` URIs. ``inbox_prefix`` and the JetStream fields are ignored (an agent's
replies always arrive under ``_INBOX.<agent_id>``); ``user_jwt``, ``nsc`` and the ``nsc://`` /
``op://`` URIs are refused with a clear error (use a creds file).
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import re
import ssl
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote_to_bytes

#: Where a seed file's content must match: an NKey seed (``S`` then 57 base32 characters).
_SEED = re.compile(r"S[A-Z2-7]{57}")
#: The environment variable the nats CLI reads a context name from.
CONTEXT_ENV = "NATS_CONTEXT"
#: What a context without ``url`` connects to (the context format's default).
CONTEXT_DEFAULT_URL = "nats://localhost:4222"


class ConfigError(ValueError):
    """A connection setting that cannot be used: a context that does not exist or is not
    JSON, a context name that is not a plain name, a credentials or seed file that is
    missing or holds no seed. Raised by :meth:`Agent.connect` before it connects."""


def context_dir() -> pathlib.Path:
    """Where the NATS CLI keeps its contexts: ``$XDG_CONFIG_HOME/nats/context``, else
    ``~/.config/nats/context``."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return pathlib.Path(base) / "nats" / "context"


def context_path(name: str) -> pathlib.Path:
    """The file of the context ``name`` (a plain name: no ``/``, ``\\`` or ``..``)."""
    if (not isinstance(name, str) or not name.strip() or name != name.strip()
            or any(c in name for c in "/\\\0") or ".." in name or name.startswith(".")):
        raise ConfigError(f"a NATS context is named by a plain name (no `/`, `\\` or `..`), "
                          f"not {name!r}")
    return context_dir() / f"{name}.json"


def load_context(name: str) -> dict[str, Any]:
    """The context ``name`` as its JSON file holds it."""
    path = context_path(name)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"no NATS context `{name}`: {path} does not exist "
                          "(`nats context add` writes one)") from None
    except OSError as exc:
        raise ConfigError(f"NATS context `{name}`: cannot read {path}: {exc}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"NATS context `{name}`: {path} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"NATS context `{name}`: {path} holds no JSON object")
    for key, value in data.items():
        if value is not None and not isinstance(value, (str, bool)):
            raise ConfigError(f"NATS context `{name}`: `{key}` is not a string")
    return data


def _material(value: str, what: str) -> tuple[pathlib.Path | None, bytes | None]:
    """A context's ``creds``/``nkey`` value: a file (a path or ``file://``), or the bytes of
    an ``env://`` or ``data:`` URI."""
    if value.startswith("file://"):
        return pathlib.Path(unquote_to_bytes(value[len("file://"):]).decode()), None
    if value.startswith("env://"):
        variable = value[len("env://"):]
        if variable not in os.environ:
            raise ConfigError(f"{what}: the environment variable {variable} is not set")
        return None, os.environ[variable].encode()
    if value.startswith("data:"):
        meta, _, payload = value[len("data:"):].partition(",")
        try:
            data = (base64.b64decode(payload, validate=True) if meta.endswith(";base64")
                    else unquote_to_bytes(payload))
        except ValueError as exc:
            raise ConfigError(f"{what}: a data: URI that does not decode: {exc}") from None
        return None, data
    if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*://", value):
        raise ConfigError(f"{what}: {value.split('://')[0]}:// is not supported here; give a "
                          "file (a path or file://), env:// or data:")
    return pathlib.Path(os.path.expanduser(value)), None


def _file(path: pathlib.Path, what: str) -> pathlib.Path:
    if not path.is_file():
        raise ConfigError(f"{what}: {path} does not exist or is not a file")
    return path


def _seed(text: str, where: str) -> str:
    seed = text.strip()
    if not _SEED.fullmatch(seed):
        raise ConfigError(f"{where} holds no NKey seed (a seed is `S` and 57 more characters, "
                          "as in the .nk files `switchboard nats-config` writes)")
    return seed


def seed_option(nkey_seed: str | os.PathLike[str]) -> str:
    """``nkey_seed`` as the seed itself: the seed, or a file holding it (e.g.
    ``agents/<id>.nk``)."""
    if isinstance(nkey_seed, str) and _SEED.fullmatch(nkey_seed.strip()):
        return nkey_seed.strip()
    path = _file(pathlib.Path(os.path.expanduser(os.fspath(nkey_seed))), "nkey_seed")
    try:
        return _seed(path.read_text(), f"nkey_seed: {path}")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"nkey_seed: cannot read {path}: {exc}") from None


def _raw_credentials(data: bytes, what: str) -> Any:
    try:
        from nats.aio.client import RawCredentials
    except ImportError:  # nats-py before RawCredentials
        raise ConfigError(f"{what}: credentials from env:// or data: need a newer nats-py; "
                          "give a file") from None
    return RawCredentials(data.decode())


def nats_options(nats_url: str | Sequence[str] | None, *,
                 creds: str | os.PathLike[str] | None = None,
                 nkey_seed: str | os.PathLike[str] | None = None,
                 context: str | None = None) -> tuple[list[str], dict[str, Any]]:
    """The servers and the sign-in options of ``nats.connect`` for these settings. The URL
    given wins over the context's; ``creds`` or ``nkey_seed`` given win over the context's
    sign-in. Without a URL or a context, the context ``$NATS_CONTEXT`` names is used."""
    if creds is not None and nkey_seed is not None:
        raise ConfigError("sign in with creds or with nkey_seed, not both")
    if context is None and nats_url is None and os.environ.get(CONTEXT_ENV):
        context = os.environ[CONTEXT_ENV]
    settings = load_context(context) if context is not None else {}
    where = f"NATS context `{context}`"

    if nats_url is not None:
        servers = [nats_url] if isinstance(nats_url, str) else list(nats_url)
    elif context is not None:
        url = settings.get("url") or CONTEXT_DEFAULT_URL
        servers = [u.strip() for u in url.split(",") if u.strip()]
    else:
        raise ConfigError("no NATS server: give the URL, or a NATS context "
                          f"(context=\"name\" or ${CONTEXT_ENV})")
    if not servers:
        raise ConfigError("no NATS server: the URL list is empty")

    options: dict[str, Any] = {}
    if creds is not None:
        options["user_credentials"] = str(_file(
            pathlib.Path(os.path.expanduser(os.fspath(creds))), "creds"))
    elif nkey_seed is not None:
        options["nkeys_seed_str"] = seed_option(nkey_seed)
    elif settings:
        for unsupported in ("user_jwt", "nsc"):
            if settings.get(unsupported):
                raise ConfigError(f"{where}: `{unsupported}` is not supported by the Python "
                                  "SDK; give `creds` (a credentials file)")
        if settings.get("creds"):
            path, data = _material(settings["creds"], f"{where}: creds")
            options["user_credentials"] = (str(_file(path, f"{where}: creds")) if path
                                           else _raw_credentials(data, f"{where}: creds"))
        elif settings.get("nkey"):
            path, data = _material(settings["nkey"], f"{where}: nkey")
            if path is not None:
                _file(path, f"{where}: nkey")
                try:
                    text = path.read_text()
                except (OSError, UnicodeDecodeError) as exc:
                    raise ConfigError(f"{where}: nkey: cannot read {path}: {exc}") from None
            else:
                text = data.decode(errors="replace")
            options["nkeys_seed_str"] = _seed(text, f"{where}: nkey")
        if settings.get("user"):
            options["user"] = settings["user"]
            options["password"] = settings.get("password") or ""
        if settings.get("token"):
            options["token"] = settings["token"]

    if settings.get("ca") or settings.get("cert") or settings.get("key") \
            or settings.get("tls_first"):
        options["tls"] = _tls(settings, where)
        if settings.get("tls_first"):
            options["tls_handshake_first"] = True
    return servers, options


def _tls(settings: dict[str, Any], where: str) -> ssl.SSLContext:
    def path(key: str) -> str | None:
        value = settings.get(key)
        return str(_file(pathlib.Path(os.path.expanduser(value)), f"{where}: {key}")) \
            if value else None

    ca, cert, key = path("ca"), path("cert"), path("key")
    if key and not cert:
        raise ConfigError(f"{where}: `key` needs `cert`")
    try:
        tls = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
        if cert:
            tls.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"{where}: the TLS files do not load: {exc}") from None
    return tls
