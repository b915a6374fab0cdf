; text.asm: read-only strings (zero-terminated), kept in the code segment. Error messages
; carry neither the "gemma: " prefix nor the newline: `fatal` adds both.

msg_usage:
        db      'usage: gemma -m MODEL [-p PROMPT] [-n N] [--temp T] [--top-p P] [-s SEED]', 10
        db      '             [-t THREADS] [-c CTX] [--tokens] [--logits FILE]', 10, 0
msg_prefix:
        db      'gemma: ', 0
msg_newline:
        db      10, 0
msg_oom:
        db      'out of memory', 0
