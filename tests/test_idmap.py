"""The ids of Docker-free build steps run by root (stayer.environments.idmap): which range,
the base's owners shifted into it, and a range the system cannot map refused."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from stayer.environments import idmap
from stayer.environments.idmap import COUNT, DEFAULT_START, IdRange, MappingError

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mapping other ids needs root")


def test_roots_subordinate_range_is_used_when_there_is_one(tmp_path: Path) -> None:
    subuid = tmp_path / "subuid"
    subuid.write_text("alice:100000:65536\nroot:200000:1000\nroot:300000:65536\n")
    assert idmap._subordinate(subuid) == 300000  # the first of root's wide enough
    subuid.write_text("root:0:65536\n")  # the host's own ids: never
    assert idmap._subordinate(subuid) == DEFAULT_START
    assert idmap._subordinate(tmp_path / "missing") == DEFAULT_START


@needs_root
def test_shifting_a_tree_keeps_setuid_bits_and_links(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "bin").mkdir(parents=True)
    su = tree / "bin" / "su"
    su.write_bytes(b"x")
    os.chown(su, 0, 42)
    su.chmod(0o4755)
    (tree / "link").symlink_to("/etc/passwd")  # not followed
    before = os.stat("/etc/passwd")
    ids = IdRange(DEFAULT_START, DEFAULT_START + COUNT)
    idmap.shift_tree(tree, ids)
    st = os.lstat(su)
    assert (st.st_uid, st.st_gid) == (ids.uid, ids.gid + 42)
    assert stat.S_IMODE(st.st_mode) == 0o4755
    assert os.lstat(tree / "link").st_uid == ids.uid and os.lstat(tree).st_uid == ids.uid
    after = os.stat("/etc/passwd")
    assert (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid)


@needs_root
def test_a_range_the_system_cannot_map_is_an_error_saying_so() -> None:
    with pytest.raises(MappingError, match="cannot map ids"):
        idmap.popen_in_userns(["/bin/true"], IdRange(2**32 - 10, 2**32 - 10))


@needs_root
def test_a_program_runs_as_root_of_its_namespace(tmp_path: Path) -> None:
    import subprocess

    ids = IdRange(DEFAULT_START, DEFAULT_START)
    os.chown(tmp_path, ids.uid, ids.gid)
    with idmap.staging() as stage:
        proc = idmap.popen_in_userns(
            ["/bin/sh", "-c", f"id -u; cat /proc/self/uid_map; touch {stage}/d/made; ls /tmp"],
            ids,
            stage=stage,
            mounts={"d": tmp_path},
            stdout=subprocess.PIPE,
        )
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    lines = out.split(b"\n")
    assert lines[0].split() == [b"0"] and lines[1].split() == [
        b"0",
        str(ids.uid).encode(),
        b"65536",
    ]
    # only the stage is covered: the rest of /tmp is still there (the stage's own name in it)
    assert os.path.basename(stage).encode() in lines[2:]
    assert os.lstat(tmp_path / "made").st_uid == ids.uid


@needs_root
def test_the_shifted_base_never_enters_a_mount_left_inside_the_base(tmp_path: Path) -> None:
    """A proc left mounted on a base (a build killed mid-way) once made the copy read
    /proc/*/pagemap until the disk was full: the copy stays on the base's file system."""
    import subprocess

    from stayer.environments.build import _shifted_base

    base = tmp_path / "cache" / "rootfs" / "base"
    (base / "etc").mkdir(parents=True)
    (base / "etc" / "os-release").write_text("ID=debian\n")
    (base / "proc").mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "none", str(base / "proc")])
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        (base / "proc" / "pagemap").write_text("not to be copied\n")
        done = _shifted_base(base, IdRange(DEFAULT_START, DEFAULT_START), "img", lambda _: None)
    finally:
        subprocess.run(["umount", str(base / "proc")], check=True)
    assert (done / "etc" / "os-release").read_text() == "ID=debian\n"
    assert (done / "proc").is_dir() and list((done / "proc").iterdir()) == []
