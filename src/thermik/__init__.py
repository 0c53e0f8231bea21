"""thermik: RL post-training for LLM agents."""

import os as _os

from thermik.cpu.isa import torch_environment as _torch_environment

__version__ = "0.1.0"

# THERMIK_CPU_ISA simulates a smaller CPU (cpu/isa.py): PyTorch's and oneDNN's dispatch follow it only if their
# variables are set before torch is first imported, which is after this package is.
for _name, _value in _torch_environment().items():
    _os.environ.setdefault(_name, _value)
