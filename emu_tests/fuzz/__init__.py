"""Fuzzing the engine with hostile model files and command lines.

model.py   the engine file (version 4) as the fuzzer sees it (fields, sections, the program's
           weights, validity rules, writing a mutated copy, sparse where the weights are a hole)
mutate.py  seeded mutators -> Cases (edits on a valid file + argv + what must happen)
mutate4.py the same for version 4 files: hostile programs (opcodes, operands, slot widths,
           op counts ...), judged by the Python reader in emu_tests/models/test_fuzz4.py (and
           decided by it for the engine in suite.py)
shapes.py  valid models of odd shapes and a sparse Gemma-2B-shaped file
suite.py   the models and the case list test_fuzz runs (seed, count)
runner.py  runs Cases on the real binary in a small process pool and judges each run
`python -m emu_tests.fuzz --help` runs a campaign or replays one case by its number.
"""
