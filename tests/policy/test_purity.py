"""kvres.policy must stay pure: importing it loads neither Ray nor an engine."""

from __future__ import annotations

import subprocess
import sys


def test_policy_imports_no_ray_and_no_engine() -> None:
    code = (
        "import sys, pkgutil, importlib, kvres.policy\n"
        "for m in pkgutil.iter_modules(kvres.policy.__path__):\n"
        "    importlib.import_module('kvres.policy.' + m.name)\n"
        "bad = [m for m in ('ray', 'llama_cpp', 'openvino', 'openvino_genai', 'torch') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"kvres.policy pulled in {out.stdout.strip()}"
