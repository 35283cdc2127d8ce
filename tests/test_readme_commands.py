"""Every command line the README shows in its shell blocks runs, as the README shows it.

Each ``sh`` block of README.md runs as one bash script, and so do the ``$ `` lines of each
``console`` block (their output lines left out): ``set -euo pipefail``, so the first command
that fails fails the test, named. It runs as root in a private mount namespace (the node
commands mount tmpfs), in a temporary directory -- or in the checkout for a block of ``make``
commands, which are the checkout's. ``kubevol`` is found on ``PATH`` as an installed command
whose sibling scripts are not on ``PATH`` (a wheel's virtualenv linked into ``/usr/local/bin``,
or ``sudo``'s reset ``PATH``). A command that cannot run here is listed below with its
reason, and a listed command the README no longer shows fails the test too, so the list
stays honest.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from pathlib import Path

import attrs
import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
VENV_BIN = REPO / ".venv" / "bin"
#: What a block may take, all of its commands together.
BLOCK_TIMEOUT = 60

#: Commands that do not run here (a pattern the whole command matches), and why.
NOT_RUN = {
    r"make test": "runs this very test suite (minutes, and recursively); .ci/run runs it",
    r"make wheel": "rebuilds dist/ and build/ of the shared checkout (minutes); "
    "scripts/check-package.sh builds the wheel and installs it into fresh virtualenvs",
    r"pip install dist/kubevol-\*\.whl": "would replace the kubevol running this test; "
    "scripts/check-package.sh installs the wheel on Python 3.11 and 3.13",
    r"pip install -e \.": "would reinstall the virtualenv running this test; `make test` and "
    "`make demo` install the checkout this way",
    r"sudo kubevol driver serve sharedfs .*": "serves a network filesystem of your own "
    "(the README's server names are examples) until stopped; the sharedfs driver's tests run "
    "it against a real GlusterFS",
}

#: Commands that run changed, and why.
RUN_CHANGED = {
    # The virtualenv exists (it runs this test); make would rebuild it if pyproject.toml is
    # newer than its stamp, changing the environment under the other tests.
    "make demo": "make -o .venv/.installed demo",
}

_HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")


def _without_comment(line: str) -> str:
    return re.sub(r"(^|\s+)#.*$", "", line).strip()


@attrs.frozen
class Command:
    """One command of a block: its text (continuations joined, comment left out) and the
    script lines it is made of (its here-document included)."""

    text: str
    lines: tuple[str, ...]


@attrs.frozen
class Block:
    """One shell block: where it starts in the README, its text, and whether it is a
    ``console`` transcript (commands after ``$ ``, the rest output)."""

    line: int
    text: str
    console: bool = False

    @property
    def units(self) -> list[Command]:
        """Its commands in order (comment-only lines are commands with no text)."""
        found: list[Command] = []
        lines = iter(self.text.splitlines())
        for first in lines:
            if self.console and not first.startswith("$ "):
                continue  # output
            raw = [first[2:] if self.console else first]
            while raw[-1].rstrip().endswith("\\"):
                raw.append(next(lines, ""))
            text = _without_comment(" ".join(r.strip().removesuffix("\\").strip() for r in raw))
            heredoc = _HEREDOC.search(text)
            if heredoc:
                for body in lines:
                    raw.append(body)
                    if body.strip() == heredoc.group(2):
                        break
            found.append(Command(text=text, lines=tuple(raw)))
        return found

    @property
    def commands(self) -> list[str]:
        """The text of its commands."""
        return [u.text for u in self.units if u.text]


def shell_blocks(text: str) -> list[Block]:
    """The fenced ``sh``/``bash``/``shell``/``console`` blocks of a Markdown text."""
    blocks = []
    for match in re.finditer(r"^```(sh|bash|shell|console)\n(.*?)^```", text, re.M | re.S):
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(Block(line=line, text=match.group(2), console=match.group(1) == "console"))
    return blocks


BLOCKS = shell_blocks(README.read_text())


def not_run(command: str) -> str | None:
    """Why ``command`` does not run here, or None."""
    for pattern, reason in NOT_RUN.items():
        if re.fullmatch(pattern, command):
            return reason
    return None


def script_of(block: Block) -> str:
    """The block as the script that runs: commands not run become comments naming their
    reason, commands run changed are changed, and a failing command names itself on
    stderr."""
    out = [
        "set -euo pipefail",
        "trap 'echo \"README command failed (exit $?): $BASH_COMMAND\" >&2' ERR",
    ]
    for unit in block.units:
        reason = not_run(unit.text)
        if reason is not None:
            out.append(f"# not run here: {reason}")
        elif unit.text in RUN_CHANGED:
            out.append(RUN_CHANGED[unit.text])
        else:
            out.extend(unit.lines)
    return "\n".join(out) + "\n"


def test_the_readme_has_shell_blocks_and_every_listed_line_is_in_it() -> None:
    """The README shows commands, and every command this test leaves out or changes is one
    of them (a stale entry fails, so a command cannot drop out of the test unnoticed)."""
    shown = [c for b in BLOCKS for c in b.commands]
    assert len(BLOCKS) >= 3 and len(shown) >= 10
    for pattern in NOT_RUN:
        assert any(re.fullmatch(pattern, c) for c in shown), f"stale: {pattern}"
    assert not set(RUN_CHANGED) - set(shown)


def test_commands_are_parsed_as_the_shell_reads_them() -> None:
    """Continuations join, comments and here-document bodies are no commands."""
    block = Block(0, "a  # one\nb \\\n  c\ncat > f <<'EOF'\nnot: a command\nEOF\nd\n")
    assert block.commands == ["a", "b c", "cat > f <<'EOF'", "d"]
    console = Block(0, "$ x \\\n    --y\noutput\n$ z\n", console=True)
    assert console.commands == ["x --y", "z"]
    assert script_of(console).splitlines()[2:] == ["x \\", "    --y", "z"]
    assert not_run("sudo kubevol driver serve sharedfs --source a:/b") is not None


def run_block(block: Block, tmp_path: Path) -> tuple[int, str, str]:
    """Run ``block`` as the module docstring says: (exit status, stdout, stderr)."""
    if os.geteuid() != 0:
        pytest.fail("the README's node commands mount filesystems: run the tests as root")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubevol").symlink_to(VENV_BIN / "kubevol")
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "block.sh"
    script.write_text(script_of(block))
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KUBEVOL_", "CSI_", "X_CSI_", "VIRTUAL_ENV"))
    }
    env["PATH"] = f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    env["TMPDIR"] = str(tmp_path)
    in_checkout = any(c.startswith("make ") for c in block.commands)
    proc = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "bash", str(script)],
        cwd=REPO if in_checkout else work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"README.md:{block.line}: still running after {BLOCK_TIMEOUT} s\n{err}")
    finally:
        # What the block left running in the background (its own session only).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, out, err


@pytest.mark.root
@pytest.mark.parametrize("block", BLOCKS, ids=[f"README.md:{b.line}" for b in BLOCKS])
def test_readme_block_runs(block: Block, tmp_path: Path) -> None:
    """The block's commands all succeed (see the module docstring for where and how)."""
    code, out, err = run_block(block, tmp_path)
    assert code == 0, f"README.md:{block.line}:\n{err[-3000:]}\n{out[-2000:]}"


@pytest.mark.root
def test_a_command_that_stops_working_fails_its_block(tmp_path: Path) -> None:
    """A failing command stops its block, which fails naming the command; a line listed as
    not run does not run."""
    block = Block(0, "pip install -e .\nkubevol csi snapshot-metadata allocated s\necho after\n")
    code, out, err = run_block(block, tmp_path)
    assert code == 64 and "after" not in out
    assert "README command failed (exit 64): kubevol csi snapshot-metadata allocated s" in err
