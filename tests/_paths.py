"""Where the tests find the checkout and their data, wherever a test module lies under tests/."""

from __future__ import annotations

from pathlib import Path

#: the checkout's root (sigprop/, docs/, tests/ below it)
ROOT = Path(__file__).resolve().parents[1]
#: the tests' data files (tests/data/: Hugging Face configs, plugin and factory modules, traces)
DATA = ROOT / "tests" / "data"
