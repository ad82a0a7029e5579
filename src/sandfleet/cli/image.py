"""``sandfleet image ...``: build and list images."""

from __future__ import annotations

import json
import time

import click

from sandfleet.errors import SandfleetError


@click.group()
def image() -> None:
    """Build and list environment images."""


@image.command("build")
@click.option("--suite", default="bookworm", show_default=True, help="Debian suite of a base image.")
@click.option("--arch", "target_arch", default=None, help="Target arch (default: this host's).")
@click.option("--packages", default=None, help="Comma-separated apt packages (default: a coding-agent set).")
@click.option("--mirror", default=None, help="apt mirror (default: from the host's apt sources).")
@click.option("--python-flavour", is_flag=True,
              help="Give the base the official python image's semantics (no EXTERNALLY-MANAGED, python on PATH).")
@click.option("--task", "task_dir", default=None, type=click.Path(exists=True, file_okay=False),
              help="Build the environment image of this task folder instead.")
@click.option("--strict-bases", is_flag=True, help="With --task: refuse a substituted base instead of warning.")
@click.option("--accept-older-versions", "accept_older", is_flag=True,
              help="With --task: a language base asking for a version newer than Debian ships (golang:1.26) is "
              "built with the newest Debian has instead of refused.")
@click.option("--page-size", "page_size", default=None,
              help="Flag ELF files of the image that a kernel with pages this large (e.g. 64k) can't load.")
def build(suite: str, target_arch: str | None, packages: str | None, mirror: str | None, python_flavour: bool,
          task_dir: str | None, strict_bases: bool, page_size: str | None, accept_older: bool = False) -> None:
    """Build a Debian base with debootstrap, or a task's environment image (--arch arm64: for
    arm64, under qemu-user emulation on this host)."""
    from sandfleet.images import emulation

    t0 = time.monotonic()
    try:
        pages = emulation.parse_page_size(page_size) if page_size else None
        if target_arch:
            target_arch = emulation.normalize(target_arch)
            emulation.set_target(target_arch)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    try:
        if task_dir:
            from sandfleet.tasks import load_task
            from sandfleet.tasks.images import build_task_image

            with emulation.emulation(target_arch or emulation.host_arch()):  # RUN steps of a foreign arch
                img = build_task_image(load_task(task_dir), strict=strict_bases, accept_older=accept_older)
        else:
            from sandfleet.images.debootstrap import DEFAULT_PACKAGES, build_base

            pkgs = tuple(p for p in packages.split(",") if p) if packages is not None else DEFAULT_PACKAGES
            img = build_base(suite, pkgs, target_arch=target_arch, mirror=mirror,
                             flavour="python" if python_flavour else None)
    except SandfleetError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"{img.hash}  {img.name}  ({time.monotonic() - t0:.1f}s)")
    for warning in img.meta.get("warnings") or []:  # type: ignore[attr-defined]
        click.echo(f"warning: {warning}", err=True)
    if pages:
        bad = emulation.page_size_problems(img.lowers, pages)
        for path, align in sorted(bad.items())[:50]:
            click.echo(f"page size {pages // 1024}k: {path}: PT_LOAD aligned to {align} bytes", err=True)
        click.echo(f"page size {pages // 1024}k: {len(bad)} ELF file(s) can't load with {pages // 1024}K pages"
                   + (" (first 50 shown)" if len(bad) > 50 else ""), err=True)
        if bad:
            raise SystemExit(1)


@image.command("ls")
@click.option("--json", "as_json", is_flag=True)
def ls(as_json: bool) -> None:
    """List the host image and every cached image."""
    from sandfleet.imagestore import list_images

    imgs = list_images()
    if as_json:
        click.echo(json.dumps([i.to_json() for i in imgs], indent=2))
        return
    click.echo(f"{'HASH':16} {'NAME':36} {'ARCH':6} {'PAGE':>5} BASE")
    for i in imgs:
        click.echo(f"{i.hash[:16]:16} {i.name[:36]:36} {i.arch:6} {i.page_size:>5} {i.base}")
