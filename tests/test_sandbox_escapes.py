"""Escape attempts against the bubblewrap sandbox, each asserting containment and what the
report says (exit code, ``timed_out``, ``truncated``).

These are the attacks a command the agent's author never read could make: reach the host's
network or files, read its secrets, outlive its call, or exhaust processes, memory, output
or disk. Where a probe could be silently broken (and so "pass"), a positive control runs
the same probe where it must succeed.
"""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import socket
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from docker_helpers import (  # noqa: F401 - fixtures
    _docker_base_image,
    _dockerd,
    base_root,
    docker_base,
    docker_host,
)
from sandbox_helpers import count_forks, marker, needs_bwrap, procs_with, run, wait_gone

from stayer.sandbox.base import ExecResult, Sandbox
from stayer.sandbox.bwrap import DEFAULT_MAX_PROCESSES, BwrapSandbox
from stayer.sandbox.docker import DockerSandbox
from stayer.sandbox.process import pids_cgroup_parent
from stayer.workspace.tree import disk_usage

pytestmark = needs_bwrap

MakeSandbox = Callable[..., Sandbox]


@pytest.fixture(
    params=[
        "bwrap",
        "bwrap-ahead",
        "bwrap-persistent",
        pytest.param("docker", marks=pytest.mark.slow),
    ]
)
def make(request: pytest.FixtureRequest) -> MakeSandbox:
    """The sandbox under attack: bwrap started for the command, bwrap started ahead (each
    attack runs in the sandbox started when a first command ended: the default), bwrap kept
    running between commands (each attack runs after a first command, in a sandbox already
    in use), or a container of the docker sandbox (its own daemon and base image, from
    docker_helpers; slow to set up)."""
    if request.param == "bwrap":
        return functools.partial(BwrapSandbox, ahead=False)
    if request.param == "bwrap-ahead":
        return ahead_bwrap
    if request.param == "bwrap-persistent":
        return kept_bwrap
    return functools.partial(DockerSandbox, image=request.getfixturevalue("docker_base"))


def ahead_bwrap(ws: Path, **kw: Any) -> BwrapSandbox:
    """A bwrap sandbox whose next command runs in a sandbox started ahead for it."""
    sb = BwrapSandbox(ws, **kw)
    assert run(sb.exec("echo $$")).stdout == "2\n"
    assert sb._kept_box is not None and sb._kept_box._next is not None  # started ahead
    return sb


def kept_bwrap(ws: Path, **kw: Any) -> BwrapSandbox:
    """A persistent bwrap sandbox that has run one command already."""
    sb = BwrapSandbox(ws, persistent=True, **kw)
    assert run(sb.exec("echo $PPID")).stdout == "2\n"  # started by the runner, pid 2
    return sb


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    return d


def contained(
    r: ExecResult, *, failed: bool = True, timed_out: bool = False, truncated: bool = False
) -> None:
    """The report is what it should be: the attempt failed (or not), and says whether it
    was killed on time and whether its output was cut."""
    assert (r.exit_code != 0) is failed, r
    assert r.timed_out is timed_out, r
    assert r.truncated is truncated, r


# ----------------------------------------------------------------------------- network


def test_cannot_connect_to_a_host_listener_on_loopback(make: MakeSandbox, ws: Path) -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        srv.setblocking(False)
        port = srv.getsockname()[1]
        probe = (
            f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo bash-connected; "
            f'python3 -c \'import socket; socket.create_connection(("127.0.0.1", {port}), 3); '
            'print("python-connected")\''
        )
        r = run(make(ws).exec(probe, timeout=15))
        contained(r)
        assert "connected" not in r.stdout
        assert "refused" in r.stderr.lower()  # nothing listens on the sandbox's own loopback
        with pytest.raises(BlockingIOError):
            srv.accept()  # and nothing reached the host's
        # Positive control: with the network shared, the same probe does connect.
        r = run(make(ws, allow_net=True).exec(probe, timeout=15))
        contained(r, failed=False)
        assert r.stdout == "bash-connected\npython-connected\n"


def test_cannot_reach_a_host_abstract_unix_socket(make: MakeSandbox, ws: Path) -> None:
    name = f"stayer-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX) as srv:
        srv.bind("\0" + name)
        srv.listen(1)
        probe = (
            "python3 -c 'import socket, sys; s = socket.socket(socket.AF_UNIX); "
            f's.connect("\\0{name}"); print("connected")\''
        )
        r = run(make(ws).exec(probe, timeout=15))
        contained(r)
        assert "connected" not in r.stdout and "ConnectionRefusedError" in r.stderr
        r = run(make(ws, allow_net=True).exec(probe, timeout=15))
        assert r.stdout == "connected\n", r.stderr  # control: shared network, same socket


def _dns_answer(query: bytes) -> bytes:
    """A minimal DNS response to ``query``: same id and question, one A record 10.0.0.1."""
    ident = query[:2]
    question = query[12:]
    answer = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + bytes([10, 0, 0, 1])
    return ident + b"\x81\x80" + struct.pack(">HHHH", 1, 1, 0, 0) + question + answer


_DNS_PROBE = """python3 - <<'EOF'
import socket, struct
q = b"\\x12\\x34\\x01\\x00" + struct.pack(">HHHH", 1, 0, 0, 0)
q += b"".join(bytes([len(p)]) + p for p in (b"stayer", b"example")) + b"\\x00" + struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
try:
    s.sendto(q, ("127.0.0.1", PORT))
    data = s.recv(512)
    print("answered", ".".join(str(b) for b in data[-4:]))
except OSError as e:
    print("no answer:", type(e).__name__)
print("interfaces:", sorted(n for _, n in socket.if_nameindex()))
try:
    socket.getaddrinfo("stayer-escape-probe.example.com", 80)
    print("resolved")
except socket.gaierror as e:
    print("unresolved")
EOF"""


def test_dns_lookups_fail_without_allow_internet(make: MakeSandbox, ws: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as dns:
        dns.bind(("127.0.0.1", 0))
        dns.settimeout(0.2)
        port = dns.getsockname()[1]
        stop = threading.Event()

        def serve() -> None:
            while not stop.is_set():
                try:
                    query, peer = dns.recvfrom(512)
                except OSError:
                    continue
                dns.sendto(_dns_answer(query), peer)

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        try:
            probe = _DNS_PROBE.replace("PORT", str(port))
            r = run(make(ws).exec(probe, timeout=20))
            contained(r, failed=False)
            # No interface but its own loopback: no resolver of the host's is reachable.
            assert "interfaces: ['lo']" in r.stdout
            assert "no answer" in r.stdout and "unresolved" in r.stdout, r.stdout
            # Positive control: the same query is answered when the network is shared.
            r = run(make(ws, allow_net=True).exec(probe, timeout=20))
            assert "answered 10.0.0.1" in r.stdout, r.stdout + r.stderr
        finally:
            stop.set()
            server.join(timeout=2)


# ----------------------------------------------------------------------------- files


def test_writes_outside_app_do_not_reach_the_host(
    make: MakeSandbox, ws: Path, tmp_path: Path
) -> None:
    name = f"stayer-pwned-{uuid.uuid4().hex}"
    cwd = Path.cwd()
    targets = ["/usr", "/etc", "/", "/root", "/home", "/var", "/opt", "/etc/ssl/private", str(cwd)]
    # A starting directory under /tmp lies in the sandbox's private, writable /tmp there:
    # writing it succeeds inside and must not reach the host (checked below with /tmp).
    strict = [t for t in targets if not (t == "/tmp" or t.startswith("/tmp/"))]
    sb = make(ws)
    # In a container the image's own root-only directories (/root) refuse even the lookup.
    reasons = ("Read-only file system", "No such file") + (
        () if make in (BwrapSandbox, kept_bwrap) else ("Permission denied",)
    )
    for t in strict:
        r = run(sb.exec(f"echo x > {t}/{name}"))
        contained(r)
        assert any(why in r.stderr for why in reasons), r.stderr
        r = run(sb.exec(f"mkdir -p {t}/{name}"))
        contained(r)
    # The private /tmp is writable, the host's /tmp (here: the test's tmp_path) is not there.
    r = run(sb.exec(f"mkdir -p {tmp_path} && echo x > {tmp_path}/{name} && echo x > /tmp/{name}"))
    contained(r, failed=False)
    for t in [*targets, "/tmp", str(tmp_path)]:
        assert not (Path(t) / name).exists(), t  # ...and none of it reached the host
    # The workspace is the one writable place that persists.
    r = run(make(ws).exec(f"echo kept > /app/{name}"))
    contained(r, failed=False)
    assert (ws / name).read_text() == "kept\n"


def test_host_secret_files_are_not_readable(
    make: MakeSandbox, ws: Path, tmp_path: Path, monkeypatch
) -> None:
    token = uuid.uuid4().hex  # the secret
    name = f"stayer-secret-{uuid.uuid4().hex}"
    in_tmp = Path("/tmp") / name
    in_home = Path.home() / f".{name}"
    fake_home = tmp_path / "home"
    state = tmp_path / "state"
    fake_home.mkdir()
    state.mkdir()
    (fake_home / ".netrc").write_text(f"password {token}")
    (state / "credentials").write_text(token)
    monkeypatch.setenv("HOME", str(fake_home))
    monkeypatch.setenv("STAYER_HOME", str(state))
    created = []
    try:
        for path in (in_tmp, in_home):
            path.write_text(token)
            created.append(path)
        sb = make(ws)
        paths = [in_tmp, in_home, fake_home / ".netrc", state / "credentials", "/etc/shadow"]
        r = run(sb.exec("; ".join(f"cat {p}" for p in paths)))
        contained(r)
        assert token not in r.stdout + r.stderr and "root:" not in r.stdout
        # Not by name, and not by looking around either.
        r = run(
            sb.exec(
                "find / \\( -path /proc -o -path /usr -o -path /sys \\) -prune -o "
                f"-name '*{name}*' -print; grep -rls {token} /tmp /app /etc; echo done",
                timeout=60,
            )
        )
        assert r.stdout == "done\n", r.stdout
    finally:
        for path in created:
            path.unlink()


def test_host_environment_is_not_visible(make: MakeSandbox, ws: Path, monkeypatch) -> None:
    token = uuid.uuid4().hex
    for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "STAYER_ESCAPE_SECRET"):
        monkeypatch.setenv(name, token)
    r = run(make(ws).exec("env; cat /proc/self/environ /proc/1/environ; echo; cat /proc/*/environ"))
    assert token not in r.stdout + r.stderr
    assert "API_KEY" not in r.stdout
    assert "PATH=" in r.stdout  # control: the probe does print an environment


def test_host_processes_are_invisible_and_unsignalable(make: MakeSandbox, ws: Path) -> None:
    mark = marker()
    victim = subprocess.Popen(["sleep", mark])
    try:
        sb = make(ws)
        r = run(sb.exec(f"kill -9 {victim.pid}"))
        contained(r)
        assert "No such process" in r.stderr
        r = run(
            sb.exec("cat /proc/[0-9]*/cmdline | tr '\\0' ' '; echo; ls -d /proc/[0-9]* | wc -l")
        )
        contained(r, failed=False)
        assert mark not in r.stdout and "sleep" not in r.stdout
        assert int(r.stdout.split()[-1]) <= 5  # bwrap, bash, cat, tr, ls: nothing of the host
        assert victim.poll() is None  # still running
    finally:
        victim.kill()
        victim.wait()


# ----------------------------------------------------------------------------- processes


def test_background_child_does_not_outlive_its_command(make: MakeSandbox, ws: Path) -> None:
    marks = [marker() for _ in range(5)]
    script = "\n".join(
        [
            f"sleep {marks[0]} > /dev/null 2>&1 &",
            f"nohup sleep {marks[1]} > /dev/null 2>&1 &",
            f"setsid sleep {marks[2]} > /dev/null 2>&1 &",
            f"( ( sleep {marks[3]} > /dev/null 2>&1 & ) & )",
            f"sleep {marks[4]} > /dev/null 2>&1 & disown",
            "echo parent exits",
        ]
    )
    r = run(make(ws).exec(script, timeout=30))
    contained(r, failed=False)
    assert r.stdout == "parent exits\n" and r.duration_s < 5
    for mark in marks:
        assert wait_gone(mark) == [], f"sleep {mark} outlived the command"


@pytest.mark.slow
@pytest.mark.skipif(
    pids_cgroup_parent() is None and os.geteuid() == 0,
    reason="max_processes is not enforceable here: root and no writable pids cgroup",
)
def test_fork_bomb_is_contained_and_the_host_stays_responsive(make: MakeSandbox, ws: Path) -> None:
    # Every process of the bomb is a fork of the bash the command execs, whose command line
    # carries the mark (as its $0): the count is of this bomb's processes, whatever else
    # the machine (another test) is running. The command's own bash may show another line
    # (the kept sandbox's bash started ahead shows the program it waited in).
    mark = f"bomb-{uuid.uuid4().hex[:12]}"
    limit = 64
    peak, started, refused = [0], [0], []
    stop = threading.Event()

    def bash_processes() -> int:  # not bwrap or the docker client, whose argv holds it too
        count = 0
        for pid in procs_with(mark):
            with contextlib.suppress(OSError):
                count += Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"/bin/bash\0")
        return count

    def watch() -> None:  # meanwhile: the bomb's size, and whether the host can start a process
        while not stop.is_set():
            peak[0] = max(peak[0], bash_processes())
            r = subprocess.run(["true"], capture_output=True)
            started[0] += r.returncode == 0
            if r.returncode != 0:
                refused.append(r.returncode)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        # The parent stays (sleep) so that the bomb runs until the timeout: a parent that
        # exits takes all its children with it at once, which would prove less.
        r = run(
            make(ws, max_processes=limit).exec(
                f"exec /bin/bash -c ':(){{ :|:& }};:; sleep 60' {mark}", timeout=5.0
            )
        )
    finally:
        stop.set()
        watcher.join()
    assert r.timed_out and r.exit_code == 137, r  # ended by its timeout, not by the sleep
    assert "fork" in r.stderr  # bash reports forks refused by the process limit
    assert 0 < peak[0] <= limit, peak[0]  # the cap held
    assert started[0] > 0 and not refused, (
        started,
        refused,
    )  # the host could still start processes
    assert wait_gone(mark) == []  # nothing of it is left


# ----------------------------------------------------------------------------- memory, output


def test_memory_hog_is_stopped(make: MakeSandbox, ws: Path) -> None:
    sb = make(ws, memory_mb=256)
    r = run(sb.exec("python3 -c 'x = bytearray(4 * 1024**3); print(\"allocated\")'", timeout=30))
    contained(r)
    assert "MemoryError" in r.stderr and "allocated" not in r.stdout
    r = run(sb.exec("x=$(head -c 1000000000 /dev/zero | tr '\\0' a); echo ${#x}", timeout=30))
    contained(r)  # bash itself cannot grow past the limit either
    assert r.stdout.strip() != "1000000000"
    # The private /tmp is memory too (tmpfs): bounded by the storage limit.
    # One big file stops at the file-size limit, many small ones at the size of the tmpfs.
    sb = make(ws, storage_mb=32)
    for hog in (
        "head -c 2000000000 /dev/zero > /tmp/hog",
        "for i in $(seq 1 100); do head -c 20000000 /dev/zero > /tmp/hog$i || break; done; [ $i = 100 ]",
    ):
        r = run(sb.exec(f"{hog}; rc=$?; du -sm /tmp; exit $rc", timeout=30))
        contained(r)
        assert int(r.stdout.split()[0]) <= 32 and r.duration_s < 10, r
        assert "File size limit exceeded" in r.stderr or "No space left on device" in r.stderr


@pytest.mark.slow
def test_yes_for_ten_seconds_is_cut_and_bounded(make: MakeSandbox, ws: Path) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = run(make(ws, max_output_bytes=200_000).exec("yes", timeout=10))
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    contained(r, timed_out=True, truncated=True)
    assert 9.5 < r.duration_s < 13
    assert r.stdout.startswith("y\ny\n") and "bytes dropped" in r.stdout
    dropped = int(r.stdout.split("[... ", 1)[1].split(" bytes dropped", 1)[0])
    assert dropped > 100_000_000  # gigabytes went through the pipe...
    assert len(r.stdout) < 200_100 and grown_mb < 40  # ...and were not kept


# ----------------------------------------------------------------------------- disk


def test_five_gigabyte_file_write_is_stopped_early(make: MakeSandbox, ws: Path) -> None:
    sb = make(ws, storage_mb=64)
    five_gb = 5 * 1024**3
    for how in (
        f"head -c {five_gb} /dev/zero > /app/big",
        f"dd if=/dev/zero of=/app/big bs=1M count={five_gb // 2**20} status=none",
        f'python3 -c \'f = open("/app/big", "wb"); [f.write(bytes(2**20)) for _ in range({five_gb // 2**20})]\'',
        f"truncate -s {five_gb} /app/big",
        f"fallocate -l {five_gb} /app/big",
    ):
        r = run(sb.exec(how, timeout=60))
        contained(r)
        assert not r.timed_out, how  # stopped at the limit, not by the timeout
        big = ws / "big"
        assert not big.exists() or big.stat().st_size <= 64 * 2**20, how
        # st_blocks also counts the file system's own blocks for the file (an ext4 extent
        # block when the file is fragmented, as on a busy disk): a few KiB past the limit.
        assert disk_usage(ws) <= 64 * 2**20 + 64 * 2**10
        big.unlink(missing_ok=True)


def test_many_files_past_the_storage_limit_are_stopped(make: MakeSandbox, ws: Path) -> None:
    sb = make(ws, storage_mb=100)
    r = run(
        sb.exec("for i in $(seq 1 100); do head -c 50000000 /dev/zero > /app/f$i; done", timeout=60)
    )
    contained(r)
    assert "[storage limit: /app holds" in r.stderr and "over its limit of 100 MiB" in r.stderr
    # Stopped long before the loop's end (100 files, 5 GB). The limit is polled, so what
    # is written past it depends on how busy the machine is, not on the sandbox: 788 MB
    # (16 files) through Docker at a load of 7-13, a few files at rest.
    held = disk_usage(ws)
    assert 100 * 2**20 < held < 100 * 50_000_000
    assert len(list(ws.iterdir())) < 100
    # Over the limit, a command may still clean up, and then the workspace is usable again.
    r = run(sb.exec("rm /app/f*; echo ok > /app/small"))
    contained(r, failed=False)
    assert disk_usage(ws) < 2**20


@pytest.mark.slow
@pytest.mark.skipif(
    pids_cgroup_parent() is None and os.geteuid() == 0,
    reason="max_processes is not enforceable here: root and no writable pids cgroup",
)
def test_a_task_that_sets_no_limits_still_has_a_process_cap(make: MakeSandbox, ws: Path) -> None:
    r = run(make(ws).exec(count_forks(3000), timeout=60))
    contained(r, failed=False)
    assert DEFAULT_MAX_PROCESSES - 10 <= int(r.stdout) < DEFAULT_MAX_PROCESSES
