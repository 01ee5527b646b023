"""A seccomp filter that keeps setuid and setgid bits from being set inside the sandbox,
and the sandbox's pid 1 out of reach.

Every system call that can set a mode (``chmod`` and kin, ``open``/``openat``/``creat``
with ``O_CREAT`` or ``O_TMPFILE``, ``mkdir``, ``mknod``) fails with ``EPERM`` when the mode
has ``S_ISUID`` or ``S_ISGID``; ``openat2`` fails with ``ENOSYS``; a process of an ABI the
filter does not describe is killed. ``ptrace``, ``process_vm_readv``/``writev`` and
``pidfd_open`` on pid 1 fail, as do ``pidfd_getfd`` and ``open_by_handle_at`` on any
target, and the kernel keyrings (``add_key``, ``request_key``, ``keyctl``);
:func:`keyring_filter` is that part alone, for image build steps. Supported: x86-64
(with i386 and x32) and arm64; elsewhere :func:`suid_filter` returns None. docs/sandbox.md
and SECURITY.md say why each is needed.
"""

from __future__ import annotations

import errno
import functools
import os
import platform
import struct
from collections.abc import Callable
from dataclasses import dataclass

# <linux/filter.h>, <linux/seccomp.h>, <linux/audit.h>
_LD_W_ABS = 0x20
_ALU_AND_K = 0x54
_JEQ_K = 0x15
_JSET_K = 0x45
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
_AUDIT_ARCH_X86_64 = 0xC000003E
_AUDIT_ARCH_I386 = 0x40000003
_AUDIT_ARCH_AARCH64 = 0xC00000B7
_X32_SYSCALL_BIT = 0x40000000

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]. Every
# supported ABI is little-endian, so an argument's low 32 bits come first.
_NR, _ARCH = 0, 4


def _arg(i: int) -> int:
    return 16 + 8 * i


_S_ISUID_ISGID = 0o6000
_O_CREAT_OR_TMPFILE = 0o100 | 0o20000000  # O_CREAT | __O_TMPFILE (same on every ABI here)


@dataclass(frozen=True, slots=True)
class _ModeCall:
    """A system call whose argument ``mode`` may carry the bits; with ``flags``, only when
    that argument has O_CREAT or O_TMPFILE (otherwise the mode is ignored, maybe garbage)."""

    nr: int
    mode: int
    flags: int | None = None


# Numbered alike on every ABI, being newer than the unification of syscall tables.
_OPENAT2 = 437
_FCHMODAT2 = _ModeCall(452, mode=2)


# Numbered alike on every ABI: pidfd_open, pidfd_getfd.
_PIDFD_OPEN = 434
_PIDFD_GETFD = 438


@dataclass(frozen=True, slots=True)
class _Abi:
    arch: int
    calls: tuple[_ModeCall, ...]
    keys: tuple[int, ...]  # add_key, request_key, keyctl
    # ptrace, process_vm_readv, process_vm_writev (x32's own numbers too), pidfd_open:
    # (nr, argument holding the pid), refused when that pid is 1
    on_pid: tuple[tuple[int, int], ...] = ()
    refused: tuple[int, ...] = ()  # pidfd_getfd, open_by_handle_at: refused outright
    strip: int = 0  # bits cleared from nr first (x32 shares x86-64's numbers)


def _at_calls(
    openat: int, mkdirat: int, mknodat: int, fchmod: int, fchmodat: int
) -> tuple[_ModeCall, ...]:
    return (
        _ModeCall(openat, mode=3, flags=2),
        _ModeCall(mkdirat, mode=2),
        _ModeCall(mknodat, mode=2),
        _ModeCall(fchmod, mode=1),
        _ModeCall(fchmodat, mode=2),
        _FCHMODAT2,
    )


def _legacy_calls(
    open_: int, creat: int, mkdir: int, mknod: int, chmod: int
) -> tuple[_ModeCall, ...]:
    return (
        _ModeCall(open_, mode=2, flags=1),
        _ModeCall(creat, mode=1),
        _ModeCall(mkdir, mode=1),
        _ModeCall(mknod, mode=1),
        _ModeCall(chmod, mode=1),
    )


def _pid_calls(ptrace: int, vm_readv: int, vm_writev: int) -> tuple[tuple[int, int], ...]:
    return ((ptrace, 1), (vm_readv, 0), (vm_writev, 0))


_X86_64 = _Abi(
    _AUDIT_ARCH_X86_64,
    _at_calls(257, 258, 259, 91, 268) + _legacy_calls(2, 85, 83, 133, 90),
    (248, 249, 250),
    on_pid=_pid_calls(101, 310, 311) + _pid_calls(521, 539, 540) + ((_PIDFD_OPEN, 0),),
    refused=(_PIDFD_GETFD, 304),
    strip=_X32_SYSCALL_BIT,
)
_I386 = _Abi(
    _AUDIT_ARCH_I386,
    _at_calls(295, 296, 297, 94, 306) + _legacy_calls(5, 8, 39, 14, 15),
    (286, 287, 288),
    on_pid=_pid_calls(26, 347, 348) + ((_PIDFD_OPEN, 0),),
    refused=(_PIDFD_GETFD, 342),
)
_AARCH64 = _Abi(
    _AUDIT_ARCH_AARCH64,
    _at_calls(56, 34, 33, 52, 53),
    (217, 218, 219),
    on_pid=_pid_calls(117, 270, 271) + ((_PIDFD_OPEN, 0),),
    refused=(_PIDFD_GETFD, 265),
)

_ABIS = {"x86_64": (_X86_64, _I386), "aarch64": (_AARCH64,)}


class _Program:
    """Classic BPF with forward jumps to labels, resolved when packed."""

    def __init__(self) -> None:
        self.ops: list[tuple[int, int | str, int | str, int]] = []
        self.labels: dict[str, int] = {}

    def op(self, code: int, k: int, jt: int | str = 0, jf: int | str = 0) -> None:
        self.ops.append((code, jt, jf, k))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.ops)

    def pack(self) -> bytes:
        def offset(at: int, target: int | str) -> int:
            if isinstance(target, int):
                return target
            jump = self.labels[target] - at - 1
            assert 0 <= jump <= 255, target
            return jump

        return b"".join(
            struct.pack("=HBBI", code, offset(i, jt), offset(i, jf), k)
            for i, (code, jt, jf, k) in enumerate(self.ops)
        )


def _ret(p: _Program, action: int) -> None:
    p.op(_RET_K, action)


def _load_nr(p: _Program, abi: _Abi) -> None:
    p.op(_LD_W_ABS, _NR)
    if abi.strip:
        p.op(_ALU_AND_K, 0xFFFFFFFF & ~abi.strip)


def _abi_block(p: _Program, abi: _Abi, name: str) -> None:
    _load_nr(p, abi)
    _deny_keys(p, abi)
    for nr in abi.refused:
        p.op(_JEQ_K, nr, jt="deny")
    p.op(_JEQ_K, _OPENAT2, jt=f"{name}.enosys")
    for i, call in enumerate(abi.calls):
        p.op(_JEQ_K, call.nr, jt=f"{name}.{i}")
    for i, (nr, _) in enumerate(abi.on_pid):
        p.op(_JEQ_K, nr, jt=f"{name}.pid{i}")
    _ret(p, _RET_ALLOW)
    p.label(f"{name}.enosys")
    _ret(p, _RET_ERRNO | errno.ENOSYS)
    for i, (_, arg) in enumerate(abi.on_pid):
        # The kernel reads a pid as a 32-bit pid_t: the low half of the argument.
        p.label(f"{name}.pid{i}")
        p.op(_LD_W_ABS, _arg(arg))
        p.op(_JEQ_K, 1, jt="deny", jf="allow")
    for i, call in enumerate(abi.calls):
        p.label(f"{name}.{i}")
        if call.flags is not None:
            p.op(_LD_W_ABS, _arg(call.flags))
            p.op(_JSET_K, _O_CREAT_OR_TMPFILE, jf="allow")
        p.op(_LD_W_ABS, _arg(call.mode))
        p.op(_JSET_K, _S_ISUID_ISGID, jt="deny", jf="allow")


def _deny_keys(p: _Program, abi: _Abi) -> None:
    for nr in abi.keys:
        p.op(_JEQ_K, nr, jt="deny")


def _keyring_block(p: _Program, abi: _Abi, name: str) -> None:
    _load_nr(p, abi)
    _deny_keys(p, abi)
    _ret(p, _RET_ALLOW)


def _compile(machine: str | None, block: Callable[[_Program, _Abi, str], None]) -> bytes | None:
    """A filter that runs ``block`` for the ABI of each call (killing a process of an ABI
    not described); its jumps end at "allow" or "deny" (EPERM)."""
    abis = _ABIS.get(machine or platform.machine())
    if abis is None:
        return None
    p = _Program()
    p.op(_LD_W_ABS, _ARCH)
    for abi in abis:
        p.op(_JEQ_K, abi.arch, jt=f"arch{abi.arch:x}")
    _ret(p, _RET_KILL_PROCESS)
    for abi in abis:
        p.label(f"arch{abi.arch:x}")
        block(p, abi, f"a{abi.arch:x}")
    p.label("allow")
    _ret(p, _RET_ALLOW)
    p.label("deny")
    _ret(p, _RET_ERRNO | errno.EPERM)
    return p.pack()


@functools.cache
def suid_filter(machine: str | None = None) -> bytes | None:
    """The compiled filter for ``machine`` (default: this one), or None if unsupported."""
    return _compile(machine, _abi_block)


@functools.cache
def keyring_filter(machine: str | None = None) -> bytes | None:
    """The keyring filter for ``machine`` (default: this one), or None if unsupported."""
    return _compile(machine, _keyring_block)


def filter_fd(program: bytes | None) -> int | None:
    """A descriptor holding ``program`` for ``bwrap --seccomp``, read from its start; None
    for no program. The caller closes it."""
    if program is None:
        return None
    fd = os.memfd_create("stayer-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, program)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
