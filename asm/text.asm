; text.asm: read-only strings (zero-terminated), kept in the code segment. Error messages
; live next to the code that raises them (`call fatal_here` / `db 'text', 0`).

msg_usage:
        db      'usage: gemma -m MODEL [-p PROMPT] [-n N] [--temp T] [--top-p P] [-s SEED]', 10
        db      ' [-t THREADS] [-c CTX] [--tokens] [--logits FILE]; defaults: -n until EOS or', 10
        db      ' the context is full, --temp 0 (greedy), --top-p 1, -s 0, -t 1, -c min(4096,'
        db      ' model)', 10, 0
msg_prefix:
        db      'gemma: ', 0
msg_newline:
        db      10, 0
