"""NeMo Gym's own E2B sandbox provider, configured by its shipped ``e2b.yaml``, on a real
``sandfleet serve``: the only change is the three E2B variables its config reads.

NeMo Gym (0.7.0) reaches sandboxes through a provider-neutral layer
(``nemo_gym.sandbox``: ``AsyncSandbox`` over a ``SandboxProvider`` named in config); its
``e2b`` provider drives the ``e2b`` SDK, whose API and sandbox URLs the config takes from
``E2B_API_URL`` and ``E2B_SANDBOX_URL``. Here that config is loaded as NeMo Gym does
(OmegaConf, ``resolve_provider_config``, ``create_provider``) and an ``AsyncSandbox`` runs
commands, files, a failing command and a timeout. NeMo Gym 0.7.0 patches the e2b SDK's
transport factory with a signature of e2b 2.49 and older (e2b 2.52+ fails in it with
``unexpected keyword argument 'http_version'``, whatever the server), so this runs with
e2b 2.49.1. Opt-in (marker ``nemogym``):
``scripts/test-integrations.sh nemogym`` installs it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = [
    pytest.mark.nemogym,
    pytest.mark.skipif(importlib.util.find_spec("nemo_gym") is None,
                       reason="needs nemo-gym (scripts/test-integrations.sh nemogym installs it)"),
]

if importlib.util.find_spec("fastapi") is not None:
    from sandfleet.server.testing import RunningService, leftovers


@pytest.fixture(scope="module")
def svc(running_services: Any) -> RunningService:
    """The session's shared service, with two tokens of this module's own (tests/conftest.py)."""
    return running_services.view()


DRIVER = """
import asyncio, json, sys, tempfile, time
from pathlib import Path

import nemo_gym
from nemo_gym.sandbox.api import AsyncSandbox
from nemo_gym.sandbox.config import resolve_provider_config
from nemo_gym.sandbox.providers.base import SandboxSpec
from omegaconf import OmegaConf

shipped = Path(nemo_gym.__file__).parent / "sandbox/providers/e2b/configs/e2b.yaml"
cfg = resolve_provider_config("sandbox", OmegaConf.to_container(OmegaConf.load(shipped), resolve=True))
out = {"api_url": cfg["e2b"]["connection"]["api_url"]}


async def main():
    spec = SandboxSpec(image="base", ttl_s=300, files={"/home/user/task/input.txt": "21\\n"})
    sandbox = AsyncSandbox(cfg, spec)
    await sandbox.start()
    try:
        res = await sandbox.exec("echo $(( $(cat task/input.txt) * 2 )); id -un; pwd", cwd="/home/user")
        out["exec"] = [res.return_code, res.stdout]
        bad = await sandbox.exec("echo oops >&2; exit 3")
        out["fail"] = [bad.return_code, bad.stderr]
        t = time.monotonic()
        try:
            slow = await sandbox.exec("sleep 30", timeout_s=1)
            out["timeout"] = [slow.return_code, round(time.monotonic() - t, 2)]
        except TimeoutError as e:
            out["timeout"] = ["TimeoutError", round(time.monotonic() - t, 2)]
        d = Path(tempfile.mkdtemp())
        (d / "up.txt").write_text("from the host\\n")
        await sandbox.upload(d / "up.txt", "/home/user/up.txt")
        await sandbox.download("/home/user/up.txt", d / "down.txt")
        out["files"] = (d / "down.txt").read_text()
    finally:
        await sandbox.stop()


asyncio.run(main())
print("RESULT " + json.dumps(out))
"""


def test_e2b_provider_from_shipped_config(svc: RunningService, tmp_path: Path) -> None:
    """NeMo Gym's provider code runs in a process of its own, as in ``gym env start``: its
    HTTP transport reads NeMo Gym's global config from the command line (hydra), which
    pytest's arguments are not."""
    script = tmp_path / "drive.py"
    script.write_text(DRIVER)
    env = {**os.environ, "E2B_API_URL": svc.url, "E2B_SANDBOX_URL": svc.url, "E2B_API_KEY": svc.token}
    r = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stdout[-2000:] + r.stderr[-4000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["api_url"] == svc.url
    assert out["exec"] == [0, "42\nuser\n/home/user\n"]
    assert out["fail"] == [3, "oops\n"]
    # stopped at its timeout: NeMo Gym's background mode reports the killed command as -1
    # (or raises TimeoutError), well before the 30 s it would sleep
    assert out["timeout"][0] in (-1, "TimeoutError") and out["timeout"][1] < 15, out
    assert out["files"] == "from the host\n"
    r2 = httpx.get(f"{svc.url}/v1/sandboxes", headers={"Authorization": f"Bearer {svc.token}"}, timeout=30)
    assert r2.json()["sandboxes"] == []


def test_nothing_left(svc: RunningService) -> None:
    r = httpx.get(f"{svc.url}/v1/sandboxes", headers={"Authorization": f"Bearer {svc.token}"}, timeout=30)
    assert leftovers(s["id"] for s in r.json()["sandboxes"]) == []
