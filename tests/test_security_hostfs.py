"""The host side never follows a link, opens a special file or keeps a setuid bit from a
directory the sandbox could write (issue 11, holes 2 and 6).

Code the agent wrote runs in the sandbox, during the run and during the verifier: it can
plant symlinks and hard links where stayer reads (the reward, the workspace that is
snapshotted, copied and fingerprinted), FIFOs that block whoever opens them, setuid files,
huge sparse files and names that are not UTF-8. Each test here plants one of those where
the host reads and checks that the host neither follows nor blocks on it. Anything that
opens a FIFO runs in a child process with a timeout, so a regression fails instead of
hanging the suite.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from pg_server import database_fixture
from sandbox_helpers import needs_bwrap

from stayer.eval.resume import prepare_resume
from stayer.eval.task import load_task
from stayer.eval.verify import read_reward
from stayer.guard.breakers import TreeFingerprint
from stayer.run import RunSettings, execute, prepare
from stayer.workspace.snapshot import FileSnapshotStore
from stayer.workspace.tree import iter_tree

ROOT = Path(__file__).resolve().parent.parent
ODD = os.fsdecode(b"x\xff-caf\xe9")  # not UTF-8: what `touch "$(printf 'x\xff')"` makes
SPARSE_SIZE = 1 << 30  # 1 GiB of which 8 KiB hold data


def bounded(code: str, timeout: float = 120) -> dict:
    """Run ``code`` (which prints one JSON document) in a child Python: a FIFO opened by
    mistake blocks the child, and the timeout turns that into a failure, not a hang."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        pytest.fail("blocked: the host opened a FIFO (or something else that never answers)")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def make_sparse(path: Path) -> None:
    with open(path, "wb") as f:
        f.write(b"head" * 1024)
        f.seek(SPARSE_SIZE - 4096)
        f.write(b"tail" * 1024)


def assert_sparse(path: Path) -> None:
    st = os.lstat(path)
    assert st.st_size == SPARSE_SIZE
    assert st.st_blocks * 512 < 4 << 20, (
        f"{path} is {st.st_blocks * 512} bytes on disk: its holes were filled"
    )
    with open(path, "rb") as f:
        assert f.read(4096) == b"head" * 1024
        f.seek(SPARSE_SIZE // 2)
        assert f.read(4096) == bytes(4096)
        f.seek(SPARSE_SIZE - 4096)
        assert f.read() == b"tail" * 1024


def modes(root: Path) -> dict[str, int]:
    return {
        rel: stat.S_IMODE(st.st_mode) for rel, st in iter_tree(root) if not stat.S_ISLNK(st.st_mode)
    }


# --- the reward: the verifier writes /logs/verifier, and the agent's code runs there ------


@pytest.fixture
def host_one(tmp_path: Path) -> Path:
    """A host file holding what a forged reward would want: ``1``."""
    f = tmp_path / "host-file"
    f.write_text("1\n")
    return f


@pytest.mark.parametrize("name", ["reward.txt", "reward.json"])
def test_a_reward_that_is_a_symlink_is_an_error_never_a_score(
    tmp_path: Path, host_one: Path, name: str
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / name).symlink_to(host_one)
    reward, rewards, error = read_reward(logs)
    assert reward is None and rewards == {}
    assert error and name in error and "link" in error


def test_a_reward_hard_linked_to_a_host_file_is_an_error(tmp_path: Path, host_one: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    os.link(host_one, logs / "reward.txt")
    reward, _, error = read_reward(logs)
    assert reward is None and error and "hard link" in error


def test_a_reward_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    os.mkfifo(logs / "reward.txt")
    (logs / "reward.json").write_text('{"reward": 1}')  # not a fallback: reward.txt is there
    got = bounded(
        "import json; from pathlib import Path; from stayer.eval.verify import read_reward; "
        f"print(json.dumps(read_reward(Path({str(logs)!r}))))"
    )
    assert got[0] is None and "FIFO" in got[2]


def test_a_reward_that_is_a_directory_is_an_error(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "reward.txt").mkdir(parents=True)
    (logs / "reward.json").write_text("1")
    reward, _, error = read_reward(logs)
    assert reward is None and error and "directory" in error


@pytest.mark.parametrize("content", ["1" + " " * 100_000, "inf", "nan", "1e999"])
def test_a_reward_too_large_or_not_finite_is_an_error(tmp_path: Path, content: str) -> None:
    (tmp_path / "reward.txt").write_text(content)
    reward, _, error = read_reward(tmp_path)
    assert reward is None and error


def test_a_reward_file_content_is_never_echoed(tmp_path: Path) -> None:
    (tmp_path / "reward.txt").write_text("TOPSECRET-4f1c")
    reward, _, error = read_reward(tmp_path)
    assert reward is None and error and "TOPSECRET" not in error


def verifier_task(tmp_path: Path, test_sh: str) -> Path:
    task = tmp_path / "task"
    for d in ("environment", "solution", "tests"):
        (task / d).mkdir(parents=True)
    (task / "instruction.md").write_text("Do nothing.\n")
    (task / "task.toml").write_text("[agent]\ntimeout_sec = 120\n")
    (task / "solution" / "solve.sh").write_text("echo nothing to do\n")
    (task / "tests" / "test.sh").write_text(test_sh)
    return task


def stayer(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update(STAYER_HOME=str(home), PYTHONPATH=str(ROOT))
    env.pop("STAYER_DB", None)
    return subprocess.run(
        [sys.executable, "-m", "stayer.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=home.parent,
        timeout=300,
    )


@needs_bwrap
@pytest.mark.parametrize("content", ["1\n", "TOPSECRET-77aa\n"])
def test_a_verifier_cannot_forge_or_leak_through_a_link_to_a_host_file(
    tmp_path: Path, content: str
) -> None:
    """The whole path: the verifier (the agent's code can run there) links reward.txt to a
    host file; the run is not scored from it and the file's content appears nowhere."""
    host_file = tmp_path / "host-secret"
    host_file.write_text(content)
    task = verifier_task(tmp_path, f"ln -s {host_file} /logs/verifier/reward.txt\n")
    home = tmp_path / "home"
    done = stayer("run", str(task), "--model", "sim:claude-sonnet-4-5", "--json", home=home)
    doc = json.loads(done.stdout)
    assert doc["status"] != "succeeded" and doc["reward"] is None
    assert "link" in doc["verifier"]["error"]
    result = (home / "runs" / doc["run_id"] / "result.json").read_text()
    for text in (done.stdout, done.stderr, result):
        assert "TOPSECRET" not in text


# --- the workspace: walked, snapshotted, copied, fingerprinted ------------------------------


@pytest.fixture
def host_dir(tmp_path: Path) -> Path:
    d = tmp_path / "host"
    d.mkdir()
    (d / "host-secret.txt").write_text("TOPSECRET host content")
    return d


def swap_for_link(ws: Path, name: str, target: Path):
    """A ``before_listing`` hook that, just as the walk reaches ``ws/name``, does what a
    process in the sandbox could do at that instant: move the directory away and put a
    link to a host directory in its place."""

    def swap(path: str) -> None:
        if path == f"{ws}/{name}" and not os.path.islink(path):
            os.rename(path, f"{path}.moved")
            os.symlink(target, path)

    return swap


def test_the_walk_never_enters_a_directory_swapped_for_a_link(
    tmp_path: Path, host_dir: Path
) -> None:
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "d" / "mine.txt").write_text("mine")
    seen = [rel for rel, _ in iter_tree(ws, swap_for_link(ws, "d", host_dir))]
    assert "d/mine.txt" in seen
    assert not any("host-secret" in rel for rel in seen)


def test_a_snapshot_never_reads_through_a_directory_swapped_for_a_link(
    tmp_path: Path, host_dir: Path, monkeypatch
) -> None:
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "d" / "mine.txt").write_text("mine")
    store = FileSnapshotStore(tmp_path / "store")
    swap = swap_for_link(ws, "d", host_dir)
    real_add = store._watch.add
    monkeypatch.setattr(store._watch, "add", lambda key, d: (swap(d), real_add(key, d))[1])
    sid = store.snapshot(ws)
    monkeypatch.undo()
    copy = tmp_path / "copy"
    store.restore(sid, copy)
    store.close()
    assert b"TOPSECRET" not in b"".join(
        p.read_bytes() for p in (tmp_path / "store").rglob("*") if p.is_file()
    )
    assert not [p for p in copy.rglob("*") if "host-secret" in p.name and not p.parent.is_symlink()]
    assert (copy / "d" / "mine.txt").read_text() == "mine"  # what was listed is what was read


def special_tree(root: Path) -> None:
    """One of every awkward thing the sandbox (or a task author) can leave in a tree."""
    root.mkdir(parents=True, exist_ok=True)
    (root / ODD).write_text("odd name")
    (root / "dir").mkdir()
    (root / "dir" / ODD).write_text("odd name, nested")
    os.mkfifo(root / "fifo", 0o644)
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(root / "sock"))
    make_sparse(root / "sparse.bin")
    (root / "suid").write_text("#!/bin/sh\n")
    os.chmod(root / "suid", 0o4755)
    (root / "sgid").write_text("x")
    os.chmod(root / "sgid", 0o2750)
    (root / "sticky-sgid-dir").mkdir()
    os.chmod(root / "sticky-sgid-dir", 0o3777)
    (root / "link").symlink_to("/etc/passwd")


def assert_special_tree_copied_safely(copy: Path) -> None:
    got = modes(copy)
    assert got["suid"] == 0o755 and got["sgid"] == 0o750 and got["sticky-sgid-dir"] == 0o777
    assert all(m <= 0o777 for m in got.values()), got
    assert_sparse(copy / "sparse.bin")
    assert (copy / ODD).read_text() == "odd name"
    assert (copy / "dir" / ODD).read_text() == "odd name, nested"
    assert stat.S_ISFIFO(os.lstat(copy / "fifo").st_mode)
    assert not (copy / "sock").exists()
    assert os.readlink(copy / "link") == "/etc/passwd"


def test_file_snapshots_keep_specials_safe_sparse_and_without_setuid(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    special_tree(ws)
    code = (
        "import json; from pathlib import Path; from stayer.workspace.snapshot import FileSnapshotStore; "
        f"s = FileSnapshotStore({str(tmp_path / 'store')!r}); sid = s.snapshot(Path({str(ws)!r})); "
        f"s.restore(sid, Path({str(tmp_path / 'copy')!r})); "
        f"s.restore(sid, Path({str(ws)!r})); print(json.dumps(sid))"  # and in place
    )
    bounded(code)
    assert_special_tree_copied_safely(tmp_path / "copy")
    manifests = list((tmp_path / "store" / "snapshots").iterdir())
    entries = json.loads(manifests[0].read_bytes())["entries"]
    assert all(e[2] <= 0o777 for e in entries)
    # The store holds the sparse file's data, not its holes.
    held = sum(p.stat().st_blocks * 512 for p in (tmp_path / "store").rglob("*") if p.is_file())
    assert held < 4 << 20


def test_an_old_manifest_with_setuid_bits_restores_without_them(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "tool").write_text("#!/bin/sh\n")
    store = FileSnapshotStore(tmp_path / "store")
    sid = store.snapshot(ws)
    store.close()
    manifest = tmp_path / "store" / "snapshots" / f"{sid}.json"
    doc = json.loads(manifest.read_bytes())
    doc["entries"] = [[*e[:2], 0o6755 if e[0] == "tool" else e[2], *e[3:]] for e in doc["entries"]]
    os.chmod(manifest, 0o644)
    manifest.write_text(json.dumps(doc))  # as a store written before the bits were dropped
    fresh = FileSnapshotStore(tmp_path / "store")
    fresh.restore(sid, tmp_path / "copy")
    fresh.close()
    assert stat.S_IMODE(os.lstat(tmp_path / "copy" / "tool").st_mode) == 0o755


def test_journal_snapshots_keep_specials_safe_sparse_and_without_setuid(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    special_tree(ws)
    code = (
        "import json; from pathlib import Path; from stayer.journal.snapshot import BlobSnapshots; "
        "blobs = {}; s = BlobSnapshots(blobs.update, blobs.__getitem__); "
        f"sid = s.snapshot(Path({str(ws)!r})); s.restore(sid, Path({str(tmp_path / 'copy')!r})); "
        "print(json.dumps(sum(len(b) for b in blobs.values())))"
    )
    stored = bounded(code)
    assert stored < 4 << 20  # the holes were never read into blobs
    assert_special_tree_copied_safely(tmp_path / "copy")


def test_materialise_copies_an_environment_safely(tmp_path: Path) -> None:
    task = verifier_task(tmp_path, "echo 1 > /logs/verifier/reward.txt\n")
    special_tree(task / "environment")
    code = (
        "from pathlib import Path; from stayer.eval.task import load_task; "
        f"load_task({str(task)!r}).materialise(Path({str(tmp_path / 'ws')!r})); print('null')"
    )
    bounded(code)
    assert_special_tree_copied_safely(tmp_path / "ws")


def test_the_fingerprint_takes_any_name_and_sees_its_changes(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ODD).write_text("a")
    os.mkfifo(ws / "fifo")
    probe = TreeFingerprint(ws)
    first = probe.fingerprint()
    assert probe.fingerprint() == first
    (ws / ODD).write_text("changed")
    assert probe.fingerprint() != first


# --- a whole run, killed and resumed, over a workspace with all of the above ------------------


class CrashAt:
    """The simulated provider; dies (like the process being killed) during call ``at``."""

    def __init__(self, inner, at: int) -> None:
        self.inner, self.at, self.calls = inner, at, 0
        self.spec, self.provider, self.model_id = inner.spec, inner.provider, inner.model_id

    def account(self, request):
        return self.inner.account(request)

    async def complete(self, request):
        self.calls += 1
        if self.calls == self.at:
            raise Killed
        return await self.inner.complete(request)


class Killed(BaseException):
    pass


pg_url = database_fixture()


@pytest.fixture(params=["sqlite", "postgres"])
def store_env(request, tmp_path: Path, monkeypatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("STAYER_HOME", str(home))
    if request.param == "postgres":
        monkeypatch.setenv("STAYER_DB", request.getfixturevalue("pg_url"))
    else:
        monkeypatch.delenv("STAYER_DB", raising=False)
    return home


@needs_bwrap
def test_a_run_with_odd_names_fifos_sockets_sparse_and_setuid_files_finishes_and_resumes(
    tmp_path: Path, store_env: Path
) -> None:
    """Hole 6: one non-UTF-8 name made the run crash at the fingerprint and every resume
    crash the same way. The solution makes one of everything; the run is killed during its
    second model call, after the workspace holds them, and ``stayer resume`` finishes it."""
    task = verifier_task(
        tmp_path,
        'f="/app/$(printf \'x\\377-caf\\351\')"; [ "$(cat "$f")" = made ] && [ -p /app/fifo ] '
        "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n",
    )
    (task / "solution" / "solve.sh").write_text(
        "cd /app && echo made > \"$(printf 'x\\377-caf\\351')\" && mkfifo fifo && "
        "python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"sock\")' && "
        "truncate -s 1G sparse.bin && printf tail >> sparse.bin && "
        "cp /bin/true suid && chmod 4755 suid && echo ok\n"
    )
    run_id = f"odd-{uuid.uuid4().hex[:8]}"
    prepared = prepare(RunSettings(str(task), "sim:claude-sonnet-4-5", run_id=run_id))
    prepared.model = CrashAt(prepared.model, at=2)
    with pytest.raises(Killed):
        asyncio.run(execute(prepared))
    resumed, journal = prepare_resume(run_id)  # (the loop gave its lease up on the way out)
    doc = asyncio.run(execute(resumed, journal=journal))
    assert doc["status"] == "succeeded", doc.get("verifier")
    ws = store_env / "runs" / run_id / "workspace"
    assert (ws / ODD).read_text() == "made\n"
    assert stat.S_ISFIFO(os.lstat(ws / "fifo").st_mode)
    st = os.lstat(ws / "sparse.bin")
    assert st.st_size == (1 << 30) + 4 and st.st_blocks * 512 < 4 << 20
    assert stat.S_IMODE(os.lstat(ws / "suid").st_mode) & 0o7000 == 0
    report = stayer_report(run_id, store_env)
    assert report["steps"] == doc["steps"]


def stayer_report(run_id: str, home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "stayer.cli", "report", run_id, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_task_environments_with_odd_names_and_sparse_files_load(tmp_path: Path) -> None:
    """A task's own environment/ may hold them too: the eval's task digest reads it."""
    from stayer.eval.runner import task_digest

    task = verifier_task(tmp_path, "echo 1 > /logs/verifier/reward.txt\n")
    (task / "environment" / ODD).write_text("x")
    make_sparse(task / "environment" / "sparse.bin")
    assert len(task_digest(load_task(task))) == 16
