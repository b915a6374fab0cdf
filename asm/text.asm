; text.asm: read-only strings (zero-terminated), kept in the code segment. Error messages
; carry neither the "gemma: " prefix nor the newline: `fatal` adds both (and, for
; `fatal_arg`, the argument after the message).

msg_usage:
        db      'usage: gemma -m MODEL [-p PROMPT] [-n N] [--temp T] [--top-p P] [-s SEED]', 10
        db      '             [-t THREADS] [-c CTX] [--tokens] [--logits FILE]', 10
        db      'defaults: -n until EOS or a full context, --temp 0 (greedy), --top-p 1, -s 0,', 10
        db      '          -t 1, -c the smaller of 4096 and the model', 39, 's', 10, 0
msg_prefix:
        db      'gemma: ', 0
msg_newline:
        db      10, 0
msg_oom:
        db      'out of memory', 0
msg_unknown:
        db      'unknown option ', 0
msg_missing:
        db      'missing value for ', 0
msg_bad_value:
        db      'bad value for ', 0
msg_no_model:
        db      'no model file (-m)', 0
msg_cannot_read:
        db      'cannot read model ', 0
msg_truncated:
        db      'model file is truncated', 0
msg_magic:
        db      'not a model file (bad magic)', 0
msg_version:
        db      'unsupported model file version', 0
msg_header:
        db      'inconsistent model header', 0
msg_long_prompt:
        db      'prompt longer than the context', 0
msg_cannot_write:
        db      'cannot write ', 0
msg_write:
        db      'write failed', 0
