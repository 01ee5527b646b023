""".dockerignore: Docker's pattern rules (the examples of its documentation), what a
build context sends, and the content hashes that leave out what it does not send."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stayer.environments import dockerignore
from stayer.environments.dockerignore import parse, walk
from stayer.errors import ConfigError
from stayer.workspace.hostfs import tree_digest


def excluded(text: str, *paths: str) -> list[bool]:
    rules = parse(text)
    return [rules.excluded(p) for p in paths]


def test_the_documented_examples() -> None:
    rules = "# comment\n*/temp*\n*/*/temp*\ntemp?\n"
    assert (
        excluded(
            rules,
            "somedir/temporary.txt",
            "somedir/temp",
            "somedir/subdir/temporary.txt",
            "tempa",
            "tempb",
        )
        == [True] * 5
    )
    assert (
        excluded(rules, "temp", "temporary.txt", "tempab", "# comment", "a/b/c/temp") == [False] * 5
    )


def test_a_double_star_matches_any_number_of_directories() -> None:
    assert excluded("**/*.go", "a.go", "x/b.go", "x/y/z/c.go", "a.gox", "go") == [
        True,
        True,
        True,
        False,
        False,
    ]
    assert excluded("a/**/b", "a/b", "a/x/b", "a/x/y/b", "b", "xa/b") == [
        True,
        True,
        True,
        False,
        False,
    ]
    assert excluded("build/**", "build/x", "build/x/y", "buildx") == [True, True, False]


def test_exceptions_and_the_last_matching_line_decides() -> None:
    assert excluded("*.md\n!README.md\n", "README.md", "CHANGES.md", "docs/a.md") == [
        False,
        True,
        False,  # * stops at /
    ]
    first = "*.md\n!README*.md\nREADME-secret.md\n"
    assert excluded(first, "README.md", "README-secret.md", "other.md") == [False, True, True]
    last = "*.md\nREADME-secret.md\n!README*.md\n"
    assert excluded(last, "README.md", "README-secret.md", "other.md") == [False, False, True]
    # Everything but what is named: * first, then exceptions.
    assert excluded("*\n!src\n", "src", "src/main.py", "setup.py", "docs/x") == [
        False,
        False,
        True,
        True,
    ]


def test_a_pattern_matches_a_path_or_any_directory_above_it() -> None:
    assert excluded("node_modules", "node_modules", "node_modules/a/b.js", "x/node_modules") == [
        True,
        True,
        False,
    ]
    # Leading / and ./ mean the context's root; a trailing / and .. elements are cleaned.
    for pattern in ("foo/bar", "/foo/bar", "./foo/bar", "foo/bar/", "foo/x/../bar", " foo/bar "):
        assert excluded(pattern, "foo/bar", "foo/bar/baz", "bar", "x/foo/bar") == [
            True,
            True,
            False,
            False,
        ], pattern


def test_go_match_syntax() -> None:
    assert excluded("[a-c]x", "ax", "cx", "dx", "/x") == [True, True, False, False]
    assert excluded("[^a]x", "ax", "bx") == [False, True]
    assert excluded("[!a]x", "!x", "ax", "bx") == [True, True, False]  # ! is a member, not ^
    assert excluded("a?c", "abc", "a/c") == [True, False]
    assert excluded("a*c", "abbc", "a/c") == [True, False]
    assert excluded("\\*x", "*x", "ax") == [True, False]
    assert excluded("a.b+c(d)", "a.b+c(d)", "axb+c(d)") == [True, False]


def test_comments_blank_lines_and_bad_patterns() -> None:
    assert parse("\n\n# only comments\n   \n").patterns == ()
    assert excluded("  # not a comment unless in column 1", "# not a comment unless in column 1")
    assert parse("\ufeffa\n").excluded("a")  # a byte-order mark is not part of the pattern
    with pytest.raises(ConfigError, match=r"\.dockerignore:2: illegal exclusion"):
        parse("a\n!\n")
    with pytest.raises(ConfigError, match=r"\.dockerignore:1: .*unterminated"):
        parse("[ab\n")
    with pytest.raises(ConfigError, match=":1: .*backwards"):
        parse("[z-a]\n")


def _context(tmp_path: Path, ignore: str | None) -> Path:
    ctx = tmp_path / "ctx"
    (ctx / "src" / "deep").mkdir(parents=True)
    (ctx / "logs").mkdir()
    (ctx / "Dockerfile").write_text("FROM debian:bookworm\nCOPY . /app\n")
    (ctx / "src" / "main.py").write_text("print(1)\n")
    (ctx / "src" / "deep" / "notes.md").write_text("notes\n")
    (ctx / "logs" / "keep.log").write_text("kept\n")
    (ctx / "logs" / "noise.log").write_text("noise\n")
    (ctx / "secret.txt").write_text("s3cret\n")
    if ignore is not None:
        (ctx / ".dockerignore").write_text(ignore)
    return ctx


def test_the_context_sends_what_the_rules_keep(tmp_path: Path) -> None:
    ctx = _context(tmp_path, "secret.txt\nlogs\n!logs/keep.log\n**/*.md\nDockerfile\n")
    sent = walk(ctx)
    assert not sent.complete
    assert sorted(sent.entries) == [
        ".dockerignore",
        "logs",  # re-included below: the directory is sent for it
        "logs/keep.log",
        "src",
        "src/deep",
        "src/main.py",
    ]
    dest = tmp_path / "staged"
    dockerignore.stage(sent, dest)
    found = sorted(str(p.relative_to(dest)) for p in dest.rglob("*"))
    assert found == sorted(sent.entries)
    assert (dest / "logs" / "keep.log").read_text() == "kept\n"


def test_without_a_dockerignore_the_hashes_are_what_they_were(tmp_path: Path) -> None:
    ctx = _context(tmp_path, None)
    sent = walk(ctx)
    assert sent.complete
    assert sent.image_digest() == tree_digest(ctx)  # cached images stay valid
    assert sent.tree_digest("src") == tree_digest(ctx / "src")


def test_an_ignored_file_does_not_change_the_image_hash(tmp_path: Path) -> None:
    ctx = _context(tmp_path, "secret.txt\nDockerfile\n")
    before = walk(ctx).image_digest()
    (ctx / "secret.txt").write_text("another secret\n")
    assert walk(ctx).image_digest() == before
    (ctx / "src" / "main.py").write_text("print(2)\n")
    assert walk(ctx).image_digest() != before
    # The builder reads the Dockerfile even where the rules leave it out of the context.
    changed = walk(ctx).image_digest()
    (ctx / "Dockerfile").write_text("FROM debian:trixie\n")
    assert walk(ctx).image_digest() != changed


def test_the_walk_never_follows_a_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "host-secret").write_text("x\n")
    ctx = _context(tmp_path, "!logs\n")
    os.symlink(outside, ctx / "link")
    (ctx / ".dockerignore").unlink()
    os.symlink(outside / "host-secret", ctx / ".dockerignore")
    with pytest.raises(ConfigError, match="link is not followed"):
        walk(ctx)
    (ctx / ".dockerignore").unlink()
    sent = walk(ctx)
    assert sent.entries["link"] == dockerignore.LINK
    assert not [r for r in sent.entries if r.startswith("link/")]
    assert sent.glob("link/*") == []
