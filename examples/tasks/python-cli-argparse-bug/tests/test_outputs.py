import json
import os
import subprocess
import tempfile

import pytest


@pytest.fixture()
def env():
    d = tempfile.mkdtemp()
    e = dict(os.environ)
    e["TODO_DB"] = os.path.join(d, "todo.json")
    return e


def todo(env, *args, rc=0):
    r = subprocess.run(["python3", "/app/todo.py", *args], capture_output=True, text=True, env=env, timeout=20)
    assert r.returncode == rc, r.stdout + r.stderr
    return r.stdout


def seed(env):
    todo(env, "add", "buy milk", "--priority", "2")
    todo(env, "add", "file taxes", "--priority", "10")
    todo(env, "add", "pay rent", "--priority", "1")
    todo(env, "add", "call mom")
    todo(env, "add", "water plants", "--priority", "2")


def test_add_and_list(env):
    seed(env)
    assert todo(env, "list") == (
        "3. [ ] (p1) pay rent\n"
        "1. [ ] (p2) buy milk\n"
        "5. [ ] (p2) water plants\n"
        "4. [ ] (p3) call mom\n"
        "2. [ ] (p10) file taxes\n")
    data = json.load(open(env["TODO_DB"]))
    assert all(isinstance(i["priority"], int) and isinstance(i["id"], int) for i in data)


def test_limit(env):
    seed(env)
    assert todo(env, "list", "--limit", "2") == "3. [ ] (p1) pay rent\n1. [ ] (p2) buy milk\n"
    todo(env, "list", "--limit", "abc", rc=2)


def test_done_and_all(env):
    seed(env)
    assert todo(env, "done", "1") == "done 1\n"
    assert todo(env, "done", "3") == "done 3\n"
    todo(env, "done", "42", rc=1)
    assert todo(env, "list") == "5. [ ] (p2) water plants\n4. [ ] (p3) call mom\n2. [ ] (p10) file taxes\n"
    assert todo(env, "list", "--all", "--limit", "3") == (
        "3. [x] (p1) pay rent\n1. [x] (p2) buy milk\n5. [ ] (p2) water plants\n")
    todo(env, "done", "x", rc=2)


def test_existing_db_compat(env):
    json.dump([{"id": 7, "text": "old", "priority": 4, "done": False},
               {"id": 2, "text": "older", "priority": 4, "done": True}], open(env["TODO_DB"], "w"))
    todo(env, "add", "new", "--priority", "1")
    assert todo(env, "list", "--all") == "8. [ ] (p1) new\n2. [x] (p4) older\n7. [ ] (p4) old\n"
