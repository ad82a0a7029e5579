"""Task images built by ``sandfleet serve`` from task folders the client uploads, once per
content hash. The service runs with a cache of its own (bases only, no task image), so an
image this process built could never stand in for one the upload should have made."""

from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import tarfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from sandfleet.errors import ConfigError, ImageBuildError
from sandfleet.imagestore import images_dir
from sandfleet.tasks.bundle import content_hash, pack
from sandfleet.tasks.loader import load_task
from test_images_fidelity import harbor_task
from test_rollout_support import make_task, needs_bwrap

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("fastapi") is None,
                       reason="the service needs the server extra (pip install -e '.[server]')"),
    needs_bwrap(),
]

if importlib.util.find_spec("fastapi") is not None:
    from sandfleet.cli import cli
    from sandfleet.client import ServiceClient, connect
    from sandfleet.server.testing import RunningService, own_cache, running_service


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    d = tmp_path_factory.mktemp("svc")
    with running_service(d, args=["--max-body-mib", "1"], env=own_cache(d / "cache")) as s:
        yield s


@pytest.fixture
async def http(svc: RunningService) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=svc.url, headers={"Authorization": f"Bearer {svc.token}"},
                                 timeout=300) as h:
        yield h


async def counters(h: httpx.AsyncClient) -> dict[str, float]:
    out = {}
    for line in (await h.get("/metrics")).text.splitlines():
        if line.startswith(("sandfleet_task_image_uploads_total", "sandfleet_task_image_builds_total")):
            name, value = line.rsplit(" ", 1)
            out[name.replace("sandfleet_task_image_", "").replace("_total", "")] = float(value)
    return out


def nonce_dockerfile(extra: str = "") -> str:
    """A Dockerfile no cache has built before (its ENV makes a new image hash)."""
    return (f"FROM python:3.11-slim-bookworm\nENV NONCE={uuid.uuid4().hex}\nWORKDIR /app\n"
            f"RUN echo hello > /opt/word\n{extra}")


def sandfleet(svc: RunningService, *args: str) -> tuple[int, str]:
    r = CliRunner().invoke(cli, list(args), env={"SANDFLEET_TOKEN": svc.token}, catch_exceptions=False)
    return r.exit_code, r.output


@pytest.mark.slow
async def test_run_remote_builds_the_image_on_the_service_once(svc: RunningService, http: httpx.AsyncClient,
                                                               tmp_path: Path) -> None:
    task = make_task(tmp_path / "suite", "built-there", solve="cat /opt/word > /app/out.txt",
                     dockerfile=nonce_dockerfile())
    digest = content_hash(task.path)
    assert (await http.get(f"/v1/task-images/{digest}")).status_code == 404
    before = await counters(http)
    code, out = await asyncio.to_thread(sandfleet, svc, "run", "--remote", svc.url, "--tasks",
                                        str(tmp_path / "suite"), "--agent", "oracle", "-n", "2", "--out",
                                        str(tmp_path / "r1"))
    assert code == 0, out
    rewards = [json.loads(line)["reward"] for line in (tmp_path / "r1" / "rollouts.jsonl").read_text().splitlines()]
    assert rewards == [1.0, 1.0]  # /opt/word exists only in the image the service built
    info = (await http.get(f"/v1/task-images/{digest}")).json()
    assert info["digest"] == digest and info["image"] != "host" and info["env"]["NONCE"]
    assert not (images_dir() / info["image"]).exists()  # never built here
    after = await counters(http)
    assert after["uploads"] - before["uploads"] == 1
    assert after['builds{result="built"}'] - before['builds{result="built"}'] == 1
    # a second run (a new client): asks, finds it, uploads and builds nothing
    code, out = await asyncio.to_thread(sandfleet, svc, "run", "--remote", svc.url, "--tasks",
                                        str(tmp_path / "suite"), "--agent", "oracle", "-n", "2", "--out",
                                        str(tmp_path / "r2"))
    assert code == 0, out
    assert await counters(http) == after
    # tasks validate --remote: the same image (the oracle and the no-op agent), nothing uploaded
    code, out = await asyncio.to_thread(sandfleet, svc, "tasks", "validate", "--remote", svc.url,
                                        str(tmp_path / "suite"), "-r", "1", "--json", "--report",
                                        str(tmp_path / "validation.json"))
    assert code == 0, out
    assert json.loads(out[out.index("{"):])["built-there"]["status"] == "valid"
    assert await counters(http) == after
    # a changed file is a new digest: uploaded again, and the image found built (same Dockerfile)
    (task.path / "tests" / "extra.txt").write_text("x")
    async with await connect(svc.url, svc.token) as c:
        assert await c.task_image(task) == info["image"]
        assert c.uploads == 1
    final = await counters(http)
    assert final["uploads"] - after["uploads"] == 1
    assert final['builds{result="cached"}'] > after['builds{result="cached"}'], (after, final)


@pytest.mark.slow
async def test_concurrent_uploads_of_one_digest_build_once(svc: RunningService, http: httpx.AsyncClient,
                                                           tmp_path: Path) -> None:
    task = make_task(tmp_path, "raced", dockerfile=nonce_dockerfile("RUN sleep 1\n"))
    before = await counters(http)
    clients: list[ServiceClient] = [await connect(svc.url, svc.token) for _ in range(4)]
    try:
        names = await asyncio.gather(*(c.task_image(task) for c in clients))
        # one client asked by many rollouts at once: one look-up, no second upload
        again = await asyncio.gather(*(clients[0].task_image(task) for _ in range(8)))
    finally:
        for c in clients:
            await c.aclose()
    assert len(set(names) | set(again)) == 1
    after = await counters(http)
    assert after['builds{result="built"}'] - before['builds{result="built"}'] == 1
    assert after['builds{result="cached"}'] == before['builds{result="cached"}']
    assert 1 <= after["uploads"] - before["uploads"] <= 4


@pytest.mark.slow
async def test_verifier_image_from_tests_dockerfile(svc: RunningService, http: httpx.AsyncClient,
                                                    tmp_path: Path) -> None:
    nonce = uuid.uuid4().hex
    folder = harbor_task(
        tmp_path, "separate", nonce_dockerfile(), top='artifacts = ["/app/out.txt"]\n',
        toml="\n[verifier.environment]\ncpus = 1\nmemory_mb = 1024\n", solve="cat /opt/word > /app/out.txt\n",
        files={"tests/Dockerfile": f"FROM python:3.11-slim-bookworm\nENV VNONCE={nonce}\nCOPY . /tests/\n"
                                   "RUN echo verifier-image > /opt/marker\n",
               "tests/test.sh": 'ok=1; [ "$(cat /app/out.txt)" = hello ] || ok=0\n'
                                '[ "$(cat /opt/marker)" = verifier-image ] || ok=0\n'
                                '[ "$VNONCE" = ' + nonce + " ] || ok=0\n"
                                "echo $ok > /logs/verifier/reward.txt\n"})
    code, out = await asyncio.to_thread(sandfleet, svc, "run", "--remote", svc.url, "--tasks", str(folder),
                                        "--agent", "oracle", "-n", "1", "--out", str(tmp_path / "r"))
    assert code == 0, out
    res = json.loads((tmp_path / "r" / "rollouts.jsonl").read_text().splitlines()[0])
    assert res["reward"] == 1.0, res
    info = (await http.get(f"/v1/task-images/{content_hash(folder)}", params={"verifier": "true"})).json()
    assert info["env"]["VNONCE"] == nonce and not (images_dir() / info["image"]).exists()


def tar_of(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


async def test_bad_uploads_get_clear_4xx(svc: RunningService, http: httpx.AsyncClient, tmp_path: Path) -> None:
    some = "ab" * 32
    r = await http.get("/v1/task-images/not-a-digest")
    assert (r.status_code, r.json()["code"]) == (400, "invalid_request") and "64" in r.json()["message"]
    r = await http.get(f"/v1/task-images/{some}")
    assert (r.status_code, r.json()["code"]) == (404, "task_image_not_found")
    r = await http.put(f"/v1/task-images/{some}", content=b"")
    assert (r.status_code, r.json()["code"]) == (400, "invalid_request") and "empty" in r.json()["message"]
    r = await http.put(f"/v1/task-images/{some}", content=b"this is not a tar" * 100)
    assert (r.status_code, r.json()["code"]) == (400, "invalid_request") and "tar" in r.json()["message"]
    r = await http.put(f"/v1/task-images/{some}", content=tar_of({"../escape": b"x"}))
    assert (r.status_code, r.json()["code"]) == (400, "bad_path")
    # a real folder under another folder's digest
    task = make_task(tmp_path, "honest", dockerfile=nonce_dockerfile())
    r = await http.put(f"/v1/task-images/{some}", content=pack(task).data)
    assert (r.status_code, r.json()["code"]) == (400, "digest_mismatch")
    # a folder that is not a task
    (tmp_path / "nota" / "sub").mkdir(parents=True)
    (tmp_path / "nota" / "README").write_text("hi\n")
    data = pack(task.model_copy(update={"path": tmp_path / "nota", "dockerfile": None, "context_dir": None,
                                        "tests_dir": tmp_path / "nota", "solution": None,
                                        "verifier": task.verifier.model_copy(update={"uploads": ()})})).data
    r = await http.put(f"/v1/task-images/{content_hash(tmp_path / 'nota')}", content=data)
    assert (r.status_code, r.json()["code"]) == (422, "not_a_task") and "task.toml" in r.json()["message"]
    # over --max-body-mib (1 MiB here)
    r = await http.put(f"/v1/task-images/{some}", content=b"\0" * (2 << 20))
    assert (r.status_code, r.json()["code"]) == (413, "too_large")
    async with await connect(svc.url, svc.token) as c:
        big = make_task(tmp_path, "big", dockerfile=nonce_dockerfile())
        (big.path / "tests" / "data.bin").write_bytes(bytes(range(256)) * (8 << 10))  # 2 MiB
        with pytest.raises(ConfigError, match="cap"):
            await c.task_image(big)
        assert c.uploads == 0


@pytest.mark.slow
async def test_failing_build_answers_its_log_tail(svc: RunningService, http: httpx.AsyncClient,
                                                  tmp_path: Path) -> None:
    task = make_task(tmp_path, "broken", dockerfile=nonce_dockerfile("RUN echo the-reason-it-broke >&2; exit 3\n"))
    before = await counters(http)
    r = await http.put(f"/v1/task-images/{content_hash(task.path)}", content=pack(task).data,
                       params={"name": "broken"})
    assert (r.status_code, r.json()["code"]) == (422, "build_failed"), r.text
    assert "the-reason-it-broke" in r.json()["message"] and "exited with 3" in r.json()["message"]
    assert str(svc.dir) not in r.json()["message"]  # the service's own paths stay there
    async with await connect(svc.url, svc.token) as c:
        with pytest.raises(ImageBuildError, match="the-reason-it-broke"):
            await c.task_image(task)
    after = await counters(http)
    assert after['builds{result="failed"}'] - before['builds{result="failed"}'] == 2  # not remembered: tried again
    assert load_task(task.path).name == "broken"
