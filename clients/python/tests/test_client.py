"""The Python client against a real daemon (`turnsnap serve`) on real
overlay sandboxes. Needs root and TURNSNAP_BIN (the turnsnap binary;
`make test` builds it). Exec tests also need runc, CRIU and busybox."""

import os
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import turnsnap  # noqa: E402

from conftest import missing  # noqa: E402


def test_turns_rollback_branch_log(daemon: Any) -> None:
    c, _, _ = daemon
    root = c.sandbox_path("py")
    with open(os.path.join(root, "work.txt"), "w") as f:
        f.write("turn 1\n")
    cp1 = c.checkpoint("py", turn=1, message="first")
    assert cp1["class"] == "fs" and cp1["turn"] == 1 and len(cp1["id"]) == 64
    skip = c.checkpoint("py", turn=2)
    assert skip["class"] == "skip" and skip["id"] == cp1["id"] and skip["bytes_new"] == 0
    os.remove(os.path.join(root, "work.txt"))
    cp2 = c.checkpoint("py", message="deleted")
    log = c.log("py")
    assert [e["id"] for e in log[:2]] == [cp2["id"], cp1["id"]] and log[0]["head"]
    assert c.get_checkpoint(cp1["id"][:10])["message"] == "first"
    r = c.rollback("py", cp1["id"])
    assert r["checkpoint"] == cp1["id"] and os.path.exists(os.path.join(root, "work.txt"))
    assert c.diff("py", cp1["id"], cp2["id"])["changes"][0]["change"] == "deleted"
    fan = c.branch(cp2["id"], "fan", count=3)
    assert [b["sandbox"] for b in fan] == ["fan-1", "fan-2", "fan-3"]
    assert not os.path.exists(os.path.join(fan[0]["root"], "work.txt"))
    assert c.verify(cp1["id"])["ok"]
    assert c.tag("good", cp1["id"])["checkpoint"] == cp1["id"]


def test_errors_carry_the_class(daemon: Any) -> None:
    c, base, _ = daemon
    with pytest.raises(turnsnap.NotFound) as e:
        c.checkpoint("nosuch")
    assert e.value.klass == "not_found" and e.value.status == 404 and "nosuch" in e.value.message
    with pytest.raises(turnsnap.Exists):
        c.create_sandbox("py", base)
    with pytest.raises(turnsnap.Invalid):
        c.create_sandbox("bad/name", base)
    with pytest.raises(turnsnap.Precondition):
        c.sync()


def test_events(daemon: Any) -> None:
    c, _, _ = daemon
    got: List[Dict[str, Any]] = []
    ready = threading.Event()

    def read() -> None:
        for ev in c.events(sandbox="py"):
            got.append(ev)
            ready.set()
            if ev["type"] == "committed" and ev.get("class") == "fs":
                return

    t = threading.Thread(target=read, daemon=True)
    t.start()
    # The stream is open once a (skip) turn's event arrives.
    while not ready.wait(0.2):
        c.checkpoint("py")
    with open(os.path.join(c.sandbox_path("py"), "ev.txt"), "w") as f:
        f.write("event\n")
    cp = c.checkpoint("py")
    t.join(30)
    assert not t.is_alive(), "no committed event for the fs turn"
    last = got[-1]
    assert last["checkpoint"] == cp["id"] and last["bytes_new"] == cp["bytes_new"] > 0
    assert "started" in [e["type"] for e in got]


def test_exec_and_agent_loop(daemon: Any) -> None:
    c, _, has_exec = daemon
    if not has_exec:
        missing("runc and busybox (exec)")
    r = c.exec("py", ["sh", "-c", "cat; echo oops >&2; exit 7"], stdin="piped in\n")
    assert (r.exit_code, r.stdout, r.stderr) == (7, b"piped in\n", b"oops\n")
    pid = c.exec("py", ["sh", "-c", "echo up; exec sleep 100000"], detach=True, log="/tmp/d.log")
    assert pid > 1
    for _ in range(200):
        if c.exec("py", ["cat", "/tmp/d.log"]).stdout == b"up\n":
            break
        time.sleep(0.05)
    else:
        pytest.fail("the detached process's log stayed empty")
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "agent_loop.py")
    env = dict(os.environ, TURNSNAP_HOME=os.path.dirname(c.socket_path), PYTHONPATH=os.path.join(os.path.dirname(__file__), ".."))
    out = subprocess.run([sys.executable, example, "py"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("turn 1: fs") and "failed; rolled back" in lines[1] and lines[2].startswith("turn 3: fs"), out.stdout
    # The failed turn (rm -rf /tmp/*) was undone: turn 1's file is back.
    assert c.exec("py", ["test", "-e", "/tmp/app.py"]).exit_code == 0



def test_paths_lineage_retention(daemon: Any) -> None:
    c, _, _ = daemon
    root = c.sandbox_path("py")
    with open(os.path.join(root, "notes.txt"), "w") as f:
        f.write("first\n")
    cp1 = c.checkpoint("py", message="one")
    with open(os.path.join(root, "notes.txt"), "w") as f:
        f.write("second\n")
    cp2 = c.checkpoint("py", message="two")
    assert c.cat(cp1["id"], "/notes.txt") == b"first\n"
    names = [e["name"] for e in c.ls(cp2["id"])]
    assert "notes.txt" in names and "README" in names
    with pytest.raises(turnsnap.NotFound):
        c.cat(cp1["id"], "/nosuch")
    with pytest.raises(turnsnap.Invalid):
        c.cat(cp1["id"], "/")
    r = c.restore("py", cp1["id"], ["/notes.txt"])
    assert r["paths"][0]["action"] == "restored"
    with open(os.path.join(root, "notes.txt")) as f:
        assert f.read() == "first\n"
    with pytest.raises(turnsnap.Invalid) as e:
        c._call("POST", "/v1/sandboxes/py/restore", {"checkpoint": cp1["id"], "paths": ["/notes.txt"], "to": "/tmp/x"})
    assert "daemon" in e.value.message
    assert [x["id"] for x in c.lineage()["checkpoints"][:2]] == [cp2["id"], cp1["id"]]
    assert c.ps("py")["sandbox"] == "py"
    assert c.set_policy("py", keep_last=1)["sandboxes"][0]["policy"] == {"keep_last": 1}
    dry = c.forget("py", keep_last=1, dry_run=True)
    assert dry["dry_run"] and dry["checkpoints_deleted"] >= 1
    done = c.apply_policies()
    assert done["checkpoints_deleted"] == dry["checkpoints_deleted"]
    assert len(c.log("py")) == 1
    assert c.clear_policy("py")["sandboxes"][0]["source"] == "none"
