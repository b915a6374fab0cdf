"""The packer's model (builder/asm/pack.py): committed data, written by `python -m builder pack
--search`, read by every build. Each context model: a mask over the last six bytes (bit k: the
byte k + 1 back) and its weight as a shift."""
from .pack import Model

MODEL = Model(masks=(1, 2, 7, 4, 3, 0, 9, 26, 57, 6, 5),
              shifts=(2, 1, 5, 0, 4, 0, 3, 4, 7, 2, 3))
