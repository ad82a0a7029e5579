"""Package mirrors for image builds, read from the host's own configuration at run time.

Nothing here names a registry or a mirror:

- **apt**: a Debian base is bootstrapped from the first Debian mirror of the host's apt
  sources (:func:`sandfleet.images.debootstrap.host_mirror`), and keeps it in its
  ``/etc/apt/sources.list``, so ``RUN apt-get install`` in a task image uses it.
- **pip and uv**: every ``RUN`` step gets the host pip's index configuration (``pip config
  list``: ``index-url``, ``extra-index-url``, ``trusted-host``, from its config files and
  ``PIP_*`` variables) as ``PIP_INDEX_URL``/``PIP_EXTRA_INDEX_URL``/``PIP_TRUSTED_HOST`` and
  ``UV_INDEX_URL``/``UV_EXTRA_INDEX_URL``, so ``pip install`` and ``uv pip install`` go
  where the host's pip goes. Only http(s) indexes are passed (a ``file://`` index or a
  ``find-links`` folder of the host is not inside the image). None of it is part of the
  image or its hash. The host's proxy variables are passed on too.
- **Certificates**: where the host's pip trusts a CA bundle of its own (``cert``, or
  ``SSL_CERT_FILE``/``REQUESTS_CA_BUNDLE``), as behind a TLS-intercepting proxy, that file is
  bound read-only into each ``RUN`` step at ``/tmp/.sandfleet-host-ca.crt`` (the step's private
  ``/tmp``, never part of the layer) and named by ``PIP_CERT``, ``SSL_CERT_FILE`` (uv, Python),
  ``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE`` and ``GIT_SSL_CAINFO``.
- A failed install names what it was installing (:func:`install_failure`), and says when
  the build had no network or the mirror could not be reached.
"""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
import sys
from pathlib import Path

from sandfleet.settings import current as current_settings
from sandfleet.settings import env_var

PROXY_VARS = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
NETWORK_ERRORS = ("Could not resolve", "Temporary failure in name resolution", "Temporary failure resolving",
                  "Network is unreachable", "Failed to establish a new connection", "Connection refused",
                  "Failed to fetch", "No route to host", "dns error", "failed to lookup address",
                  "Connection timed out", "error sending request", "NewConnectionError")


@functools.cache
def pip_config() -> dict[str, str]:
    """The host pip's effective settings (``pip config list``), keyed without the scope:
    ``index-url``, ``extra-index-url``, ... Empty when pip can't say."""
    try:
        proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"^[^.]*\.([a-z-]+)=(.*)$", line.strip())
        if m:
            value = m.group(2).strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            out.setdefault(m.group(1), value)  # pip lists the winning scope first
    return out


def _http(values: str) -> list[str]:
    return [v for v in values.split() if re.match(r"^https?://", v)]


CA_NAME = ".sandfleet-host-ca.crt"
"""The host's CA bundle inside a RUN step: ``/tmp/<CA_NAME>``."""


def host_ca_bundle() -> Path | None:
    """The CA bundle the host's pip (or Python's TLS) is configured to trust, if any."""
    settings = current_settings()
    for value in (pip_config().get("cert"), settings.ssl_cert_file, settings.requests_ca_bundle):
        if value and Path(value).is_file():
            return Path(value).resolve()
    return None


def build_files() -> dict[str, Path]:
    """Host files a RUN step gets at ``/tmp/<name>`` (see :func:`build_env`)."""
    ca = host_ca_bundle()
    return {CA_NAME: ca} if ca is not None else {}


def build_env() -> dict[str, str]:
    """Environment for ``RUN`` steps: the host's pip/uv indexes, CA bundle and proxy variables."""
    cfg = pip_config()
    env: dict[str, str] = {}
    if host_ca_bundle() is not None:
        inside = f"/tmp/{CA_NAME}"
        for var in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO"):
            env[var] = inside
    index = _http(cfg.get("index-url", ""))
    extra = _http(cfg.get("extra-index-url", ""))
    trusted = cfg.get("trusted-host", "").split()
    if index:
        env["PIP_INDEX_URL"] = env["UV_INDEX_URL"] = index[0]
    if extra:
        env["PIP_EXTRA_INDEX_URL"] = env["UV_EXTRA_INDEX_URL"] = " ".join(extra)
    if trusted:
        env["PIP_TRUSTED_HOST"] = " ".join(trusted)
        env["UV_INSECURE_HOST"] = " ".join(trusted)
    for var in PROXY_VARS:  # the host's own proxy variables, passed on
        value = env_var(var)
        if value:
            env[var] = value
    return env


_INSTALLERS = (
    ("apt-get install", re.compile(r"^(?:apt-get|apt)\s+(?:-\S+\s+)*install\b(.*)$")),
    ("uv pip install", re.compile(r"^uv\s+pip\s+install\b(.*)$")),
    ("uv add", re.compile(r"^uv\s+add\b(.*)$")),
    ("pip install", re.compile(r"^(?:pip3?|python3?(?:\.\d+)?\s+-m\s+pip)\s+install\b(.*)$")),
)
_TAKES_VALUE = {"-r", "--requirement", "-c", "--constraint", "-i", "--index-url", "--extra-index-url", "-t",
                "--target", "--prefix", "--root", "-f", "--find-links", "-o", "--option", "--python", "-p",
                "--trusted-host", "--default-release", "-e", "--editable"}


def installs(command: str) -> list[tuple[str, list[str]]]:
    """The package installs a shell command makes: ``[(installer, [package, ...]), ...]``
    (``-r FILE`` shows as ``requirements from FILE``)."""
    found = []
    for part in re.split(r"&&|\|\||;|\||\n", command):
        try:
            words = shlex.split(part.strip())
        except ValueError:
            words = part.split()
        while words and (words[0] in ("sudo", "env", "exec", "command") or "=" in words[0]):
            words = words[1:]
        text = " ".join(words)
        for name, pattern in _INSTALLERS:
            m = pattern.match(text)
            if not m:
                continue
            pkgs, args = [], m.group(1).split()
            i = 0
            while i < len(args):
                a = args[i]
                if a in ("-r", "--requirement") and i + 1 < len(args):
                    pkgs.append(f"requirements from {args[i + 1]}")
                if a in _TAKES_VALUE:
                    i += 2
                    continue
                if not a.startswith("-"):
                    pkgs.append(a)
                i += 1
            if pkgs:
                found.append((name, pkgs))
            break
    return found


def install_failure(command: str, output: str, *, network: bool) -> str | None:
    """Why a failed ``RUN`` failed, when it installs packages: naming them, and saying when
    the build had no network or the mirror was unreachable. None when it installs nothing."""
    found = installs(command)
    if not found:
        return None
    what = "; ".join(f"{name} {', '.join(pkgs)}" for name, pkgs in found)
    if not network:
        return (f"{what}: this build has no network (user-mode networking needs pasta and nft), "
                "so the packages can't be fetched")
    if any(marker in output for marker in NETWORK_ERRORS):
        return f"{what}: the package mirror could not be reached (offline?), so the packages can't be fetched"
    if "externally-managed-environment" in output:
        return f"{what}: the base keeps Debian's EXTERNALLY-MANAGED marker (see the image's warnings)"
    if re.search(r"Unable to locate package|No matching distribution|No solution found|not found in the package "
                 r"registry|Could not find a version", output):
        return f"{what}: a package is not in the configured mirror (or the apt lists are missing: apt-get update)"
    return f"{what} failed"
