"""gemma's Python side, by concern: `builder.asm` (the assembler toolchain that builds ./gemma),
`builder.models` (the model-file format and the model tools), `builder.bench` (the benchmark),
`builder.twins` (the numpy reference and the tokenizer twin); `cli` and `demo` beside them."""
