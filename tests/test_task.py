from pathlib import Path

import pytest

from stayer.errors import ConfigError
from stayer.eval.task import load_task
from stayer.eval.verify import read_reward

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def make_task(
    tmp_path: Path, toml: str | None = 'version = "1.0"\n', instruction: str | None = "Do it."
) -> Path:
    root = tmp_path / "t"
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    if instruction is not None:
        (root / "instruction.md").write_text(instruction)
    if toml is not None:
        (root / "task.toml").write_text(toml)
    return root


@pytest.mark.parametrize("name", ["hello-file", "fix-median", "sales-report"])
def test_examples_load(name):
    task = load_task(EXAMPLES / name)
    assert task.instruction and task.solution


def test_missing_instruction_names_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"instruction\.md: missing"):
        load_task(make_task(tmp_path, instruction=None))


def test_malformed_toml_names_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"task\.toml: malformed TOML"):
        load_task(make_task(tmp_path, toml="[agent\ntimeout_sec = 1"))


@pytest.mark.parametrize(
    ("toml", "field"),
    [
        ("[agent]\ntimeout_sec = -5\n", r"agent\.timeout_sec"),
        ('[environment]\nallow_internet = "yes"\n', "allow_internet"),
        ('agent = "fast"\n', r"\[agent\] must be a table"),
    ],
)
def test_bad_field_names_the_field(tmp_path, toml, field):
    with pytest.raises(ConfigError, match=field):
        load_task(make_task(tmp_path, toml=toml))


def test_materialise_skips_image_files_and_keeps_tests_out(tmp_path):
    root = make_task(tmp_path)
    (root / "environment" / "src").mkdir(parents=True)
    (root / "environment" / "Dockerfile").write_text("FROM x")
    (root / "environment" / "src" / "a.py").write_text("x = 1")
    ws = tmp_path / "ws"
    load_task(root).materialise(ws)
    assert (ws / "src" / "a.py").read_text() == "x = 1"
    assert not (ws / "Dockerfile").exists() and not (ws / "tests").exists()


def test_read_reward_txt_and_json(tmp_path):
    (tmp_path / "reward.txt").write_text("1\n")
    assert read_reward(tmp_path)[0] == 1.0
    (tmp_path / "reward.txt").unlink()
    (tmp_path / "reward.json").write_text('{"correctness": 1, "performance": 0}')
    reward, rewards, _ = read_reward(tmp_path)
    assert reward == 0.5 and rewards == {"correctness": 1.0, "performance": 0.0}
    (tmp_path / "reward.json").write_text("garbage")
    assert read_reward(tmp_path)[0] is None


def test_materialise_does_not_follow_links_out_of_environment(tmp_path):
    root = make_task(tmp_path)
    (root / "environment").mkdir()
    (root / "environment" / "tests").symlink_to("../tests")
    ws = tmp_path / "ws"
    load_task(root).materialise(ws)
    assert (ws / "tests").is_symlink() and not (ws / "tests" / "test.sh").exists()
