; text.asm: read-only strings (zero-terminated), kept in the code segment.

msg_usage:
        db      'usage: gemma -m MODEL [-p PROMPT] [-n N] [--temp T] [--top-p P] [-s SEED]', 10
        db      '             [-t THREADS] [-c CTX] [--tokens] [--logits FILE]', 10, 0
