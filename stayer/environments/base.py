"""Base root filesystems for images built without Docker: Debian made with ``mmdebstrap``.

Without a registry the common bases are made from the Debian archive: ``debian:<release>``
(minbase), ``python:<version>[-slim][-<release>]`` (that release with its own Python 3,
pip and venv; a version that differs from the tag's is said in
:attr:`BaseSystem.approximation`), ``ubuntu:<version>`` (the Debian release of its time,
always an approximation). Any other base is refused: the task then needs
``--sandbox docker``. A root filesystem is made once per release and package set and
kept in :func:`cache_root`; concurrent builders wait on a lock.

The mapping table and its reasons: ``docs/internals.md#environments-base``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from stayer.errors import ConfigError
from stayer.paths import cache_root

# Debian releases by name and number, and the Python 3 each ships.
_RELEASES = {"bullseye": "11", "bookworm": "12", "trixie": "13"}
_PYTHON = {"bullseye": "3.9", "bookworm": "3.11", "trixie": "3.13"}
# What the official images' "latest" and untagged python:*-slim are built on (since 2025-08).
_CURRENT = "trixie"
_UBUNTU = (("20.04", "bullseye"), ("22.04", "bookworm"), ("24.04", "trixie"))
# Packages of the official python:*-slim images besides Python (certificates, tzdata…).
_PYTHON_PACKAGES = (
    "python3",
    "python3-pip",
    "python3-venv",
    "python-is-python3",
    "ca-certificates",
    "netbase",
    "tzdata",
)
# Bump when how a root filesystem is made changes, so that old caches are not reused.
_RECIPE = 1
MKROOT_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class BaseSystem:
    """What ``image`` is made of here."""

    image: str
    release: str  # a Debian release name
    packages: tuple[str, ...]  # installed on top of minbase
    approximation: str | None = None  # how it differs from the image, when it does

    @property
    def key(self) -> str:
        """Content hash of the recipe: equal keys make equal root filesystems."""
        recipe = {"release": self.release, "packages": sorted(self.packages), "recipe": _RECIPE}
        return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:20]


def base_for(image: str, *, where: str = "FROM") -> BaseSystem:
    """The Debian system standing in for ``image``; ConfigError for bases there is none for."""
    name, _, tag = image.partition(":")
    name = name.removeprefix("docker.io/").removeprefix("library/")
    tag = tag.split("@")[0] or "latest"
    if name == "debian":
        release = _debian_release(tag.removesuffix("-slim"))
        if release is None:
            raise ConfigError(
                f"{where}: {image}: unknown Debian release {tag!r}; use one of {', '.join(_RELEASES)}"
            )
        return BaseSystem(image, release, ())
    if name == "python":
        m = re.fullmatch(r"(3(?:\.\d+)?)(?:\.\d+)?(-slim)?(?:-([a-z]+))?", tag)
        if tag == "latest":
            m = re.fullmatch(r"(3)()()", "3")
        if m is None or (m.group(3) and m.group(3) not in _RELEASES):
            raise ConfigError(
                f"{where}: {image}: no Docker-free stand-in for this python tag; use --sandbox docker"
            )
        release = m.group(3) or _CURRENT
        wanted, have = m.group(1), _PYTHON[release]
        why = None
        if wanted != have and wanted != "3":
            why = f"Python {have} (Debian {release}'s) instead of {wanted}"
        return BaseSystem(image, release, _PYTHON_PACKAGES, why)
    if name == "ubuntu":
        version = {"focal": "20.04", "jammy": "22.04", "noble": "24.04", "latest": "24.04"}.get(
            tag, tag
        )
        release = next((r for v, r in reversed(_UBUNTU) if _version(version) >= _version(v)), None)
        if release is None:
            raise ConfigError(
                f"{where}: {image}: no Docker-free stand-in for Ubuntu before 20.04; use --sandbox docker"
            )
        return BaseSystem(
            image, release, ("ca-certificates",), f"Debian {release} instead of Ubuntu {version}"
        )
    raise ConfigError(
        f"{where}: {image}: no Docker-free base for this image (only debian:*, ubuntu:* and python:*); use --sandbox docker"
    )


def _debian_release(tag: str) -> str | None:
    if tag in ("latest", "stable"):
        return _CURRENT
    if tag in _RELEASES:
        return tag
    major = tag.split(".")[0]
    return next((r for r, n in _RELEASES.items() if n == major), None)


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.split("."))
    except ValueError:
        return (0,)


def build_base(
    base: BaseSystem, *, cache: Path | None = None, log: Callable[[str], None] = lambda _: None
) -> Path:
    """The root filesystem for ``base``, made with mmdebstrap unless already cached; the
    path of its directory. Made under a temporary name and renamed when complete, so an
    interrupted build leaves nothing that looks finished."""
    mmdebstrap = shutil.which("mmdebstrap")
    root = (cache or cache_root()) / "rootfs"
    done = root / base.key
    if (done / "etc" / "debian_version").is_file():
        return done
    if mmdebstrap is None:
        raise ConfigError(
            f"FROM {base.image}: building without Docker needs mmdebstrap (apt install mmdebstrap), or use --sandbox docker"
        )
    private_dir(root)
    with making(root, base.key):
        if (done / "etc" / "debian_version").is_file():  # made while we waited
            return done
        partial = root / f"{base.key}.partial"
        _remove(partial)
        log(
            f"making the {base.release} root filesystem for {base.image} with mmdebstrap (minutes, once)"
        )
        argv = [mmdebstrap, "--variant=minbase", "--quiet", "--format=directory"]
        if base.packages:
            argv.append("--include=" + ",".join(base.packages))
        # The official python images let pip install system-wide; Debian's marks its
        # Python externally managed, which would fail every "RUN pip install".
        argv.append('--customize-hook=rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED')
        # Like the official images: no apt caches and package lists kept in the base.
        argv.append('--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin')
        argv += [base.release, str(partial)]
        try:
            proc = subprocess.run(
                argv, capture_output=True, timeout=MKROOT_TIMEOUT_S, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired as e:
            _remove(partial)
            raise ConfigError(
                f"FROM {base.image}: mmdebstrap did not finish in {MKROOT_TIMEOUT_S:.0f} s"
            ) from e
        if proc.returncode != 0:
            _remove(partial)
            tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [
                f"exit {proc.returncode}"
            ]
            raise ConfigError(f"FROM {base.image}: mmdebstrap failed: {tail[0]}")
        # As root, mmdebstrap mounts proc on the target and only warns when it cannot unmount
        # it again: a base is never cached with a mount inside it.
        left = _unmount_under(partial)
        if left:
            raise ConfigError(
                f"FROM {base.image}: mmdebstrap left {left[0]} mounted and it could not be unmounted"
            )
        # apt's sandbox user must be able to write temporary files, as in any image.
        os.chmod(partial / "tmp", 0o1777)
        partial.rename(done)
    return done


@contextlib.contextmanager
def making(directory: Path, name: str) -> Iterator[None]:
    """Held while ``directory``/``name`` (a base, a layer) is made: one maker at a time.
    Whoever waited here then finds it made, or makes it (the first failed). The lock is a
    file of its own, ``<name>.build``, removed when let go; a process that *uses* what was
    made may hold another lock on it for its whole life (``layers.used``), which a maker
    must never wait for."""
    path = directory / f"{name}.build"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            st, held = os.stat(path, follow_symlinks=False), os.fstat(fd)
            if (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino):
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # its holder removed it while we waited: lock the one there now
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # before the lock is let go: a waiter then sees it gone
        os.close(fd)


def private_dir(path: Path) -> None:
    """Create ``path`` (and its parents) for root filesystems: only its owner may enter it,
    since what it holds has setuid programs (su, mount, whatever a RUN step made) that no
    other local user may reach. ConfigError, in one line, where ``path`` is a link or
    another user's, or where another user could move it aside (a parent others may
    write, not sticky): chmod alone would not keep them out."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(
            f"{path}: not a directory of its own (a link?): {e.strerror}; remove it or set STAYER_CACHE elsewhere"
        ) from e
    try:
        parent = os.stat(path.parent)
        if os.fstat(fd).st_uid != os.geteuid():
            raise ConfigError(
                f"{path}: belongs to another user, who could enter it; remove it or set STAYER_CACHE elsewhere"
            )
        if parent.st_mode & stat.S_IWOTH and not parent.st_mode & stat.S_ISVTX:
            raise ConfigError(
                f"{path.parent}: others may write it (and move {path.name} aside); set STAYER_CACHE elsewhere"
            )
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def mounts_under(path: Path) -> list[str]:
    """The mount points under ``path`` (not ``path`` itself), deepest first."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")  # \040 for a space
        if point.startswith(f"{path}/"):
            points.append(point)
    return sorted(points, key=len, reverse=True)


def _unmount_under(path: Path) -> list[str]:
    """Unmount whatever is mounted under ``path``, deepest first: what stays mounted."""
    for point in mounts_under(path):
        subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)
    return mounts_under(path)


def _remove(path: Path) -> None:
    if path.exists():
        subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


__all__ = ["BaseSystem", "base_for", "build_base", "cache_root", "private_dir"]
