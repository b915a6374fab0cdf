"""Engine model files for tests: the fixtures converted once per output directory.

    from modelfiles import fixture_path, convert_fixture
    path = convert_fixture("tiny_mqa", "hf", tmp_path_factory.getbasetemp())

`convert_fixture(name, source, out_dir, version=None, wtype="f16")` converts
emu_tests/fixtures/<name> (source "hf": the Hugging Face directory; "gguf": its model-f16.gguf)
to out_dir/<name>-<source>[-<wtype>][-v<version>].bin (-<wtype> unless f16) with
builder.models.convert (version: the model file version, default convert's: 4; wtype: its
matrices' type, "f16" or "q8_0" as `convert --type q8_0` makes them) and caches the result for
the session; builder.models.modelfile4.open_model opens a file of any version. Prefer "hf": its
tokenizer tables are the sentencepiece ones (the fixtures' GGUFs mark user-defined pieces as normal; the weights
are identical either way). MODELS are the Gemma 1 fixtures, TWINS every fixture with both
sources (Gemma 1, 2, 3), ORACLES every (name, source) with a recorded transformers oracle
(tiny_g2q has no GGUF twin: GGUF cannot say its query_pre_attn_scalar); GEMMA4 the Gemma 4
fixtures (both sources). The pytest fixture `model_file` (a factory) does the same into the
session's temporary directory: `model_file("tiny_wide")`. `random_source(seed)` is a
write_model tensor source of seeded standard normal values (each tensor's from its name).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from builder.models.convert import convert

FIXTURES = Path(__file__).parent / "fixtures"
MODELS = ("tiny_mqa", "tiny_wide")
TWINS = MODELS + ("tiny_g2", "tiny_g3")
ORACLES = [(n, s) for n in TWINS for s in ("hf", "gguf")] + [("tiny_g2q", "hf")]
GEMMA4 = ("tiny_g4", "tiny_g4k", "tiny_g4moe")


def random_source(seed: int):
    def source(spec):
        rng = np.random.default_rng([seed, sum(spec.name.encode())])
        yield rng.standard_normal(spec.shape, dtype=np.float32)
    return source


_converted: dict[tuple[str, str, Path, int | None, str], Path] = {}


def fixture_path(name: str) -> Path:
    """emu_tests/fixtures/<name> (a directory or file), which must exist."""
    path = FIXTURES / name
    if not path.exists():
        raise FileNotFoundError(f"no fixture {name} in {FIXTURES}")
    return path


def convert_fixture(name: str, source: str, out_dir: Path, version: int | None = None,
                    wtype: str = "f16") -> Path:
    """The engine model file of fixture model `name` converted from `source` ('hf' or 'gguf')
    with matrices of `wtype`."""
    if source not in ("hf", "gguf"):
        raise ValueError(f"source must be 'hf' or 'gguf', not {source!r}")
    out_dir = Path(out_dir).resolve()
    key = (name, source, out_dir, version, wtype)
    if key not in _converted or not _converted[key].is_file():
        src = fixture_path(name)
        out_dir.mkdir(parents=True, exist_ok=True)
        out = out_dir / (f"{name}-{source}{f'-{wtype}' if wtype != 'f16' else ''}"
                         f"{f'-v{version}' if version else ''}.bin")
        convert(src / "model-f16.gguf" if source == "gguf" else src, out, progress=False,
                wtype=wtype, version=version)
        _converted[key] = out
    return _converted[key]


@pytest.fixture(scope="session")
def model_file(tmp_path_factory):
    """Factory: model_file(name, source='hf') -> Path of the converted fixture model."""
    out_dir = tmp_path_factory.mktemp("models")
    return lambda name, source="hf": convert_fixture(name, source, out_dir)
