"""The assembler toolchain: the FASM-subset front end (fasm, expr), keystone assembly (assemble,
kstone) with capstone verification (verify), and the build driver (build) that links with
`linker` into ./gemma. docs/build.md describes the pipeline."""
