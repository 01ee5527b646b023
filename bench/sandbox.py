"""Sandbox start-up overhead, task image builds and workspace snapshot speed.

    python bench/sandbox.py [--runs 200] [--command true] [--files 10000] [--mb 100] [--repeat 3] [--settle 6]
                            [--dir DIR] [--json]
                            [--images] [--docker-runs 30] [--build-rounds 3] [--no-snapshots]

1. **Exec overhead.** The same command (``--command``, default ``true``, a bash builtin;
   ``/bin/true`` adds a program's start) run ``--runs`` times, interleaved, as a
   bare ``subprocess.run(["/bin/bash", "-c", COMMAND])`` and through stayer's sandbox exactly
   as the agent's bash tool runs it (bwrap with the default limits, pids cgroup, output
   capture, asyncio; a fresh sandbox per command, started ahead when the command before
   ended: the benchmark's own work between two commands gives it no event loop turn; its
   start is waited for before the other variants are timed, and reported as "next one's
   start", so that none of it lands on them);
   through the same sandbox started only when the command comes (``ahead=False``, as
   before stayer started sandboxes ahead); through the same sandbox kept running between commands
   (``bwrap-persistent``: each command's bash started ahead in it, when the command before
   ended, and waited for before the next variant is timed); also through the
   unsandboxed ``local`` backend, to separate stayer's own cost from bubblewrap's; and the
   floor under a fresh sandbox per command: the same ``bwrap`` binary run bare, with
   namespaces and the fewest mounts, and with exactly stayer's options. min, p50
   and p99 of each, overhead in ms and as a ratio, with the load average before and after.
   Target (issue 20): p50 overhead under 5 ms.
   ``--exec-only`` skips the snapshots.
2. **Snapshots** of a ``--mb`` MB, ``--files``-file workspace (random bytes, 100
   directories), min and median over ``--repeat`` rounds: a first snapshot into an
   empty store plus a restore into an empty directory (target under 1 s), a snapshot of
   the unchanged workspace, 5 interleaved samples per round of each of: in this process
   (the change watch; target under 1 ms), in an actual new Python process started for it
   (target under 50 ms for ``snapshot()``, the whole process's time from spawn to exit
   shown beside it; and what a resumed run does first: ``restore`` of that snapshot, then
   ``snapshot``, in a new process), and by a fresh store that uses no watch (a
   stat scan against the stat cache); then a step that changed 10 files, a rollback of
   that step, and the breakers' workspace fingerprint (also taken every step). The
   baseline is what "a full copy each time" costs: ``cp -a`` of the workspace, measured in
   the same run, right before or after the restore (alternating). Before each of the
   three bulk operations (first snapshot, restore, ``cp -a``) the benchmark waits
   ``--settle`` seconds (default 6): creating or deleting 10,000 files keeps an ext4
   journal busy for up to its 5 s commit interval, and whichever operation comes next
   would pay for the one before. ``--settle 0`` shows that back-to-back cost.
   ``--journal-snapshots`` instead times the journal's snapshots (``BlobSnapshots``, the
   Postgres journal's, the same algorithm over the journal's blobs) over an in-memory blob
   store: first, unchanged (5 samples a round), after a 10-file step, its rollback, and a
   restore into an empty directory by another instance (``--settle`` before the first
   snapshot and that restore).
3. **Task images** (``--images``; root, with docker.io and mmdebstrap installed): the
   image of ``tests/fixtures/image-task`` (a Debian base plus ``apt-get install dc`` and a
   ``COPY``) built ``--build-rounds`` times cold and then found cached, with Docker (a
   private ``dockerd`` started for the run, its base imported from the mmdebstrap root)
   and without it (``bwrap-image``, layers in a fresh cache over the same base),
   interleaved; then exec overhead of ``true`` in both, ``--docker-runs`` times each,
   interleaved with plain bwrap. The base root filesystem itself (mmdebstrap, minutes,
   once per release) is made before, not timed. Min and median of each; the load
   average before and after is in the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _stdout import json_only  # bench/: --json prints one document on stdout

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stayer.guard.breakers import TreeFingerprint  # noqa: E402
from stayer.sandbox import make_sandbox  # noqa: E402
from stayer.sandbox.bwrap import BwrapSandbox, host_etc  # noqa: E402
from stayer.workspace.snapshot import FileSnapshotStore  # noqa: E402

# The time from the end of a command until the next one's sandbox, started ahead, is ready:
# what the agent's work between two commands must cover for the next to find it ready.
NEXT_START = "stayer bwrap: next one's start"


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


async def exec_overhead(
    runs: int, workspace: Path, command: str = "true"
) -> dict[str, dict[str, float]]:
    with host_etc() as etc:  # the copy of /etc that stayer's sandboxes mount
        return await _exec_overhead(runs, workspace, etc, command)


async def _exec_overhead(
    runs: int, workspace: Path, etc: str, command: str
) -> dict[str, dict[str, float]]:
    boxes = {
        "stayer bwrap": make_sandbox("bwrap", workspace),
        "stayer bwrap, cold start": BwrapSandbox(workspace, ahead=False),
        "stayer bwrap-persistent": make_sandbox("bwrap-persistent", workspace),
        "stayer local": make_sandbox("local", workspace),
    }
    # The floor under a fresh sandbox per command: the same bwrap binary run bare by
    # subprocess.run, once with namespaces and the fewest mounts a sandbox needs, once with
    # exactly the options stayer passes (its mounts: the read-only system, its copy of /etc,
    # the covers over host secrets in /proc), no seccomp filter, limits or capture.
    bw, persistent = boxes["stayer bwrap"], boxes["stayer bwrap-persistent"]
    assert isinstance(bw, BwrapSandbox) and isinstance(persistent, BwrapSandbox)
    floors = {
        "bwrap alone, namespaces": [
            bw.bwrap, "--unshare-all", "--die-with-parent", "--new-session",
            "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
        ],
        "bwrap alone, stayer's mounts": [bw.bwrap, *bw._options((), "/app", None, etc)],
    }  # fmt: skip
    samples: dict[str, list[float]] = {
        "bare subprocess.run": [],
        **{k: [] for k in floors},
        **{k: [] for k in boxes},
        NEXT_START: [],
    }
    for i in range(runs + 10):  # the first 10 warm up caches and probes
        t0 = time.perf_counter()
        subprocess.run(["/bin/bash", "-c", command], check=True)
        bare = time.perf_counter() - t0
        times = {"bare subprocess.run": bare}
        for name, head in floors.items():
            t0 = time.perf_counter()
            subprocess.run([*head, "/bin/bash", "-c", command], check=True)
            times[name] = time.perf_counter() - t0
        for name, box in boxes.items():
            t0 = time.perf_counter()
            r = await box.exec(command, timeout=30)
            times[name] = time.perf_counter() - t0
            assert r.exit_code == 0, r
            if box is bw:
                # Its next sandbox starts now, in a thread: timed here, and waited for, so
                # that none of its start is charged to the variants timed after it.
                assert bw.next_ready(timeout=60)
                times[NEXT_START] = time.perf_counter() - t0 - times[name]
            elif box is persistent:
                # Its next command's bash starts now: waited for, for the same reason.
                assert persistent.next_ready(timeout=60)
        if i >= 10:
            for name, t in times.items():
                samples[name].append(t)
    return {
        name: {
            "min_ms": min(xs) * 1000,
            "p50_ms": percentile(xs, 50) * 1000,
            "p99_ms": percentile(xs, 99) * 1000,
        }
        for name, xs in samples.items()
    }


def make_workspace(root: Path, files: int, total_bytes: int, seed: int = 3) -> None:
    rnd = random.Random(seed)
    size = total_bytes // files
    for i in range(files):
        d = root / f"pkg{i % 100:02d}" / f"sub{i % 7}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"file{i}.dat").write_bytes(rnd.randbytes(size))
    # Settled files, as in a workspace between two steps (not written this very instant).
    time.sleep(0.1)


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def change_step(ws: Path, rnd: random.Random) -> None:
    """What an agent step might do: edit 10 files, add 10, delete a directory."""
    for i in rnd.sample(range(1000), 10):
        (ws / f"pkg{i % 100:02d}" / f"sub{i % 7}" / f"file{i}.dat").write_bytes(
            rnd.randbytes(10_000)
        )
    for i in range(10):
        (ws / f"new{i}.txt").write_text(f"new {i}\n" * 100)
    shutil.rmtree(ws / "pkg99" / "sub0", ignore_errors=True)


def snapshot_figures(
    base: Path, files: int, mb: int, repeat: int, settle: float
) -> dict[str, dict[str, float]]:
    ws = base / "ws"
    make_workspace(ws, files, mb * 10**6)
    rows: dict[str, list[float]] = {
        k: []
        for k in (
            "first snapshot (empty store)",
            "restore into an empty dir",
            "snapshot + restore",
            "unchanged snapshot (change watch)",
            "unchanged snapshot (new process)",
            "new process: start, import, snapshot",
            "resume in a new process: restore + snapshot",
            "unchanged snapshot (stat scan, no watch)",
            "snapshot after a 10-file step",
            "rollback of that step (restore in place)",
            "cp -a (full copy baseline)",
            "breakers' workspace fingerprint",
        )
    }
    rnd = random.Random(7)
    for r in range(repeat):
        store_dir, copy = base / f"store{r}", base / f"copy{r}"
        store = FileSnapshotStore(store_dir)
        time.sleep(settle)
        first = timed(lambda s=store: s.snapshot(ws))
        sid = store.snapshot(ws)
        cp_dest = base / f"cp{r}"

        def cp(d: Path = cp_dest) -> float:
            time.sleep(settle)
            return timed(lambda: subprocess.run(["cp", "-a", str(ws), str(d)], check=True))

        if r % 2:
            rows["cp -a (full copy baseline)"].append(cp())
        time.sleep(settle)
        restore = timed(lambda s=store, c=copy, i=sid: s.restore(i, c))
        if not r % 2:
            rows["cp -a (full copy baseline)"].append(cp())
        rows["first snapshot (empty store)"].append(first)
        rows["restore into an empty dir"].append(restore)
        rows["snapshot + restore"].append(first + restore)
        # The unchanged figures, interleaved, SAMPLES of each per round: in this process
        # (the change watch), in an actual new process (what a resumed run pays), and by a
        # fresh store in this process that may not use any watch (a stat scan).
        for _ in range(SAMPLES):
            rows["unchanged snapshot (change watch)"].append(timed(lambda s=store: s.snapshot(ws)))
            inner, whole = new_process_snapshot(store_dir, ws, sid)
            rows["unchanged snapshot (new process)"].append(inner)
            rows["new process: start, import, snapshot"].append(whole)
            inner, _whole = new_process_snapshot(store_dir, ws, sid, resume=True)
            rows["resume in a new process: restore + snapshot"].append(inner)
            fresh = scan_only_store(store_dir)
            rows["unchanged snapshot (stat scan, no watch)"].append(
                timed(lambda s=fresh, i=sid: check_id(s.snapshot(ws), i))
            )
            fresh.close()
        rows["breakers' workspace fingerprint"].append(timed(TreeFingerprint(ws).fingerprint))
        change_step(ws, rnd)
        rows["snapshot after a 10-file step"].append(timed(lambda s=store: s.snapshot(ws)))
        rows["rollback of that step (restore in place)"].append(
            timed(lambda s=store, i=sid: s.restore(i, ws))
        )
        store.close()
        # Nothing is deleted between rounds: on a file system mounted with ``discard``,
        # freeing 20,000 files stalls it for longer than any settle time.
    return {
        k: {"min_ms": min(v) * 1000, "median_ms": statistics.median(v) * 1000, "n": len(v)}
        for k, v in rows.items()
    }


# Unchanged-snapshot samples per round (min and median over all rounds are reported).
SAMPLES = 5
_CHILD = """
import json, sys, time
t0 = time.perf_counter()
from pathlib import Path
from stayer.workspace.snapshot import FileSnapshotStore
store = FileSnapshotStore(sys.argv[1])
t1 = time.perf_counter()
if len(sys.argv) > 3:  # a resumed run: back to its last snapshot, then the next one
    store.restore(sys.argv[3], Path(sys.argv[2]))
sid = store.snapshot(Path(sys.argv[2]))
t2 = time.perf_counter()
print(json.dumps({"id": sid, "import_s": t1 - t0, "snapshot_s": t2 - t1}))
"""


def new_process_snapshot(
    store_dir: Path, ws: Path, expected: str, *, resume: bool = False
) -> tuple[float, float]:
    """An unchanged snapshot taken by a new Python process: (seconds in ``snapshot()``
    itself, seconds of the whole process from spawn to exit). With ``resume``, as a resumed
    run begins: ``restore(expected)`` and then ``snapshot()``, both in the first figure."""
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(store_dir), str(ws), *([expected] if resume else [])],
        check=True,
        capture_output=True,
        env=env,
    )
    whole = time.perf_counter() - t0
    doc = json.loads(out.stdout)
    check_id(doc["id"], expected)
    return doc["snapshot_s"], whole


def scan_only_store(store_dir: Path) -> FileSnapshotStore:
    """A store on ``store_dir`` that finds the workspace by a stat scan against the stat
    cache (no shared watch, no change watch yet)."""
    try:
        return FileSnapshotStore(store_dir, shared_watch=False)  # type: ignore[call-arg]
    except TypeError:  # a version without the shared watch
        return FileSnapshotStore(store_dir)


def check_id(got: str, expected: str) -> None:
    if got != expected:
        raise SystemExit(f"bench: an unchanged snapshot gave {got}, expected {expected}")


def journal_snapshot_figures(
    base: Path, files: int, mb: int, repeat: int, settle: float
) -> dict[str, dict]:
    """The journal's snapshots (``BlobSnapshots``, as a Postgres journal keeps them) over
    an in-memory blob store, so that the figures are the algorithm's, not the database's:
    a first snapshot, an unchanged one (a stat scan: there is no watch), one after a
    10-file step, the rollback of that step, a restore into an empty directory (the bulk
    ones after ``settle`` seconds, as in :func:`snapshot_figures`)."""
    from stayer.journal.snapshot import BlobSnapshots

    ws = base / "journal-ws"
    make_workspace(ws, files, mb * 10**6, seed=5)
    rows: dict[str, list[float]] = {
        k: []
        for k in (
            "first snapshot",
            "unchanged snapshot",
            "snapshot after a 10-file step",
            "rollback of that step (restore in place)",
            "restore into an empty dir",
        )
    }
    rnd = random.Random(11)
    for r in range(repeat):
        blobs: dict[str, bytes] = {}
        snaps = BlobSnapshots(blobs.update, blobs.__getitem__)
        time.sleep(settle)
        rows["first snapshot"].append(timed(lambda s=snaps: s.snapshot(ws)))
        sid = snaps.snapshot(ws)
        for _ in range(SAMPLES):
            rows["unchanged snapshot"].append(
                timed(lambda s=snaps, i=sid: check_id(s.snapshot(ws), i))
            )
        change_step(ws, rnd)
        rows["snapshot after a 10-file step"].append(timed(lambda s=snaps: s.snapshot(ws)))
        rows["rollback of that step (restore in place)"].append(
            timed(lambda s=snaps, i=sid: s.restore(i, ws))
        )
        other = BlobSnapshots(blobs.update, blobs.__getitem__)  # as another process
        time.sleep(settle)
        rows["restore into an empty dir"].append(
            timed(lambda s=other, i=sid, d=base / f"journal-copy{r}": s.restore(i, d))
        )
    return {
        k: {"min_ms": min(v) * 1000, "median_ms": statistics.median(v) * 1000, "n": len(v)}
        for k, v in rows.items()
    }


def image_figures(build_rounds: int, exec_runs: int, base: Path) -> dict[str, object]:
    """Cold and cached builds of the fixture task's image, with and without Docker, and
    exec overhead in each (see the module's docstring, item 3)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from docker_helpers import BASE_IMAGE, import_base, private_dockerd

    from stayer.environments.base import base_for, build_base
    from stayer.environments.docker import image_tag
    from stayer.environments.prepare import prepare_environment
    from stayer.sandbox.docker import check_docker

    context = (
        Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "image-task" / "environment"
    )
    root = build_base(base_for(BASE_IMAGE), log=lambda line: print(line, file=sys.stderr))
    load_before = os.getloadavg()
    rows: dict[str, list[float]] = {
        k: []
        for k in (
            "docker build, cold",
            "docker build, cached",
            "bwrap-image build, cold",
            "bwrap-image build, cached",
        )
    }
    with private_dockerd() as host:
        os.environ["DOCKER_HOST"] = host
        check_docker.cache_clear()
        import_base(root)
        for r in range(build_rounds):
            # A fresh layer cache over the same base: every step runs again.
            cache = base / f"image-cache{r}"
            (cache / "rootfs").mkdir(parents=True)
            subprocess.run(
                ["cp", "-a", "--reflink=auto", str(root), str(cache / "rootfs" / root.name)],
                check=True,
            )
            os.environ["STAYER_CACHE"] = str(cache)
            for kind in ("docker", "bwrap-image") if r % 2 == 0 else ("bwrap-image", "docker"):
                if kind == "docker":  # the tag of this context, and its intermediate images
                    subprocess.run(
                        ["docker", "image", "rm", "--force", image_tag(context)],
                        capture_output=True,
                    )
                t0 = time.perf_counter()
                prepare_environment(kind, context)
                rows[f"{kind} build, cold"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                prepare_environment(kind, context)
                rows[f"{kind} build, cached"].append(time.perf_counter() - t0)
        # Exec overhead in the images just built, interleaved with plain bwrap.
        ws = base / "image-exec-ws"
        ws.mkdir()
        boxes = {
            "stayer bwrap": make_sandbox("bwrap", ws),
            "stayer bwrap-image": prepare_environment("bwrap-image", context).sandbox(ws),
            "stayer docker": prepare_environment("docker", context).sandbox(ws),
        }
        samples: dict[str, list[float]] = {k: [] for k in boxes}

        async def execs() -> None:
            for i in range(exec_runs + 2):  # two to warm up
                for name, box in boxes.items():
                    t0 = time.perf_counter()
                    r = await box.exec("true", timeout=60)
                    assert r.exit_code == 0, r
                    if i >= 2:
                        samples[name].append(time.perf_counter() - t0)

        asyncio.run(execs())
    load_after = os.getloadavg()
    summary = {
        name: {"min_s": min(xs), "median_s": statistics.median(xs), "n": len(xs)}
        for name, xs in rows.items()
    }
    exec_ms = {
        name: {"min_ms": min(xs) * 1000, "median_ms": statistics.median(xs) * 1000, "n": len(xs)}
        for name, xs in samples.items()
    }
    return {
        "builds": summary,
        "exec": exec_ms,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200, help="exec calls per variant")
    ap.add_argument(
        "--command",
        default="true",
        help="what each exec runs (default `true`, a bash builtin; `/bin/true` adds a program's start)",
    )
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3, help="rounds of snapshot figures (median)")
    ap.add_argument(
        "--settle", type=float, default=6.0, help="seconds to wait before each bulk operation"
    )
    ap.add_argument("--dir", default=None, help="where to build the workspaces (default: temp)")
    ap.add_argument(
        "--json",
        action="store_true",
        help="Print one JSON document of the figures on stdout (the tables on stderr).",
    )
    ap.add_argument(
        "--images", action="store_true", help="also time task image builds and docker exec (root)"
    )
    ap.add_argument(
        "--docker-runs", type=int, default=30, help="exec calls per variant with --images"
    )
    ap.add_argument(
        "--build-rounds", type=int, default=3, help="cold builds per builder with --images"
    )
    ap.add_argument("--no-snapshots", action="store_true", help="leave out the snapshot figures")
    ap.add_argument(
        "--journal-snapshots",
        action="store_true",
        help="only the journal's snapshots (BlobSnapshots over in-memory blobs): no exec, no images",
    )
    ap.add_argument(
        "--exec-only", action="store_true", help="only the exec overhead (no snapshots, no images)"
    )
    args = ap.parse_args()
    emit = json_only(args.json)

    images = None
    load_before = os.getloadavg()
    if args.journal_snapshots:
        with tempfile.TemporaryDirectory(prefix="stayer-bench-", dir=args.dir) as tmp:
            journal = journal_snapshot_figures(
                Path(tmp), args.files, args.mb, args.repeat, args.settle
            )
        print(
            f"journal snapshots (BlobSnapshots, in-memory blobs) of a {args.mb} MB, "
            f"{args.files:,}-file workspace, {args.repeat} rounds, {args.settle:g} s settle "
            f"(load {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after)"
        )
        print(f"{'':46} {'min ms':>9} {'median ms':>10} {'n':>3}")
        for name, r in journal.items():
            print(f"{name:46} {r['min_ms']:9.2f} {r['median_ms']:10.2f} {r['n']:3}")
        if args.json:
            doc = {"journal_snapshot_samples": journal, "files": args.files, "mb": args.mb}
            emit({**doc, "load_before": load_before, "load_after": os.getloadavg()})
        return
    with tempfile.TemporaryDirectory(prefix="stayer-bench-", dir=args.dir) as tmp:
        base = Path(tmp)
        (base / "exec-ws").mkdir()
        execs = asyncio.run(exec_overhead(args.runs, base / "exec-ws", args.command))
        snaps = (
            {}
            if args.no_snapshots or args.exec_only
            else snapshot_figures(base, args.files, args.mb, args.repeat, args.settle)
        )
        if args.images and not args.exec_only:
            images = image_figures(args.build_rounds, args.docker_runs, base)
    load = {"load_before": load_before, "load_after": os.getloadavg()}

    bare = execs["bare subprocess.run"]
    print(
        f"exec of `{args.command}`, {args.runs} runs each, interleaved ({os.cpu_count()} CPUs; "
        f"load {load['load_before'][0]:.1f} before, {load['load_after'][0]:.1f} after)"
    )
    print(
        f"{'':32} {'min ms':>8} {'p50 ms':>8} {'p99 ms':>8} {'p50 over':>9} {'p99 over':>9} {'p50 ×':>6} {'p99 ×':>6}"
    )
    for name, r in execs.items():
        if name == NEXT_START:
            continue
        print(
            f"{name:32} {r['min_ms']:8.2f} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {r['p50_ms'] - bare['p50_ms']:9.2f} "
            f"{r['p99_ms'] - bare['p99_ms']:9.2f} {r['p50_ms'] / bare['p50_ms']:6.2f} {r['p99_ms'] / bare['p99_ms']:6.2f}"
        )
    nxt = execs[NEXT_START]
    print(
        f"{NEXT_START}: min {nxt['min_ms']:.2f} ms, p50 {nxt['p50_ms']:.2f} ms, "
        f"p99 {nxt['p99_ms']:.2f} ms after its command (waited for before the others are timed)"
    )
    for name in (
        "stayer bwrap",
        "stayer bwrap, cold start",
        "stayer bwrap-persistent",
    ):
        over = execs[name]["p50_ms"] - bare["p50_ms"]
        print(
            f"target: p50 overhead < 5 ms; {name}: {over:.2f} ms ({'met' if over < 5 else 'NOT met'})"
        )
    call = execs["stayer bwrap-persistent"]["p50_ms"]
    print(
        f"target: a tool call under 1 ms from the persistent sandbox; stayer bwrap-persistent: "
        f"p50 {call:.2f} ms ({'met' if call < 1 else 'NOT met'})"
    )
    if images is not None:
        print()
        print(
            f"task image (tests/fixtures/image-task), {args.build_rounds} cold builds each, interleaved"
        )
        for name, r in images["builds"].items():  # type: ignore[union-attr]
            print(f"{name:28} min {r['min_s']:8.2f} s   median {r['median_s']:8.2f} s")
        print(f"exec of `true` in the built image, {args.docker_runs} runs each, interleaved")
        for name, r in images["exec"].items():  # type: ignore[union-attr]
            print(f"{name:28} min {r['min_ms']:8.1f} ms  median {r['median_ms']:8.1f} ms")
        print(f"load average before {images['loadavg_before']}, after {images['loadavg_after']}")
    if not snaps:
        if args.json:
            emit(
                {
                    "exec": execs,
                    "images": images,
                    "runs": args.runs,
                    "command": args.command,
                    **load,
                }
            )
        return
    print()
    print(
        f"snapshots of a {args.mb} MB, {args.files:,}-file workspace "
        f"(median of {args.repeat}; {args.settle:g} s settle before bulk operations)"
    )
    print(f"{'':46} {'min ms':>9} {'median ms':>10} {'n':>3}")
    for name, r in snaps.items():
        print(f"{name:46} {r['min_ms']:9.2f} {r['median_ms']:10.2f} {r['n']:3}")
    med = {k: r["median_ms"] for k, r in snaps.items()}
    both, unchanged = med["snapshot + restore"], med["unchanged snapshot (change watch)"]
    new_process = med["unchanged snapshot (new process)"]
    scan = med["unchanged snapshot (stat scan, no watch)"]
    cp = med["cp -a (full copy baseline)"]
    print(
        f"target: snapshot + restore < 1000 ms; measured {both:.0f} ms ({'met' if both < 1000 else 'NOT met'}; {both / cp:.2f}× one cp -a)"
    )
    print(
        f"target: unchanged snapshot < 1 ms in process; measured {unchanged:.2f} ms "
        f"({'met' if unchanged < 1 else 'NOT met'}; {cp / unchanged:.0f}× faster than cp -a)"
    )
    print(
        f"target: unchanged snapshot < 50 ms in a new process; measured {new_process:.2f} ms "
        f"({'met' if new_process < 50 else 'NOT met'}; {med['new process: start, import, snapshot']:.0f} ms "
        f"for the whole process; {scan:.1f} ms by stat scan without a watch)"
    )
    if args.json:
        emit(
            {
                "exec": execs,
                "snapshot_ms": {k: r["median_ms"] for k, r in snaps.items()},
                "snapshot_samples": snaps,
                "images": images,
                "runs": args.runs,
                "command": args.command,
                "files": args.files,
                "mb": args.mb,
                **load,
            }
        )


if __name__ == "__main__":
    main()
