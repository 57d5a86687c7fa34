"""Where the tests' files are, for modules at any depth under tests/ (unit/, system/<lane>/)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent  # jobs/ and fixtures/ are here
REPO = TESTS.parent
