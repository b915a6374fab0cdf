"""gemma's build tools: the FASM front end, keystone assembly with verification, the build
driver, and the model-file tools (format, conversion, synthetic models, numpy reference)."""
