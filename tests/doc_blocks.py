"""The fenced code blocks of README.md and docs/*.md, as the doc tests read them."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(?P<language>\S*)\n(?P<text>.*?)^```[ \t]*$", re.S | re.M)
NOT_RUN = re.compile(r"<!--\s*not run:\s*(?P<reason>\S.*?)\s*-->\s*\Z")


@dataclass(frozen=True)
class Block:
    page: Path
    language: str
    number: int  # among the page's blocks of this language, from 1
    text: str
    not_run: str | None = None  # the reason of a <!-- not run: ... --> comment just before the block

    @property
    def name(self) -> str:
        return f"{self.page.name}[block {self.number}]"


def blocks(page: Path, language: str | None = None, section: str | None = None) -> list[Block]:
    """The page's fenced blocks (of one language; under one ``## `` heading), in order."""
    text = page.read_text()
    start, end = 0, len(text)
    if section is not None:
        start = text.index(f"\n## {section}\n")
        end = text.find("\n## ", start + 1)
        end = len(text) if end < 0 else end
    found, counts = [], {}
    for match in FENCE.finditer(text):
        lang = match["language"]
        counts[lang] = counts.get(lang, 0) + 1
        if language in (None, lang) and start <= match.start() < end:
            marker = NOT_RUN.search(text[: match.start()].rstrip())
            found.append(Block(page, lang, counts[lang], match["text"], marker and marker["reason"]))
    return found


def advmon_commands(block: Block) -> list[list[str]]:
    """Every ``advmon ...`` command of a shell block, as the arguments after ``advmon``.

    Backslash continuations are joined and trailing ``# comments`` dropped; a line may hold
    several commands joined by ``&&``, ``||``, ``;`` or ``|``.
    """
    commands = []
    for line in re.sub(r"\\\n", " ", block.text).splitlines():
        command: list[str] = []
        for word in [*shlex.split(line, comments=True), ";"]:
            if word in {"&&", "||", ";", "|"}:
                if command[:1] == ["advmon"]:
                    commands.append(command[1:])
                command = []
            else:
                command.append(word)
    return commands
