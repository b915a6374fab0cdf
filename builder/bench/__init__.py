"""The benchmark, `python -m builder bench` (main): the machine's bandwidth and clock (machine),
timed engine runs (run), llama.cpp on the same weights (llama, gguf_twin), and the report
(report). docs/speed.md describes the method."""
