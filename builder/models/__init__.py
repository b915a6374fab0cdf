"""The model tools: the engine's model-file format (modelfile), checkpoints read from Hugging
Face directories and GGUF files (checkpoint, convert_hf, convert_gguf, gguf_meta), the
`convert` command, and random models of a preset's shapes (synth). docs/format.md describes
the format."""
