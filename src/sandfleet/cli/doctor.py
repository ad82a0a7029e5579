"""``sandfleet doctor``: what this host supports, and what to do about what it lacks."""

from __future__ import annotations

import json

import click

from sandfleet.doctor import report


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def doctor(as_json: bool) -> None:
    """What this host supports (bubblewrap, cgroups, KVM, QEMU, arch, page size), with advice."""
    r = report(say=lambda what: click.echo(f"doctor: probing {what}", err=True))
    if as_json:
        click.echo(json.dumps(r, indent=2))
        return
    click.echo(f"arch        {r['arch']} ({r['machine']}), page size {r['page_size']}, "
               f"{r['cpus']} CPUs, kernel {r['kernel']}")
    cg = r["cgroup"]
    click.echo(f"cgroups     {cg['version']} ({', '.join(f'{k}: {v}' for k, v in cg['controllers'].items()) or 'none'})"
               + ("" if cg["writable"] else " - not writable: run as root for limits"))
    click.echo(f"bubblewrap  {r['bwrap'] or 'missing: apt-get install bubblewrap'}")
    click.echo(f"qemu        {r['qemu'] or 'missing: apt-get install qemu-system-x86'}")
    k = r["kvm"]
    click.echo(f"kvm         {'usable' if k.get('usable') else 'not usable'}: {k.get('reason')}")
    d = r["disk"]
    click.echo(f"disk        {d['kind']}: {d['reason']}")
    n = r["network"]
    click.echo(f"network     {'available' if n['available'] else 'not available'}: {n['reason']}"
               + ("" if n["available"] else " (network=True fails)"))
    u = r["uids"]
    click.echo(f"uids        {u['slots']} slots of {u['per_slot']} host uids from {u['uid_base']} to {u['last_uid']}"
               + (f", {u['live']} live" if u["live"] is not None else "")
               + (f" - login users inside the range: {', '.join(u['clashing_users'])}" if u["clashing_users"] else ""))
    st = r["state"]
    click.echo(f"state       {st['dir']} ({st['fs'] or 'unknown filesystem'}): {st['reason']}")
    a = r["agent"]
    click.echo(f"agent       {a['toolchain'] or 'not buildable'}: {a['reason']}")
    lim = r["limits"]
    click.echo(f"limits      open files {lim['open_files']['soft']} (about {lim['idle_per_process_by_open_files']} "
               f"idle sandboxes per process); {lim['hint']}")
    click.echo("backends")
    for name, b in r["backends"].items():
        mark = "yes" if b["available"] else "no "
        click.echo(f"  {name:8} {mark}  {b['reason']}")
    click.echo(f"default     {r['default_backend']}")
    regs = r["binfmt"]
    click.echo(f"binfmt      {len(regs)} registration(s)" + ("" if regs else " (none: --arch arm64 registers qemu, "
                                                                "with the F flag, while it runs)"))
    for reg in regs:
        click.echo(f"  {reg['name']:24} {'enabled ' if reg['enabled'] else 'disabled'} flags {reg['flags'] or '-':4} "
                   f"{reg['interpreter']}" + ("  (sandfleet's: removed when its run ends)" if reg["ours"] else ""))
