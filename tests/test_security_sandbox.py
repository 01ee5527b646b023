"""The sandbox holds whoever starts stayer, root included (CI runs these as root).

Every attack runs through both ways a command reaches the sandbox: ``stayer sandbox exec``
(the real command line) and the agent's ``bash`` tool over :class:`BwrapSandbox`. Each
probe prints what it managed to do, and the host side is then checked for its effects, so
that a probe that is itself broken cannot pass for a blocked attack. Probes never change
the host when they are blocked; where a broken sandbox would let one leave something (a
file in /usr), the test removes it.

SECURITY.md lists what these tests cover and what the sandbox does not defend against.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import shlex
import stat
import struct
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from sandbox_helpers import KEY_READER, host_key, needs_bwrap

from stayer.models.base import ToolCall
from stayer.sandbox.base import Mount
from stayer.sandbox.bwrap import BwrapSandbox, etc_secrets
from stayer.tokens import TiktokenCounter
from stayer.tools import default_tools, run_tool
from stayer.tools.base import ToolContext

pytestmark = needs_bwrap

ROOT = Path(__file__).resolve().parent.parent

Runner = Callable[[Path, str], str]


def via_cli(
    ws: Path,
    script: str,
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    sandbox: str = "bwrap",
) -> str:
    """stdout and stderr of ``script`` run by ``stayer sandbox exec`` over ``ws``."""
    full_env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    full_env.update(env or {})
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stayer.cli",
            "sandbox",
            "exec",
            "--json",
            "--workspace",
            str(ws),
            "--sandbox",
            sandbox,
            "--",
            script,
        ],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=120,
    )
    doc = json.loads(proc.stdout)
    assert not doc["timed_out"], doc
    code = doc["exit_code"]
    assert proc.returncode == (128 - code if code < 0 else code), proc.stderr  # the command's own
    return doc["stdout"] + doc["stderr"]


def via_bash_tool(ws: Path, script: str, *, kind: str = "bwrap") -> str:
    """What the agent's bash tool returns for ``script`` over ``ws``, in a sandbox of
    ``kind``: ``bwrap`` started for it, ``bwrap-ahead`` started when a first command ended,
    ``bwrap-persistent`` kept running, after a first command in it."""
    tools = {t.spec.name: t for t in default_tools(TiktokenCounter("o200k_base"))}
    box = BwrapSandbox(ws, persistent=kind == "bwrap-persistent", ahead=kind != "bwrap")
    ctx = ToolContext(
        sandbox=box, workspace=str(ws), output_token_budget=100_000, command_timeout=60
    )

    async def calls() -> str:
        if kind != "bwrap":
            first = ToolCall("c0", "bash", json.dumps({"command": "echo $PPID"}))
            ppid = "2" if kind == "bwrap-persistent" else "1"  # the runner; else bwrap
            assert (await run_tool(tools, first, ctx)).output.startswith(ppid + "\n")
            assert box._kept_box is not None
            if kind == "bwrap-ahead":
                assert box._kept_box._next is not None  # the next one is started ahead
        call = ToolCall("c1", "bash", json.dumps({"command": script}))
        return (await run_tool(tools, call, ctx)).output

    return asyncio.run(calls())


# Every way a command reaches the sandbox, and each kind of bwrap sandbox.
RUNNERS: dict[str, Runner] = {
    "cli": via_cli,
    "bash_tool": via_bash_tool,
    "cli_persistent": functools.partial(via_cli, sandbox="bwrap-persistent"),
    "bash_tool_ahead": functools.partial(via_bash_tool, kind="bwrap-ahead"),
    "bash_tool_persistent": functools.partial(via_bash_tool, kind="bwrap-persistent"),
}


@pytest.fixture(params=list(RUNNERS))
def run_in(request: pytest.FixtureRequest) -> Runner:
    return RUNNERS[request.param]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    return d


def lines_with(output: str, prefix: str) -> list[str]:
    return [line[len(prefix) :] for line in output.splitlines() if line.startswith(prefix)]


# ------------------------------------------------------------------------ who the command is


def test_no_capabilities(run_in: Runner, ws: Path) -> None:
    out = run_in(ws, "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb):' /proc/self/status | sed 's/^/CAP /'")
    caps = dict(line.split() for line in lines_with(out, "CAP "))
    assert set(caps) == {"CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"}, out
    assert all(int(v, 16) == 0 for v in caps.values()), caps


def test_unprivileged_uid_that_maps_to_the_caller(run_in: Runner, ws: Path) -> None:
    out = run_in(
        ws,
        "echo UID $(id -u) $(id -g); sed 's/^/UIDMAP /' /proc/self/uid_map; "
        "sed 's/^/GIDMAP /' /proc/self/gid_map; touch /app/mine && echo TOUCHED",
    )
    [ids] = lines_with(out, "UID ")
    assert "0" not in ids.split(), out
    # Nothing inside is uid or gid 0, nor can become it: 0 has no mapping at all.
    for kind in ("UIDMAP ", "GIDMAP "):
        maps = [line.split() for line in lines_with(out, kind)]
        assert maps and all(m[0] != "0" and m[2] == "1" for m in maps), out
    # What the command writes belongs to whoever started stayer.
    assert "TOUCHED" in out
    st = (ws / "mine").lstat()
    assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())


# ------------------------------------------------------------------------------- mounts


def test_cannot_remount_the_system_read_write(run_in: Runner, ws: Path) -> None:
    name = f"stayer-probe-{uuid.uuid4().hex}"
    planted = [Path("/usr") / name, Path("/etc") / name]
    try:
        out = run_in(
            ws,
            f"mount -o remount,rw,bind /usr && echo REMOUNTED; touch /usr/{name} && echo WROTE; "
            f"mount -o remount,rw /etc && echo REMOUNTED; touch /etc/{name} && echo WROTE",
        )
        assert not lines_with(out, "REMOUNTED") and not lines_with(out, "WROTE"), out
        assert not any(p.exists() for p in planted)
    finally:
        for p in planted:
            p.unlink(missing_ok=True)


def _a_covered_secret() -> str:
    """A non-empty file in /etc that the sandbox covers and we (root) can read, to compare."""
    files = [
        path
        for path, is_dir in etc_secrets()
        if not is_dir and os.access(path, os.R_OK) and os.path.getsize(path) > 0
    ]
    if not files:
        pytest.skip("no covered file in /etc that this user can read: nothing to uncover")
    return files[0]


def test_cannot_unmount_what_covers_a_secret(run_in: Runner, ws: Path) -> None:
    secret = _a_covered_secret()
    digest = hashlib.sha256(Path(secret).read_bytes()).hexdigest()
    out = run_in(
        ws,
        f"umount {secret} && echo UNMOUNTED; umount -l {secret}; umount /proc/sys && echo UNMOUNTED; "
        f"echo HASH $(sha256sum < {secret} 2>/dev/null | cut -d' ' -f1)",
    )
    assert not lines_with(out, "UNMOUNTED"), out
    assert digest not in out


def test_sysctls_and_kernel_knobs_are_not_writable(run_in: Runner, ws: Path) -> None:
    # Opened for writing, never written: a sandbox that failed this test must not have
    # changed the host.
    probe = r"""python3 - <<'EOF'
import os
for path in ("/proc/sys/kernel/core_pattern", "/proc/sys/kernel/modprobe",
             "/proc/sys/vm/drop_caches", "/proc/sys/vm/overcommit_memory",
             "/proc/sys/fs/protected_hardlinks", "/proc/sys/kernel/hostname",
             "/proc/sysrq-trigger"):
    try:
        os.close(os.open(path, os.O_WRONLY))
        print("WRITABLE", path)
    except FileNotFoundError:
        print("ABSENT", path)
    except OSError as e:
        print("REFUSED", path, e.errno)
EOF
umount /proc/sys 2>/dev/null && echo UNMOUNTED
"""
    out = run_in(ws, probe)
    assert not lines_with(out, "WRITABLE ") and "UNMOUNTED" not in out, out
    assert "REFUSED /proc/sys/kernel/core_pattern" in " ".join(out.split()), out


def test_no_device_files(run_in: Runner, ws: Path) -> None:
    out = run_in(
        ws,
        "mknod /app/mem c 1 1 && echo MADE; mknod /app/blk b 7 0 && echo MADE; "
        "mknod /tmp/mem c 1 1 && echo MADE; mkfifo /app/fifo && echo FIFO; "
        "find /dev /app /tmp \\( -type c -o -type b \\) | sed 's/^/DEV /'",
    )
    assert not lines_with(out, "MADE"), out
    assert "FIFO" in out  # positive control: mknod itself works for what is harmless
    assert set(lines_with(out, "DEV ")) <= {
        "/dev/null",
        "/dev/zero",
        "/dev/full",
        "/dev/random",
        "/dev/urandom",
        "/dev/tty",
        "/dev/pts/ptmx",
    }, out
    for path in ws.rglob("*"):
        mode = path.lstat().st_mode
        assert not (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)), path


# A version 2 file capability granting CAP_SYS_ADMIN (bit 21): what `setcap cap_sys_admin+ep`
# writes. On a host file owned by root it would work like a setuid-root binary.
_FSCAP = struct.pack("<IIIII", 0x02000001, 1 << 21, 0, 0, 0).hex()


def test_nested_namespaces_regain_nothing(run_in: Runner, ws: Path) -> None:
    secret = _a_covered_secret()
    digest = hashlib.sha256(Path(secret).read_bytes()).hexdigest()
    name = f"stayer-probe-{uuid.uuid4().hex}"
    setcap = (
        'python3 -c \'import os; os.setxattr("/app/capfile", "security.capability", '
        f'bytes.fromhex("{_FSCAP}"))\' && echo FSCAP'
    )
    try:
        out = run_in(
            ws,
            f"touch /app/capfile; {setcap}; unshare -r sh -c {shlex.quote(setcap)}; "
            f"unshare -rm sh -c 'mount -o remount,rw,bind /usr && echo REMOUNTED; "
            f"touch /usr/{name} && echo WROTE; umount {secret} && echo UNMOUNTED; "
            f"echo HASH $(sha256sum < {secret})'; "
            f"unshare -m sh -c 'umount {secret} && echo UNMOUNTED; echo HASH $(sha256sum < {secret})'; "
            "unshare -U true && echo USERNS",
        )
        assert not any(
            lines_with(out, w) for w in ("FSCAP", "REMOUNTED", "WROTE", "UNMOUNTED", "USERNS")
        ), out
        assert digest not in out
        assert not (Path("/usr") / name).exists()
        with pytest.raises(OSError):
            os.getxattr(ws / "capfile", "security.capability")
    finally:
        (Path("/usr") / name).unlink(missing_ok=True)


# -------------------------------------------------------------------- setuid and setgid


_SUID_ATTEMPTS = r"""
cp /usr/bin/id "$D/s1"; chmod 4755 "$D/s1"
cp /usr/bin/id "$D/s2"; chmod u+s "$D/s2"
cp /usr/bin/id "$D/g1"; chmod 2755 "$D/g1"
install -m 4755 /usr/bin/id "$D/s3"
mkdir -m 2775 "$D/gdir"
python3 - "$D" <<'EOF'
import os, sys
d = sys.argv[1]
for name, call in [
    ("o1", lambda p: os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o4755))),
    ("o2", lambda p: os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o2755))),
    ("m1", lambda p: os.mknod(p, 0o100000 | 0o4755)),
    ("d1", lambda p: os.mkdir(p, 0o2755)),
]:
    try:
        call(os.path.join(d, name))
    except OSError:
        pass
fd = os.open(os.path.join(d, "f1"), os.O_CREAT | os.O_WRONLY, 0o755)
try:
    os.fchmod(fd, 0o6755)
except OSError:
    pass
try:
    os.chmod(os.path.join(d, "f1"), 0o4755, follow_symlinks=True)
except OSError:
    pass
import ctypes  # fchmodat2 (452 on every ABI), which a libc may not call yet
ctypes.CDLL(None, use_errno=True).syscall(452, -100, os.path.join(d, "f1").encode(), 0o4755, 0)
EOF
echo ATTEMPTED
"""


def _suid_or_sgid(root: Path) -> list[str]:
    return [
        str(p)
        for p in [root, *root.rglob("*")]
        if p.lstat().st_mode & (stat.S_ISUID | stat.S_ISGID)
    ]


def test_setuid_and_setgid_bits_never_reach_the_host(run_in: Runner, ws: Path) -> None:
    out = run_in(ws, "D=/app\n" + _SUID_ATTEMPTS)
    assert "ATTEMPTED" in out, out
    assert (ws / "s1").is_file() and (ws / "f1").is_file()  # the files themselves were made
    assert _suid_or_sgid(ws) == []


def test_setuid_bits_never_reach_a_writable_mount_and_mounts_are_nosuid(
    tmp_path: Path, ws: Path
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    box = BwrapSandbox(ws)
    r = asyncio.run(
        box.exec(
            "D=/logs/verifier\n"
            + _SUID_ATTEMPTS
            + "grep -E ' (/app|/tmp|/logs/verifier) ' /proc/self/mountinfo",
            mounts=(Mount(str(logs), "/logs/verifier", writable=True),),
            timeout=60,
        )
    )
    assert "ATTEMPTED" in r.stdout, r
    assert (logs / "s1").is_file()
    assert _suid_or_sgid(logs) == []
    mounts = [line.split() for line in r.stdout.splitlines() if " - " in line]
    assert sorted(m[4] for m in mounts) == ["/app", "/logs/verifier", "/tmp"], r.stdout
    for m in mounts:
        assert {"nosuid", "nodev"} <= set(m[5].split(",")), m


# ------------------------------------------------------------------------------- leaks


@pytest.mark.parametrize("kind", ["bwrap", "bwrap-ahead", "bwrap-persistent"])
def test_host_paths_do_not_leak(
    tmp_path: Path, ws: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    launch = tmp_path / f"launch-{uuid.uuid4().hex}"
    home = tmp_path / f"home-{uuid.uuid4().hex}"
    state = tmp_path / f"state-{uuid.uuid4().hex}"
    for d in (launch, home, state):
        d.mkdir()
    probe = (
        "for f in /proc/1/environ /proc/1/cmdline /proc/self/environ /proc/self/mountinfo "
        "/proc/1/mountinfo; do tr '\\0' '\\n' < $f; done; env; pwd; ls -la / /tmp"
    )
    env = {"HOME": str(home), "STAYER_HOME": str(state), "PWD": str(launch)}
    seen = [via_cli(ws, probe, cwd=launch, env=env, sandbox=kind.replace("-ahead", ""))]
    monkeypatch.chdir(launch)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    seen.append(via_bash_tool(ws, probe, kind=kind))
    for out in seen:
        assert "PWD=/\n" in out, out  # bwrap's own environment was read, and shows /
        for secret in (launch, home, state):
            assert secret.name not in out, (secret, out)


def test_the_hosts_keyrings_are_not_listed_or_read(run_in: Runner, ws: Path) -> None:
    """Started by root, the command is the host's uid 0 to the kernel's key accounting:
    /proc/keys would list root's keys (kerberos tickets, file system keys) by description,
    and /proc/key-users who holds how many."""
    with host_key() as (name, keyctl):
        script = (
            "echo KEYS; cat /proc/keys /proc/key-users 2>&1; "
            f"python3 - {keyctl} {name} <<'EOF'\n{KEY_READER}EOF\n"
            # KEYCTL_GET_KEYRING_ID of the user keyring: any key call at all is refused
            "python3 -c 'import ctypes, sys; l = ctypes.CDLL(None, use_errno=True); "
            f'r = l.syscall({keyctl}, 0, -4, 0); print("KEYCTL", r, ctypes.get_errno())\''
        )
        out = run_in(ws, script)
        assert "KEYS" in out and "no key" in out, out  # the probe ran, and read nothing
        assert name not in out, out
        assert "KEYCTL -1 1\n" in out, out  # EPERM


# ---------------------------------------------------------------------------- run dirs


def test_run_directories_are_private(tmp_path: Path) -> None:
    home = tmp_path / "home"
    full_env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    full_env["STAYER_HOME"] = str(home)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stayer.cli",
            "run",
            str(ROOT / "examples" / "hello-file"),
            "--model",
            "sim:gpt-5",
            "--run-id",
            "r1",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    for d in (home / "runs", home / "runs" / "r1"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
