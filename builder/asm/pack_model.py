"""The packer's model (builder/asm/pack.py): committed data, written by `python -m builder pack
--search`, read by every build. Each context model: a mask over the lanes of the state word
(bit 0 the byte's x86 field, bit 1 its opcode, bit k >= 2 the byte k - 1 back) and its weight
as a shift."""
from .pack import Model

MODEL = Model(masks=(3, 1, 12, 212, 20, 8, 163, 37, 19, 5, 57),
              shifts=(1, 0, 3, 6, 2, 0, 5, 3, 2, 1, 3))
