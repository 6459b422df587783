"""Stand-ins for the two GPU-only packages OpenRLHF imports when its experience maker loads.

``openrlhf.trainer.ppo_utils.experience_maker`` imports ``openrlhf.models`` (whose ring
attention imports flash-attn's CUDA kernels) and ``openrlhf.trainer.ray`` (whose vLLM engine
imports vLLM). Neither installs here: flash-attn builds against a CUDA toolkit, and vLLM's
wheel pins a CUDA build of torch. Everything else OpenRLHF imports is the real package
(deepspeed included, which runs on the CPU). Each stand-in provides only the names imported at
load time, and every one of them raises when used: the advantage code never touches them, so a
test that passes shows that OpenRLHF's own functions ran without them. A real flash-attn or
vLLM, where installed, wins.

Use :func:`importing` around the imports of OpenRLHF's modules: the stand-ins leave
``sys.modules`` afterwards, so other code in the same process (TRL asks whether vLLM is
installed) never mistakes them for the real packages. OpenRLHF's modules keep the names
they imported.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager

#: module -> the names OpenRLHF 0.11.2 imports from it at load time.
NAMES = {
    "flash_attn": (),
    "flash_attn.bert_padding": ("index_first_axis", "pad_input", "rearrange", "unpad_input"),
    "flash_attn.utils": (),
    "flash_attn.utils.distributed": ("all_gather",),
    "vllm": (),
    "vllm.inputs": ("TokensPrompt",),
    "vllm.utils": ("random_uuid",),
}


class GPUOnly(RuntimeError):
    """A stand-in was used: the code under test reached GPU-only code."""


def _unavailable(module: str, name: str):
    def stand_in(*args, **kwargs):
        raise GPUOnly(f"{module}.{name} is a test stand-in (tests/openrlhf_standins.py): GPU-only code was reached")

    stand_in.__name__ = name
    return stand_in


def install() -> list[str]:
    """Put the stand-ins in ``sys.modules`` for each GPU-only package that is not installed; return their names."""
    placed = []
    for top in ("flash_attn", "vllm"):
        if top in sys.modules or importlib.util.find_spec(top) is not None:
            continue
        for module, names in NAMES.items():
            if module.split(".")[0] != top:
                continue
            stand_in = types.ModuleType(module, "test stand-in: GPU-only package not installed here")
            stand_in.__path__ = []  # a package, so that its submodules import
            stand_in.__spec__ = importlib.machinery.ModuleSpec(module, None, is_package=True)  # find_spec reads it
            for name in names:
                setattr(stand_in, name, _unavailable(module, name))
            if module == "vllm":
                stand_in.__version__ = "0.0.0+stand-in"
            sys.modules[module] = stand_in
            placed.append(module)
    return placed


@contextmanager
def importing() -> Iterator[list[str]]:
    """The stand-ins in ``sys.modules`` while OpenRLHF's modules are imported, and gone afterwards.

    Use::

        with importing():
            from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
    """
    placed = install()
    try:
        yield placed
    finally:
        for module in placed:
            sys.modules.pop(module, None)
