"""The docs cannot drift: every command they show is parsed or run, every file they name
exists, and each mistake the old README had is checked so it cannot come back."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from monitor.cli import COMMANDS, build_parser
from simulators.modbus_server import parse_args as simulator_args
from tests.cli import run_monitor

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Words a documented command may start with that are not ours; their repo paths are checked.
SYSTEM = {
    "cd", "cp", "install", "tee", "for", "sqlite3", "systemctl", "journalctl", "curl", "docker",
    "mosquitto_passwd", "chown", "chmod", "jq", "python3", "tar", "ssh", "grep", "EOF", "if", "mv", "rm",
    "zcat",
}  # fmt: skip
REPO_DIRS = ("config/", "deploy/", "scripts/", "docs/", "monitor/", "simulators/", "tests/", "bench/")
MONITOR = re.compile(r"^(?:\S*/)?monitor$")
INSTALLED = Path(sys.executable).parent / "monitor"  # the script `pip install` made for monitor.cli:entry


def fenced(path: Path) -> list[tuple[int, str, str]]:
    """(line, info string, text) of each fenced block, indentation removed."""
    out, lines, i = [], path.read_text(encoding="utf-8").split("\n"), 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
        if m:
            j = i + 1
            while not lines[j].strip().startswith("```"):
                j += 1
            body = "\n".join(line[len(m.group(1)) :] for line in lines[i + 1 : j])
            out.append((i + 1, m.group(2), body))
            i = j
        i += 1
    return out


def commands(info: str, text: str) -> list[str]:
    """Command lines of a block: every line of a `sh` block (continuations joined, heredoc
    bodies and comments dropped), or the `$ ` lines of any other block."""
    if info != "sh":
        joined = text.replace("\\\n", " ")  # a `$ ` command continued on the next line
        return [line[2:] for line in joined.split("\n") if line.startswith("$ ")]
    out: list[str] = []
    heredoc: str | None = None
    for line in text.replace("\\\n", " ").split("\n"):
        if heredoc is not None:
            heredoc = None if line.strip() == heredoc else heredoc
            continue
        m = re.search(r"<<-?'?(\w+)'?", line)
        if m:
            heredoc = m.group(1)
        if line.strip():
            out.append(line)
    return out


def documented() -> list[tuple[str, str]]:
    """(where, command) for every command every page shows."""
    return [
        (f"{page.relative_to(ROOT)}:{line}", cmd)
        for page in PAGES
        for line, info, text in fenced(page)
        for cmd in commands(info, text)
    ]


def words(command: str) -> list[str]:
    """The first simple command of a line, `sudo` dropped, usage brackets opened."""
    command = re.sub(r"\[([^\]]*)\]", r"\1", command)
    # `$(printf -- '--config %s ' *.yaml)` stands for one or more of those options.
    command = re.sub(r"\$\(printf -- '(--[a-z-]+) %s ' [^)]*\)", r"\1 station.yaml", command)
    tokens = shlex.split(command, comments=True)
    for i, t in enumerate(tokens):
        if t in ("&&", "|", ";", "||") or t.startswith((">", "<", "2>")):
            tokens = tokens[:i]
            break
    return tokens[1:] if tokens[:1] == ["sudo"] else tokens


def parse_monitor(argv: list[str]) -> argparse.Namespace:
    try:
        return build_parser(load=[argv[0]] if argv and argv[0] in COMMANDS else []).parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"`monitor {' '.join(argv)}` does not parse") from exc


@pytest.mark.parametrize(("where", "command"), documented(), ids=[w for w, _ in documented()])
def test_every_documented_command_is_known_and_its_files_exist(where: str, command: str) -> None:
    argv = words(command)
    assert argv, f"{where}: {command!r}"
    head = argv[0]
    if MONITOR.match(head):
        if argv[1:] != ["--version"]:
            parse_monitor(argv[1:])
    elif head == "make":
        targets = re.findall(r"^([a-z]+):", (ROOT / "Makefile").read_text(), flags=re.M)
        assert argv[1] in targets, f"{where}: no make target {argv[1]}"
    elif head.endswith("python") and argv[1:2] == ["-m"]:
        if argv[2] == "simulators.modbus_server":
            simulator_args(argv[3:])
        else:
            assert (ROOT / argv[2].replace(".", "/")).with_suffix(".py").exists(), f"{where}: {argv[2]}"
    elif head.startswith(REPO_DIRS):
        assert (ROOT / head).exists(), f"{where}: {head} does not exist"
    else:
        assert Path(head).name in SYSTEM or head.endswith("/pip"), f"{where}: unknown command {head!r}"
    for token in argv[1:]:
        if token.startswith(REPO_DIRS) and "*" not in token:
            assert (ROOT / token).exists(), f"{where}: {token} does not exist"


def test_inline_monitor_commands_name_real_commands() -> None:
    """`monitor meters show` in running text: the command and its action exist."""
    for page in PAGES:
        for m in re.finditer(
            r"`monitor ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?", page.read_text(encoding="utf-8")
        ):
            command, action = m.group(1), m.group(2)
            assert command in COMMANDS, f"{page.name}: monitor {command}"
            sub = build_parser(load=[command])._subparsers
            assert sub is not None
            parser = next(a for a in sub._group_actions if isinstance(a, argparse._SubParsersAction))
            actions = [
                a for a in parser.choices[command]._actions if isinstance(a, argparse._SubParsersAction)
            ]
            if action and actions:
                assert action in actions[0].choices, f"{page.name}: monitor {command} {action}"


def test_curl_paths_are_routes_the_daemon_serves() -> None:
    source = "\n".join(p.read_text() for p in (ROOT / "monitor").rglob("*.py"))
    routes = [
        re.sub(r"\{[^}]+\}", "[^/]+", r) for r in re.findall(r'@app\.(?:get|post)\(\s*"([^"]+)"', source)
    ]
    for where, command in documented():
        for url in re.findall(r"https?://127\.0\.0\.1:\d+(/\S*)", command):
            path = url.strip("'\"").split("?")[0]
            assert any(re.fullmatch(r, path) for r in routes), f"{where}: no route serves {path}"


def sandboxed(block: str, tmp: Path) -> str:
    """A docs block rewritten to run here: /etc and /srv under `tmp`, no root, and the
    `monitor` script pip installed into this venv (its entry point, in a real process)."""
    text = block.replace("/opt/station-monitor/bin/monitor", str(INSTALLED))
    for top in ("/etc/", "/srv/", "/var/lib/"):
        text = text.replace(top, f"{tmp}{top}")
    return 'set -e; sudo() { "$@"; }; systemctl() { :; }\n' + text


def block(page: str, containing: str) -> str:
    found = [text for _, info, text in fenced(ROOT / page) if info == "sh" and containing in text]
    assert len(found) == 1, (page, containing)
    return found[0]


@pytest.mark.integration
def test_the_install_steps_give_a_config_that_checks_clean(tmp_path: Path) -> None:
    """The old README's example, copied to /etc, failed twice: its profile path resolved
    beside the copy, and three secrets were unset. The documented steps, run as written."""
    (tmp_path / "etc" / "systemd" / "system").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.endswith(("PASSWORD", "TOKEN"))}
    script = sandboxed(block("docs/deployment.md", "secrets.env"), tmp_path)
    script += "\n" + sandboxed(block("docs/operator-guide.md", "modbus plan"), tmp_path).replace(
        "modbus read",
        "modbus --help",  # no device behind the example's address here
    )
    result = subprocess.run(
        ["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "§139-15 C(3)" in result.stdout and "outfall-plc" in result.stdout


def test_every_secret_the_example_names_is_in_the_documented_secrets_file() -> None:
    keys = [
        line.split(" #")[0] for line in (ROOT / "config" / "station.example.yaml").read_text().splitlines()
    ]
    names = {
        n for line in keys if not line.lstrip().startswith("#") for n in re.findall(r"\$\{(\w+)\}", line)
    }
    install = block("docs/deployment.md", "secrets.env")
    example_env = (ROOT / "config" / "example.env").read_text()
    assert names and all(f"\n{n}=" in install and f"\n{n}=" in example_env for n in names)


def test_the_backup_covers_every_state_file_the_code_writes(tmp_path: Path) -> None:
    """The old backup command copied `baselines.ckpt`, which no release ever wrote."""
    source = "\n".join(p.read_text() for p in (ROOT / "monitor").rglob("*.py"))
    files = set(re.findall(r'"([a-z_-]+\.(?:sqlite|npz))"', source))
    assert {"journal.sqlite", "ledger.sqlite", "engine-checkpoint.npz"} <= files
    guide = (ROOT / "docs" / "operator-guide.md").read_text()
    table = guide.split("## Upgrade and back up", 1)[1]
    assert all(f"`{name}`" in table for name in files), files
    state = tmp_path / "var" / "lib" / "station-monitor"
    state.mkdir(parents=True)
    (tmp_path / "srv" / "backup").mkdir(parents=True)
    for name in files:
        if name.endswith(".sqlite"):
            db = sqlite3.connect(state / name)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE t (x)")
            db.execute("INSERT INTO t VALUES (1)")
            db.commit()
            db.close()
        else:
            (state / name).write_bytes(b"checkpoint")
    (state / "incidents" / "inc-1").mkdir(parents=True)  # frozen evidence, a directory per incident
    (state / "incidents" / "inc-1" / "evidence.csv").write_text("time,sensor,value\n")
    files.add("incidents")
    script = sandboxed(block("docs/operator-guide.md", ".backup"), tmp_path)
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert {p.name for p in (tmp_path / "srv" / "backup").iterdir()} == files


def paragraphs(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return [
        " ".join(p.split()) for p in text.split("\n\n") if len(p) > 160 and not p.lstrip().startswith("|")
    ]


def test_no_paragraph_is_pasted_twice() -> None:
    """The old README had the billing export's text a second time inside "Alarm report".
    (The README's opening paragraph is the docs home page's too, on purpose.)"""
    for pages in ([ROOT / "README.md"], PAGES[1:]):
        counts = Counter(p for page in pages for p in paragraphs(page))
        assert [p[:80] for p, n in counts.items() if n > 1] == []


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_no_heading_twice_on_a_page(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    headings = Counter(re.findall(r"^#+ (.+)$", text, flags=re.M))
    assert [h for h, n in headings.items() if n > 1] == []


def test_readme_is_a_short_front_door() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    first_screen = "\n".join(text.splitlines()[:40])
    assert "make demo" in first_screen and "make test" in first_screen
    assert "## A first real device in ten minutes" in text and "## Where to read next" in text


def test_every_page_is_in_the_site_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    assert [p.name for p in PAGES[1:] if p.name not in nav] == []


def test_the_example_config_comments_describe_real_keys() -> None:
    from monitor.commands.config_reference import config_schema, example_comments, reference_markdown

    comments = example_comments((ROOT / "config" / "station.example.yaml").read_text())
    reference = reference_markdown(config_schema(), comments)
    for path in comments:
        parent, _, key = path.rpartition(".")
        section = f"## `{parent}`" if parent else "## Top level"
        assert section in reference and f"| `{key}` |" in reference.split(section, 1)[1], path


@pytest.mark.integration
def test_mkdocs_builds_strict(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ,
                                                                    "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    reference = (tmp_path / "site" / "configuration-reference" / "index.html").read_text()
    assert all(key in reference for key in ("max_sample_gap", "max_register_gap", "max_reading_gap"))
    commands = (tmp_path / "site" / "commands" / "index.html").read_text()
    assert all(f"monitor {name}" in commands for name in COMMANDS) and "--env-file" in commands


# Paths the reader creates (git-ignored secrets, their own station), or templates.
READER_MADE = {"deploy/container/.env", "deploy/container/station/"}


def test_inline_commands_and_paths_in_the_text_are_real() -> None:
    """`python -m bench.daemon ...` or `deploy/...` in running text, not only in blocks."""
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for span in re.findall(r"`([^`\n]+)`", text):
            argv = span.split()
            if argv[0].endswith("python") and argv[1:2] == ["-m"] and argv[2] != "pytest" and "<" not in span:
                module = ROOT / argv[2].replace(".", "/")
                assert module.with_suffix(".py").exists() or module.is_dir(), f"{page.name}: {span}"
            assert not re.match(r"^python \S+\.py", span), f"{page.name}: run `{span}` as a module (-m)"
            for token in argv:
                if token.startswith(REPO_DIRS) and "<" not in token and token not in READER_MADE:
                    assert (ROOT / token.rstrip(".,:;")).exists(), f"{page.name}: {token} does not exist"


def offline(argv: list[str]) -> bool:
    """A documented `monitor` command that needs no device, server or state: run it."""
    if argv[1:] == ["--version"] or argv[1:2] in (["config-schema"], ["profile"]):
        return True
    if argv[1:3] == ["billing", "rate"]:
        return True
    paths = [a for a in argv[2:] if a.endswith(".yaml")]
    config_only = argv[1:2] == ["check-config"] or argv[1:3] == ["modbus", "plan"]
    return config_only and bool(paths) and all((ROOT / p).exists() for p in paths)


def test_documented_offline_commands_run_and_print_what_the_docs_say() -> None:
    ran = 0
    for where, command in documented():
        argv = words(command)
        if not (argv and MONITOR.match(argv[0]) and offline(argv)):
            continue
        if any(a.startswith("/") or a == "station.yaml" for a in argv[1:]):
            continue  # a reader's own file: the install and first-device tests run those
        result = run_monitor(*argv[1:], cwd=ROOT)
        assert result.returncode == 0, (where, command, result.stderr)
        said = command.partition(" # ")[2].strip()
        if (said and ":" in said) or said.startswith("station-monitor "):
            assert said in result.stdout, (where, said, result.stdout)
        ran += 1
    assert ran >= 4


def test_a_documented_transcript_is_what_the_command_prints() -> None:
    """A block that shows `$ monitor ...` and its output: the output is the real one."""
    checked = 0
    for page in PAGES:
        for line, info, text in fenced(page):
            if info or not text.startswith("$ monitor "):
                continue
            command, _, shown = text.replace("\\\n", " ").partition("\n")
            argv = words(command[2:])
            if not offline(argv):
                continue  # a transcript of the reader's own station: its page's own test runs it
            result = run_monitor(*argv[1:], cwd=ROOT)
            assert result.stdout.rstrip("\n") == shown.rstrip("\n"), f"{page.name}:{line}"
            checked += 1
    assert checked >= 1
