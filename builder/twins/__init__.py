"""Python twins of the engine, proven against the reference implementations' recordings and
then used as oracles where no recording exists: the numpy forward pass (reference) and the
tokenizer, step for step as the asm does it (tokenizer). docs/testing.md says how."""
