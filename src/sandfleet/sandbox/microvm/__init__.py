"""The ``microvm`` backend: hardware isolation, one QEMU ``microvm`` per sandbox.

Pieces, each in its own module:

- :mod:`host`: QEMU and the guest kernel;
- :mod:`guest`: the uncompressed kernel and the initramfs that starts the guest agent;
- :mod:`probe`: the KVM probe (KVM where it runs the guest, else TCG), and ``sandfleet doctor``'s report;
- :mod:`rootfs`: read-only ext4 root disks built from images, cached by content hash;
- :mod:`vm`, :mod:`qmp`: one QEMU process, its command line, QMP, teardown;
- :mod:`template`: memory snapshots, built once, restored per sandbox;
- :mod:`fork`: a running VM saved as a template (what a sandbox snapshot restores from);
- :mod:`backend`: the sandbox lifecycle (create, snapshot, fork, close);
- :mod:`bench`: the micro-benchmark behind ``sandfleet bench micro --backend microvm``.

See docs/microvm.md.
"""

from sandfleet.sandbox.microvm.backend import MicrovmBackend, MicrovmOptions, MicrovmSandbox

__all__ = ["MicrovmBackend", "MicrovmOptions", "MicrovmSandbox"]
