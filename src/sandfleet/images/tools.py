"""Files of well-known tool images, taken from the tool's package instead of the image.

sandfleet can't pull images. ``COPY --from=ghcr.io/astral-sh/uv[:tag] /uv /uvx /bin/`` (the
pattern of Harbor's task template) copies two static binaries, and the ``uv`` package on PyPI
ships the very same binaries in its wheel (``uv-<version>.data/scripts/uv`` and ``uvx``).
So the builder downloads that wheel with the host's own pip -- whatever index, mirror and
certificate configuration the host's pip has, read at run time -- for the image's
architecture, and lays its two binaries out as the image has them: ``/uv``, ``/uvx`` (the
distroless image) and ``/usr/local/bin/uv``, ``/usr/local/bin/uvx`` (its ``-python``/Debian
variants). Any other path of such an image is refused with the path named; any other image is
refused by the Dockerfile parser with the image named.

The tag chooses the version: ``latest`` (or none) the newest, ``0.5.11`` exactly that,
``0.5`` the newest 0.5.x; a variant suffix (``0.5.11-python3.12-bookworm``) keeps its version.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from sandfleet.errors import ImageBuildError

TOOL_IMAGES = ("ghcr.io/astral-sh/uv",)
"""Images whose files come from a package (``COPY --from``)."""
UV_PATHS = ("uv", "uvx", "usr/local/bin/uv", "usr/local/bin/uvx", "bin/uv", "bin/uvx", "usr/bin/uv", "usr/bin/uvx")
PLATFORMS = {"amd64": ("manylinux_2_17_x86_64", "manylinux2014_x86_64"),
             "arm64": ("manylinux_2_17_aarch64", "manylinux2014_aarch64")}


def _split(ref: str) -> tuple[str, str]:
    ref = ref.split("@", 1)[0]
    name, _, tag = ref.rpartition(":") if ":" in ref.rsplit("/", 1)[-1] else (ref, "", "latest")
    return name.lower(), tag


def is_tool_image(ref: str) -> bool:
    """Whether ``COPY --from=ref`` can be served from a package."""
    return _split(ref)[0] in TOOL_IMAGES


def uv_requirement(ref: str) -> str:
    """The pip requirement the uv image's tag stands for."""
    tag = _split(ref)[1]
    match = re.match(r"^v?(\d+(?:\.\d+){0,2})(?:-|$)", tag)
    if tag == "latest" or not match:
        return "uv"
    version = match.group(1)
    return f"uv=={version}" if version.count(".") == 2 else f"uv=={version}.*"


def _pip() -> list[str]:
    """The host's pip: this interpreter's, else the one on PATH (both read the host's pip
    configuration files and ``PIP_*`` variables)."""
    try:
        import pip  # noqa: F401
    except ImportError:
        found = shutil.which("pip3") or shutil.which("pip")
        if not found:
            raise ImageBuildError("COPY --from the uv image needs pip on this host to fetch the uv package") from None
        return [found]
    return [sys.executable, "-m", "pip"]


def tool_tree(ref: str, target_arch: str, cache: Path, *, file: str | None = None, line: int | None = None) -> Path:
    """A folder holding the image ``ref``'s ``uv`` and ``uvx`` (see :func:`tool_path` for where
    the image has them), cached under ``cache`` by the requirement and architecture."""
    requirement = uv_requirement(ref)
    platforms = PLATFORMS.get(target_arch)
    if platforms is None:
        raise ImageBuildError(f"COPY --from={ref}: no uv wheel for architecture {target_arch}", file=file, line=line)
    key = re.sub(r"[^A-Za-z0-9.=*_-]", "_", f"{requirement}-{target_arch}").replace("*", "x")
    tree = cache / "tools" / key
    if (tree / ".complete").exists() and requirement != "uv":  # "uv" (latest) is resolved each time
        return tree
    with tempfile.TemporaryDirectory(prefix="sandfleet-uv-") as tmp:
        cmd = [*_pip(), "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
               "--dest", tmp]
        for plat in platforms:
            cmd += ["--platform", plat]
        proc = subprocess.run([*cmd, requirement], capture_output=True, text=True, timeout=600)
        wheels = sorted(Path(tmp).glob("uv-*.whl"))
        if proc.returncode != 0 or not wheels:
            out = (proc.stdout + proc.stderr).strip()
            offline = any(w in out for w in ("Could not resolve", "Failed to establish", "Network is unreachable",
                                             "Temporary failure", "No matching distribution", "ConnectionError"))
            why = "offline, or the host's pip index has no such version" if offline else "pip download failed"
            raise ImageBuildError(f"COPY --from={ref}: the package {requirement} (which ships the uv image's "
                                  f"uv and uvx) could not be fetched with the host's pip ({why}): {out[-600:]}",
                                  file=file, line=line)
        staged = Path(tmp) / "tree"
        with zipfile.ZipFile(wheels[0]) as wheel:
            members = {Path(n).name: n for n in wheel.namelist() if re.match(r"^uv-[^/]+\.data/scripts/uvx?$", n)}
            if set(members) != {"uv", "uvx"}:
                raise ImageBuildError(f"COPY --from={ref}: {wheels[0].name} holds no uv and uvx binaries",
                                      file=file, line=line)
            staged.mkdir()
            for name, member in members.items():
                (staged / name).write_bytes(wheel.read(member))
                (staged / name).chmod(0o755)
        (staged / ".complete").write_text(wheels[0].name + "\n")
        tree.parent.mkdir(parents=True, exist_ok=True)
        final = tree.with_name(tree.name + f".new-{os.getpid()}")
        shutil.rmtree(final, ignore_errors=True)
        shutil.copytree(staged, final, symlinks=True)
        shutil.rmtree(tree, ignore_errors=True)
        final.rename(tree)
    return tree


def tool_path(ref: str, path: str, *, file: str | None = None, line: int | None = None) -> str:
    """The file of :func:`tool_tree` that ``path`` of the image ``ref`` is, or ImageBuildError
    naming ``path`` when the package does not provide it."""
    rel = "/".join(p for p in path.split("/") if p not in ("", "."))
    if rel not in UV_PATHS:
        raise ImageBuildError(f"COPY --from={ref}: {path} is not part of what the uv package provides "
                              f"(only /uv, /uvx and /usr/local/bin/uv, /usr/local/bin/uvx)", file=file, line=line)
    return rel.rsplit("/", 1)[-1]
