"""The packer's model (builder/asm/pack.py): committed data, written by `python -m builder pack
--search`, read by every build. Each context model: a mask over the last six bytes (bit k: the
byte k + 1 back) and its weight as a shift."""
from .pack import Model

MODEL = Model(masks=(3, 1, 12, 227, 20, 60, 212, 40, 5, 19, 11),
              shifts=(0, 0, 3, 5, 1, 5, 6, 1, 0, 2, 1))
