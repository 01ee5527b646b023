"""What a distribution of stayer carries besides code: the licence its metadata names."""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# sha256 of https://www.apache.org/licenses/LICENSE-2.0.txt as published.
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def test_the_license_file_is_the_apache_2_0_text_and_packaged():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    # PEP 639: the wheel's and sdist's metadata list these files and carry them.
    assert project.get("license-files") == ["LICENSE"]
    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_0_SHA256
    assert b"Apache License\n                           Version 2.0, January 2004" in text
