"""Build a Dockerfile's image as a plain directory, without Docker: bubblewrap over Debian.

The base comes from :mod:`stayer.environments.base`; each step of the
:class:`~stayer.environments.dockerfile.Plan` runs in order in a bubblewrap sandbox whose
``/`` is a copy of the previous layer, and the result is cached as the next layer under a
content hash of everything it depends on. ``RUN`` runs as root (uid 0 of a user namespace
mapped to subordinate ids when stayer is root), with slirp4netns's network unless
``--network=none``; ``COPY``/``ADD`` read the build context read-only inside the same
sandbox; ``WORKDIR`` creates the directory. A step is hostile to the host: no host
loopback, no host file beyond a read-only context, no capability outside its namespace,
every layer mount ``nosuid``, no link it planted ever followed by the host.

The full threat model (what a step can reach, what root in a step amounts to, what the
host does with a layer) is in ``docs/internals.md#environments-build``.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import posixpath
import stat
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from stayer.environments import buildnet, dockerignore, idmap, layers
from stayer.environments.base import base_for, build_base, making, private_dir
from stayer.environments.dockerfile import (
    CopyStep,
    Plan,
    RunStep,
    Step,
    WorkdirStep,
    parse_dockerfile,
)
from stayer.environments.idmap import IdRange, build_ids, shift_tree
from stayer.errors import ConfigError
from stayer.paths import cache_root
from stayer.sandbox.bwrap import SANDBOX_PATH, check_bwrap, cover, proc_secrets
from stayer.sandbox.locate import system_bwrap
from stayer.sandbox.seccomp import filter_fd, keyring_filter

# What a step may take: an apt-get install of a compiler tool chain takes minutes.
STEP_TIMEOUT_S = 1800.0
# Of Docker's default capability set, those for files and users (what dpkg and apt use).
_BUILD_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID")
_CONTEXT = "/.stayer-context"  # where the build context is mounted during COPY
# bump when how a layer is made changes (2: /proc/sys read-only, 3: slirp, 4: subordinate ids)
_RECIPE = 4


class BuildError(ConfigError):
    """The image cannot be built: a step failed, or the Dockerfile asks for what the
    builder cannot do. One line, naming the Dockerfile and its line."""


@dataclass(frozen=True)
class BuiltRoot:
    """An image as a directory: what the agent's sandbox uses as its system."""

    root: Path
    env: dict[str, str]  # the image's ENV
    workdir: str
    user: str
    notes: tuple[str, ...] = field(default=())  # how it differs from what Docker would build


def build_root(
    context: str | Path,
    *,
    cache: Path | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> BuiltRoot:
    """Build ``context``/Dockerfile (each layer reused when cached) and return the image's
    root. Raises :class:`BuildError` (or ConfigError for an unreadable Dockerfile)."""
    context = Path(context).resolve()
    dockerfile = parse_dockerfile(context / "Dockerfile")
    plan = dockerfile.plan()
    sent = dockerignore.walk(context)  # what Docker would send: .dockerignore applied
    base = base_for(plan.base, where=f"{dockerfile.path}: FROM")
    notes = [f"{plan.base}: {base.approximation}"] if base.approximation else []
    bwrap = check_bwrap()
    cache = cache or cache_root()
    layer = build_base(base, cache=cache, log=log)
    key = base.key
    ids = build_ids()
    if ids is not None:
        bwrap = _reachable_bwrap(bwrap, dockerfile.path)
        layer = _shifted_base(layer, ids, base.image, log)
        key = f"{key}:{ids.key}"
    store = cache / "layers"
    private_dir(store)
    with layers.building(store):  # no prune meanwhile
        parent: str | None = None
        for step in plan.steps:
            key = _layer_key(key, step, sent, dockerfile.path)
            layer = _layer(bwrap, layer, key, step, sent, store, dockerfile.path, ids, log)
            made_by = (str(dockerfile.path), f"line {step.line}: {_describe(step)[:120]}")
            layers.used(store, key, made_on=parent, made_by=made_by)
            parent = key
        if parent is not None:
            layers.used(store, parent, image_of=str(dockerfile.path))
    return BuiltRoot(layer, _image_env(plan), plan.workdir, plan.user, tuple(notes))


def _shifted_base(base: Path, ids: IdRange, image: str, log: Callable[[str], None]) -> Path:
    """The base root filesystem with its owners shifted into ``ids`` (the namespace steps
    run in as root): made once per base and range, beside the base itself."""
    real = Path(os.path.realpath(base))  # (a test's cache links to the shared base)
    done = real.parent / f"{real.name}.ids-{ids.key}"
    if done.is_dir():
        return done
    private_dir(real.parent)
    with making(real.parent, done.name):
        if done.is_dir():  # made while we waited
            return done
        partial = real.parent / f"{done.name}.partial"
        _remove(partial)
        log(f"{image}: giving the base's files to the build namespace's ids {ids.uid}… (once)")
        # --one-file-system: a mount left inside the base (a proc that a killed build left
        # behind) is not entered; without it, cp read /proc/*/pagemap until the disk was full.
        argv = ["cp", "-a", "--reflink=auto", "--one-file-system", f"{real}/.", str(partial)]
        subprocess.run(argv, check=True)
        try:
            shift_tree(partial, ids)
        except BaseException:
            _remove(partial)
            raise
        partial.rename(done)
    return done


def _image_env(plan: Plan) -> dict[str, str]:
    return {"PATH": SANDBOX_PATH, **dict(plan.env)}


def _layer_key(parent: str, step: Step, sent: dockerignore.BuildContext, where: Path) -> str:
    """The layer's content hash: its parent's, the step, and for a ``COPY`` the names and
    contents of what it copies, as the context sends them (what .dockerignore leaves out
    counts for nothing); read from the context without following a link."""
    h = hashlib.sha256(f"{_RECIPE}\0{parent}\0".encode())
    h.update(json.dumps([type(step).__name__, asdict(step)], sort_keys=True).encode())
    if isinstance(step, CopyStep):
        for rel in _sources(step, sent, where):
            h.update(os.fsencode(rel) + b"\0")
            kind = sent.entries.get(rel, dockerignore.DIR)  # "." is the context
            if kind == dockerignore.DIR:
                h.update(sent.tree_digest(rel).encode())
            elif kind == dockerignore.LINK:
                h.update(b"link " + os.fsencode(os.readlink(sent.root / rel)))
            elif kind == dockerignore.FILE:
                h.update(dockerignore.file_digest(sent.root / rel))
            else:
                h.update(b"special")
    return h.hexdigest()[:24]


def _sources(step: CopyStep, sent: dockerignore.BuildContext, where: Path) -> list[str]:
    """The context-relative paths ``step`` copies: wildcards expanded, nothing outside the
    context, nothing .dockerignore leaves out, nothing through a link."""
    found: list[str] = []
    for pattern in step.sources:
        rel = posixpath.normpath(pattern.lstrip("/")) if pattern.strip("/") else "."
        if rel == ".." or rel.startswith("../"):
            raise BuildError(f"{where}:{step.line}: COPY {pattern}: outside the build context")
        if glob.has_magic(rel):
            matches = sent.glob(rel)
        else:
            matches = [rel] if rel == "." or rel in sent.entries else []
        if not matches:
            why = "" if sent.complete else " (or left out by its .dockerignore)"
            raise BuildError(
                f"{where}:{step.line}: COPY {pattern}: no such file in the build context {sent.root}{why}"
            )
        found += matches
    return found


def _layer(
    bwrap: str,
    parent: Path,
    key: str,
    step: Step,
    sent: dockerignore.BuildContext,
    store: Path,
    where: Path,
    ids: IdRange | None,
    log: Callable[[str], None],
) -> Path:
    done = store / key
    if done.is_dir():
        return done
    private_dir(store)
    with making(store, key):
        if done.is_dir():  # built while we waited
            return done
        partial = store / f"{key}.partial"
        _remove(partial)
        # parent/. : the tree, also where parent is a link to it (a shared base)
        subprocess.run(["cp", "-a", "--reflink=auto", f"{parent}/.", str(partial)], check=True)
        try:
            log(f"{where}:{step.line}: {_describe(step)}")
            with idmap.staging() as stage:
                _run_step(bwrap, partial, step, sent, where, ids, stage)
        except BaseException:
            _remove(partial)
            raise
        partial.rename(done)
    return done


def _describe(step: Step) -> str:
    if isinstance(step, RunStep):
        return "RUN " + " ".join(step.argv[2:] if step.argv[:2] == ("/bin/sh", "-c") else step.argv)
    if isinstance(step, CopyStep):
        return f"COPY {' '.join(step.sources)} {step.dest}"
    return f"WORKDIR {step.path}"


# Runs as root inside the step's sandbox: $1 dest, $2 "1" if dest is a directory,
# $3 chown, $4 chmod, $5 "1" to unpack archives (ADD), then the sources under _CONTEXT.
_COPY_SCRIPT = """set -e
dest=$1; many=$2; owner=$3; mode=$4; unpack=$5; shift 5
case "$dest" in */) many=1 ;; esac
[ "$many" = 1 ] && mkdir -p "$dest"
fix() { [ -z "$owner" ] || chown -hR "$owner" "$1"; [ -z "$mode" ] || chmod -R "$mode" "$1"; }
for rel in "$@"; do
  src=/.stayer-context/$rel
  if [ -d "$src" ] && [ ! -L "$src" ]; then
    mkdir -p "$dest"
    for entry in "$src"/* "$src"/.[!.]* "$src"/..?*; do
      [ -e "$entry" ] || [ -L "$entry" ] || continue
      cp -a "$entry" "$dest/"
      fix "$dest/${entry##*/}"
    done
  elif [ "$unpack" = 1 ] && case "$rel" in *.tar|*.tar.*|*.tgz|*.tbz2|*.txz) true ;; *) false ;; esac; then
    mkdir -p "$dest"
    tar -xf "$src" -C "$dest"
  elif [ "$many" = 1 ]; then
    cp -a "$src" "$dest/"
    fix "$dest/${rel##*/}"
  else
    mkdir -p "$(dirname "$dest")"
    cp -a "$src" "$dest"
    fix "$dest"
  fi
done
"""


def _reachable_bwrap(bwrap: str, where: Path) -> str:
    """A bwrap that the steps' namespace may run: its root is another user to the host's
    files, so the program (and the libraries beside it, for the bundled one) must be on a
    way others may walk; else the system's, if that one is."""
    blocked = idmap.unreachable_part(bwrap)
    if blocked is None:
        return bwrap
    system = system_bwrap()
    if system is not None and idmap.unreachable_part(system) is None:
        return check_bwrap(system)
    raise BuildError(
        f"{where}: the build's steps cannot run {bwrap}: {blocked} is closed to other users, which the steps' user namespace is; install bubblewrap (apt install bubblewrap), or install stayer where others may read it"
    )


def _run_step(
    bwrap: str,
    root: Path,
    step: Step,
    sent: dockerignore.BuildContext,
    where: Path,
    ids: IdRange | None,
    stage: str,
) -> None:
    context = sent.root
    env = {"PATH": SANDBOX_PATH, "HOME": "/root", "HOSTNAME": "stayer-build"}
    network = False
    binds: list[str] = []
    staged: Path | None = None
    if isinstance(step, RunStep):
        env.update(dict(step.env))
        network = step.network
        argv: list[str] = list(step.argv)
        if step.user not in ("root", "0", "0:0"):
            argv = ["runuser", "-u", step.user.split(":")[0], "--", *argv]
        # Docker creates the working directory of a RUN that names one not yet there.
        argv = [
            "/bin/sh",
            "-c",
            'mkdir -p "$1" && cd "$1" && shift && exec "$@"',
            "sh",
            step.workdir,
            *argv,
        ]
    elif isinstance(step, CopyStep):
        sources = _sources(step, sent, where)
        many = "1" if len(sources) > 1 or any("*" in s or "?" in s for s in step.sources) else "0"
        argv = [
            "/bin/sh",
            "-c",
            _COPY_SCRIPT,
            "sh",
            step.dest,
            many,
            step.chown or "",
            step.chmod or "",
            "1" if step.extract else "0",
            *sources,
        ]
        binds = ["--ro-bind", str(context), _CONTEXT]
    else:
        assert isinstance(step, WorkdirStep)
        argv = ["mkdir", "-p", step.path]
    slirp = buildnet.find_slirp() if network else None
    if network and slirp is None:
        # Never the host's network instead: its loopback services would be in reach.
        raise BuildError(
            f"{where}:{step.line}: {_describe(step)[:80]}: RUN with the network needs slirp4netns (apt install slirp4netns), or RUN --network=none"
        )
    # bwrap makes its mount points in the layer, as root, before the step's root is the
    # layer: a link a step planted there would be followed out of it, onto the host.
    planted = [d for d in ("proc", "dev", "etc", _CONTEXT.lstrip("/")) if _planted(root / d)]
    if planted:
        raise BuildError(
            f"{where}:{step.line}: {_describe(step)[:80]}: /{planted[0]} in the image is not a directory; refusing to build on it"
        )
    mounts: dict[str, Path] = {}
    if ids is not None:
        # The namespace's root may not pass through the cache's directories (0700, the
        # host's root's) to reach the layer by its path: it gets them on a stage.
        mounts["layer"] = root
        args = [bwrap, "--bind", f"{stage}/layer", "/"]
        if binds:
            # It may read only what others may of the host's files: a copy of the
            # context, its own (as Docker's daemon reads all of it), removed after.
            staged = root.parent / f"{root.name}.context"
            _remove(staged)
            if sent.complete:
                cmd = ["cp", "-a", "--reflink=auto", f"{context}/.", str(staged)]
                subprocess.run(cmd, check=True)
            else:  # what .dockerignore leaves out is not in the copy
                dockerignore.stage(sent, staged)
            subprocess.run(["chown", "-hR", f"{ids.uid}:{ids.gid}", str(staged)], check=True)
            mounts["context"] = staged
            binds = ["--ro-bind", f"{stage}/context", _CONTEXT]
    else:
        args = [bwrap, "--bind", str(root), "/"]
        if binds and not sent.complete:
            # What .dockerignore leaves out is not in the copy COPY reads.
            staged = root.parent / f"{root.name}.context"
            _remove(staged)
            dockerignore.stage(sent, staged)
            binds = ["--ro-bind", str(staged), _CONTEXT]
    args += ["--proc", "/proc", "--dev", "/dev", *binds]
    # Real root may write sysctls and trigger sysrq whatever its capabilities: /proc/sys
    # read-only and root-only /proc files covered, as in the agent's sandbox.
    args += ["--ro-bind", "/proc/sys", "/proc/sys", *cover(proc_secrets())]
    # A network namespace of its own always; slirp4netns connects it when the step has
    # the network (stayer.environments.buildnet).
    args += ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    args += ["--unshare-cgroup-try"]
    userns = ids is None and os.geteuid() != 0
    if userns:
        args += ["--unshare-user", "--uid", "0", "--gid", "0"]
    else:
        # bwrap runs as root of the namespace popen_in_userns makes (ids): these are
        # capabilities there, over the namespace's own files only.
        args += ["--cap-drop", "ALL"]
        for cap in _BUILD_CAPS:
            args += ["--cap-add", f"CAP_{cap}"]
    args += ["--die-with-parent", "--new-session", "--clearenv", "--hostname", "stayer-build"]
    for name, value in env.items():
        args += ["--setenv", name, value]
    # Root's user keyring is every uid 0 process's: no keyrings for a step that is root.
    seccomp = filter_fd(keyring_filter())
    if seccomp is not None:
        args += ["--seccomp", str(seccomp)]
    # Over the image's own resolver file only where it is one (not a link bwrap follows).
    resolv = not _planted(root / "etc") and _regular(root / "etc" / "resolv.conf")
    try:
        out, err, code = buildnet.run_step(
            args,
            argv,
            slirp=slirp,
            userns=userns,
            resolv=resolv,
            timeout=STEP_TIMEOUT_S,
            pass_fds=() if seccomp is None else (seccomp,),
            ids=ids,
            stage=stage,
            mounts=mounts,
        )
    except subprocess.TimeoutExpired as e:
        raise BuildError(
            f"{where}:{step.line}: {_describe(step)[:80]}: did not finish in {STEP_TIMEOUT_S:.0f} s"
        ) from e
    except buildnet.NetworkError as e:
        raise BuildError(f"{where}:{step.line}: {_describe(step)[:80]}: {e}") from e
    except idmap.MappingError as e:
        raise BuildError(
            f"{where}:{step.line}: {_describe(step)[:80]}: {e}; give root 65536 ids this system maps in /etc/subuid and /etc/subgid, run stayer as another user, or use --sandbox docker"
        ) from e
    finally:
        if seccomp is not None:
            os.close(seccomp)
        if staged is not None:
            _remove(staged)
        # The mount point of the context, left empty in the layer by bwrap (never a
        # link: rmdir does not follow one).
        if binds:
            with contextlib.suppress(OSError):
                os.rmdir(root / _CONTEXT.lstrip("/"))
    if code != 0:
        output = (err or out).decode("utf-8", "replace").strip().splitlines()
        last = output[-1] if output else ""
        raise BuildError(
            f"{where}:{step.line}: {_describe(step)[:80]}: failed with exit {code}: {last[:200]}"
        )


def _planted(path: Path) -> bool:
    """Whether ``path`` is there but not a directory (a link above all)."""
    try:
        return not stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _remove(path: Path) -> None:
    if path.exists():
        subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


__all__ = ["BuildError", "BuiltRoot", "build_root"]
