"""Print one of the README's two set-up commands, so CI and the fresh-install check run exactly what it says.

python scripts/readme_command.py main   # line 1 of the README's first code block
python scripts/readme_command.py test   # line 2
"""

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_commands() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", README.read_text(), re.DOTALL)
    if block is None:
        raise SystemExit("README.md has no ```bash block with the set-up commands")
    return [re.sub(r"\s+#.*$", "", line).strip() for line in block.group(1).splitlines() if line.strip()]


if __name__ == "__main__":
    which = {"main": 0, "test": 1}
    if len(sys.argv) != 2 or sys.argv[1] not in which:
        raise SystemExit("usage: python scripts/readme_command.py main|test")
    print(readme_commands()[which[sys.argv[1]]])
