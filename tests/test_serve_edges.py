"""sandfleet serve's own edges: --access-log without -v, a refused token naming where it came
from, an unknown image's error (a short line, the known images after it)."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("fastapi") is None,
                                reason="the service needs the server extra (pip install -e '.[server]')")

if importlib.util.find_spec("fastapi") is not None:
    from sandfleet.server.testing import RunningService, running_service


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    # no -v and no SANDFLEET_LOG_LEVEL: the access log shows anyway
    with running_service(tmp_path_factory.mktemp("edges"), args=["--access-log"],
                         env={"SANDFLEET_LOG_LEVEL": ""}) as s:
        yield s


def test_access_log_without_verbose(svc: RunningService) -> None:
    r = httpx.get(f"{svc.url}/v1/info", headers={"Authorization": f"Bearer {svc.token}"}, timeout=30)
    assert r.status_code == 200
    for _ in range(50):
        if '"GET /v1/info HTTP/1.1" 200' in svc.log:
            break
        asyncio.run(asyncio.sleep(0.1))
    assert '"GET /v1/info HTTP/1.1" 200' in svc.log, svc.log[-2000:]


def test_a_refused_token_names_its_source(svc: RunningService, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandfleet.client.service import connect
    from sandfleet.errors import AuthError

    r = httpx.get(f"{svc.url}/v1/info", timeout=30)
    assert r.status_code == 401 and "no token was sent" in r.json()["message"] and "--token-file" in r.json()["message"]
    monkeypatch.setenv("SANDFLEET_TOKEN", "not-this-services")
    with pytest.raises(AuthError) as ei:
        asyncio.run(connect(svc.url, "not-this-services"))
    text = str(ei.value)
    assert f"{svc.url} refused $SANDFLEET_TOKEN" in text and "not a line of this service's --token-file" in text
    with pytest.raises(AuthError, match="refused the token passed to connect"):
        asyncio.run(connect(svc.url, "another-one"))


def test_an_unknown_image_is_a_short_line_then_the_known_ones(svc: RunningService) -> None:
    r = httpx.post(f"{svc.url}/v1/sandboxes", json={"image": "no-such-image"},
                   headers={"Authorization": f"Bearer {svc.token}"}, timeout=60)
    assert r.status_code == 400, r.text
    first, _, rest = r.json()["message"].partition("\n")
    assert first == "unknown image 'no-such-image' (sandfleet image build makes one)"
    assert rest.startswith("known images: ") and "host" in rest


@pytest.mark.parametrize("domain", ["bad_name!", "single", "-x.test"])
def test_a_domain_that_is_no_dns_name_is_refused_by_name(tmp_path: Path, domain: str) -> None:
    """serve --domain: a value that is no DNS name (nor auto, localhost, userinfo) is a usage
    error naming it, before anything listens."""
    from sandfleet.server.testing import write_tokens

    write_tokens(tmp_path / "tokens")
    res = subprocess.run([sys.executable, "-m", "sandfleet", "serve", "--token-file", str(tmp_path / "tokens"),
                          "--port", "0", "--domain", domain], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert f"Invalid value for --domain: '{domain}' is not a DNS name" in res.stderr, res.stderr
